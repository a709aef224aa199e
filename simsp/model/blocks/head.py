"""Last stage: final LN, tied output projection (vocab-parallel) and cross-entropy on fp32 logits.

Kept for backward (K22 §4.3): final LN input 2sbh/t, output-projection input 2sbh/t, fp32 logits
4sbv/t. The loss is Megatron-LM's vocab-parallel cross-entropy: the row maxima are all-gathered
(a ring collective of s·b·t fp32 values; Megatron all-reduces with MAX), the sums of exponentials
and the target logits all-reduced. Row maxima and sums (8sb bytes) are ignored as K22 ignores
LN statistics. Parameters: the final norm's (final_ln) and, untied
(--untie-embeddings-and-output-weights), the output layer's own output.weight (v, h); tied, the
word embedding's table. FLOPs: the logits' GEMM, 6·h·v per token with its backward.
"""

import numpy as np

from simsp.model import mappings
from simsp.model.base import fusions, ops
from simsp.model.base.linear import column_parallel, column_parallel_backward
from simsp.model.blocks.norm import norm, norm_backward
from simsp.model.tensor import FP32, Tensor


def output_shapes(model) -> dict[str, tuple[int, ...]]:
    """The untied output layer's weight output.weight (v, h); none when tied."""
    if model.untie_embeddings_and_output_weights:
        return {"output.weight": (model.vocab_size, model.hidden_size)}
    return {}


def token_flops(model, padded_vocab: int) -> int:
    """The logits' GEMM per token, forward and backward: 6·h·v (Megatron-LM's
    num_floating_point_operations, its vocabulary padded)."""
    return 6 * model.hidden_size * padded_vocab


# ---------------------------------------------------------------------------------------------
# numpy: the single-device loss (the reference's)


def _loss_dtype(logits):
    """fp32 semantics: never below float32 (Megatron upcasts fp16 logits for the loss)."""
    return np.promote_types(logits.dtype, np.float32)


def _log_softmax(logits):
    """Stable log-softmax over the vocabulary (last dim), in the loss dtype."""
    z = logits.astype(_loss_dtype(logits), copy=False)  # (s, b, v)
    z = z - z.max(axis=-1, keepdims=True)  # (s, b, v)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))  # (s, b, v)


def cross_entropy_forward(logits, targets):
    """SUM over tokens of -log softmax(logits)[target]; logits (s, b, v), targets (s, b)."""
    logp = _log_softmax(logits)  # (s, b, v)
    picked = np.take_along_axis(logp, targets[..., None], axis=-1)  # (s, b, 1)
    return -picked.sum()


def cross_entropy_backward(logits, targets, dloss):
    """dlogits = (softmax - onehot(target)) * dloss, in the logits dtype."""
    dlogits = np.exp(_log_softmax(logits))  # (s, b, v)
    np.put_along_axis(dlogits, targets[..., None],
                      np.take_along_axis(dlogits, targets[..., None], axis=-1) - 1.0, axis=-1)
    return (dlogits * dloss).astype(logits.dtype, copy=False)  # (s, b, v)


# ---------------------------------------------------------------------------------------------
# ops on a rank


def _transposed(t: Tensor) -> Tensor:
    """A ledger-less view of a (v/t, h) table as the (h, v/t) weight of y = x W."""
    return Tensor(t.shape[::-1], t.itemsize, None if t.data is None else t.data.T)


def _loss_terms(r, logits: Tensor, targets: np.ndarray, fused: bool):
    """Per-token max (s, b), sum of exponentials (s, b) and target logit (s, b), TP-reduced;
    the kernels priced fused or not (--cross-entropy-loss-fusion, base/fusions.py)."""
    s, b, v_local = logits.shape
    maxima = r.alloc((s, b), FP32, "logit_max", data=None)
    if r.numeric:
        maxima.data = logits.data.max(axis=-1)
    gathered = yield from mappings.all_gather_seq(r, _flat_rows(r, maxima), "loss_max")
    row_max = None
    if r.numeric:
        row_max = gathered.data.reshape(r.tp.size, s, b).max(axis=0)  # (s, b)
    if gathered.key != maxima.key:
        r.free(gathered)
    r.free(maxima)
    stats = r.alloc((2, s, b), FP32, "loss_stats")
    if r.numeric:
        start = r.tp.index * v_local
        local = targets - start
        owned = (local >= 0) & (local < v_local)
        picked = np.take_along_axis(logits.data, np.where(owned, local, 0)[..., None], -1)[..., 0]
        stats.data = np.stack([np.exp(logits.data - row_max[..., None]).sum(-1), picked * owned])
    yield from ops.run_kernels(r, "loss_stats",
                           fusions.cross_entropy_forward(logits.nbytes, fused))
    stats = yield from mappings.all_reduce(r, stats, "loss_sums")
    return row_max, stats


def _flat_rows(r, maxima: Tensor) -> Tensor:
    """(s, b) -> a (1, s·b) tensor so the ring gathers one row per rank."""
    view = Tensor((1, maxima.numel), maxima.itemsize, None if maxima.data is None
                  else maxima.data.reshape(1, -1))
    view.key = maxima.key
    return view


def _output_table(model, table: dict):
    """The (v/t, h) output weight (or its gradient): the word embedding's, or its own (untied)."""
    return table["embedding.word" if model.tied else "output.weight"]


def head_forward(r, model, w: dict, x: Tensor, targets: np.ndarray | None):
    """x (s_l, b, h) -> summed token loss (a float in numeric mode), stash for backward."""
    r.save(x, "final_ln_input")
    y = yield from norm(r, model, x, w, "final_ln", "final_ln")
    loss_sum, stash = yield from output_loss_forward(r, model, w, y, targets)
    return loss_sum, {"final_ln_input": x, **stash}


def output_loss_forward(r, model, w: dict, y: Tensor, targets: np.ndarray | None,
                        weights: np.ndarray | None = None):
    """The normed hidden y (s_l, b, h) -> Σ weights · token loss (numeric; weights (s, b),
    default all 1) through the output layer, stash for backward (multi-token prediction's
    depths share it: training/mtp.py)."""
    r.save(y, "output_proj_input")
    logits = yield from column_parallel(r, y, _transposed(_output_table(model, w)), None,
                                        "head_enter", "logits")  # (s, b, v/t)
    logits32 = yield from ops.fp32_copy(r, logits, "logits_fp32")
    r.free(logits)
    r.save(logits32, "logits_fp32")
    row_max, stats = yield from _loss_terms(r, logits32, targets,
                                            model.cross_entropy_loss_fusion)
    loss_sum = None
    if r.numeric:
        per_token = np.log(stats.data[0]) + row_max - stats.data[1]  # (s, b)
        loss_sum = float((per_token if weights is None else weights * per_token).sum())
    stash = {"output_proj_input": y, "logits_fp32": logits32, "row_max": row_max,
             "stats": stats}
    return loss_sum, stash


def head_backward(r, model, w: dict, g: dict, targets, stash: dict, dloss: float,
                  extra_dy: Tensor | None = None):
    """d(loss)/d(x) (s_l, b, h) for loss = dloss · summed token loss; `extra_dy` (s_l, b, h):
    a gradient at the final norm's output from elsewhere (multi-token prediction), added."""
    dy = yield from output_loss_backward(r, model, w, g, targets, stash, dloss)
    if extra_dy is not None:
        yield from ops.accumulate(r, dy, extra_dy, "d_final_ln_output")
        r.free(extra_dy)
    dx = yield from norm_backward(r, model, dy, stash["final_ln_input"], w, g, "final_ln",
                                  "d_final_ln_input")
    r.free(dy, stash["final_ln_input"])
    return dx


def output_loss_backward(r, model, w: dict, g: dict, targets, stash: dict, dloss: float,
                         weights: np.ndarray | None = None):
    """d(dloss · Σ weights · token loss)/d(y) (s_l, b, h) through the output layer; frees
    what output_loss_forward kept, y included."""
    logits32, stats = stash["logits_fp32"], stash["stats"]
    s, b, v_local = logits32.shape
    dlogits = r.alloc(logits32.shape, 2, "d_logits")  # (s, b, v/t)
    if r.numeric:
        probs = np.exp(logits32.data - stash["row_max"][..., None]) / stats.data[0][..., None]
        local = targets - r.tp.index * v_local
        owned = (local >= 0) & (local < v_local)
        onehot = np.zeros_like(probs)
        np.put_along_axis(onehot, np.where(owned, local, 0)[..., None], owned[..., None], -1)
        dlogits.data = (probs - onehot) * dloss
        if weights is not None:
            dlogits.data *= weights[..., None]
    yield from ops.run_kernels(r, "d_logits", fusions.cross_entropy_backward(logits32.nbytes))
    r.free(logits32, stats)
    head = {"output.weight": _transposed(_output_table(model, w))}
    head_grads = {"output.weight": _transposed(_output_table(model, g))}
    return (yield from column_parallel_backward(r, dlogits, stash["output_proj_input"], head,
                                                head_grads, "output", has_bias=False))
