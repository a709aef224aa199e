"""The attention core on one tensor-parallel rank: q, k, v in, the output projection's input
(`proj_input`) out, by --attention-backend and context parallelism:

- unfused (K22's): softmax(QKᵀ/√d) -> dropout -> ·V as separate kernels, keeping the s × s
  tensors (numpy math and ops below);
- flash: FlashAttention (blocks/attention/flash.py), keeping its output and the logsumexp;
- context parallel: the flash core across the CP group, through the declared interface
  `ContextParallelAttention`, which training/context_parallel/attention.py implements and the
  driver hands each rank as `Rank.cp` (the model never sees training's classes).

Kept for backward (docs/MODEL.md#activation-memory; the flash rows in docs/llama.md):

| name                       | shape (per rank)      | bytes          |
|----------------------------|-----------------------|----------------|
| q, k                       | (b, a/t, s, d) each   | 4sbh/t         |
| softmax_output             | (b, a/t, s, s)        | 2as²b/t        |
| softmax_dropout_mask       | (b, a/t, s, s)        | as²b/t         |
| attention_dropout_output   | (b, a/t, s, s)        | 2as²b/t        |
| v                          | (b, a/t, s, d)        | 2sbh/t         |
| proj_input                 | (s, b, h/t)           | 2sbh/t         |
| attn_dropout_mask          | (s_l, b, h)           | sbh   (/t SP)  |
Selective recompute (`core_attn`) drops the three (b, a/t, s, s) tensors and recomputes them
in backward. FlashAttention keeps q, k, v unexpanded (k, v (b, G/t, s, d)), its output (which
is `proj_input`) and the fp32 logsumexp `softmax_lse` (b, a/t, s), no s × s tensor; with
context parallelism also what the CP attention names `saved_name`. The output projection
(row parallel, then dropout and the residual) ends every attention block.
"""

import math
from typing import Protocol

import numpy as np

from simsp.model.base import fusions, ops
from simsp.model.base.dropout_sites import site_id
from simsp.model.base.kernels import keep_mask
from simsp.model.base.linear import row_parallel, row_parallel_backward
from simsp.model.base.stash import recomputing
from simsp.model.blocks.attention.flash import flash_attention, flash_attention_backward
from simsp.model.tensor import Tensor


class ContextParallelAttention(Protocol):
    """The flash core run across a context-parallel group (--context-parallel-size > 1), as the
    model calls it. training/context_parallel/attention.py implements it by --cp-comm-type (a
    ring of K/V blocks, an all-to-all, an all-gather); each rank gets its own as `Rank.cp`."""

    members: tuple[int, ...]  # the CP group's ranks, in CP order
    size: int  # cp
    positions: np.ndarray  # (s/cp,) global sequence positions of this rank's tokens
    saved_name: str | None  # the stash's name for what `saved` returns

    def forward(self, r, q: Tensor, k: Tensor, v: Tensor, out_name: str, lse_name: str,
                keep=None, p: float = 0.0):
        """q (b, a/t, n, d), k, v (b, G/t, n, d), n = s/cp -> output (n, b, a/t·d) and the fp32
        logsumexp (b, a/t, n), as flash_attention; a generator. `keep`: cp_attention_keep's
        drawer (None without dropout), `p` the dropout probability."""

    def saved(self, r, k: Tensor, v: Tensor) -> Tensor | None:
        """A handle of what the forward keeps for backward (the stash may free it), or None."""

    def backward(self, r, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                 lse: Tensor, keep=None, p: float = 0.0):
        """dout, out (n, b, a/t·d) -> dq (b, a/t, n, d), dk, dv (b, G/t, n, d), as
        flash_attention_backward, freeing what its forward kept; a generator."""


# ---------------------------------------------------------------------------------------------
# numpy: causal softmax and attention


def causal_mask(s_q, s_k):
    """Boolean (s_q, s_k): True where query i may see key j, i.e. j <= i."""
    return np.arange(s_k)[None, :] <= np.arange(s_q)[:, None]  # (s_q, s_k)


def causal_softmax_forward(scores):
    """Softmax over the last dim of (b, heads, s_q, s_k) with keys j > i masked to exactly 0."""
    visible = causal_mask(*scores.shape[-2:])  # (s_q, s_k)
    masked = np.where(visible, scores, -np.inf)  # (b, heads, s_q, s_k)
    shifted = masked - masked.max(axis=-1, keepdims=True)  # (b, heads, s_q, s_k)
    e = np.exp(shifted)  # (b, heads, s_q, s_k), exp(-inf) = 0 on masked keys
    return e / e.sum(axis=-1, keepdims=True)  # (b, heads, s_q, s_k)


def softmax_backward(dprobs, probs):
    """dscores = probs * (dprobs - sum(dprobs * probs)); masked entries get 0 as probs is 0."""
    inner = (dprobs * probs).sum(axis=-1, keepdims=True)  # (b, heads, s_q, 1)
    return probs * (dprobs - inner)  # (b, heads, s_q, s_k)


def attention_scores_forward(q, k):
    """scores = q @ k^T / sqrt(d) for q (b, heads, s_q, d), k (b, heads, s_k, d)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    return (q @ k.swapaxes(-1, -2)) * scale  # (b, heads, s_q, s_k)


def attention_scores_backward(dscores, q, k):
    """(dq, dk) of scores = q @ k^T / sqrt(d)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    dq = (dscores @ k) * scale  # (b, heads, s_q, d)
    dk = (dscores.swapaxes(-1, -2) @ q) * scale  # (b, heads, s_k, d)
    return dq, dk


def attention_context_forward(probs, v):
    """context = probs @ v for probs (b, heads, s_q, s_k), v (b, heads, s_k, d)."""
    return probs @ v  # (b, heads, s_q, d)


def attention_context_backward(dcontext, probs, v):
    """(dprobs, dv) of context = probs @ v."""
    dprobs = dcontext @ v.swapaxes(-1, -2)  # (b, heads, s_q, s_k)
    dv = probs.swapaxes(-1, -2) @ dcontext  # (b, heads, s_k, d)
    return dprobs, dv


# ---------------------------------------------------------------------------------------------
# ops on a rank


def causal_softmax(r, scores: Tensor, name: str, fused: bool = True):
    """The causal softmax of scores (b, a/t, s, s): fused (Megatron's masked_softmax_fusion)
    one kernel reads them, writes the probabilities; unfused mask, then softmax
    (base/fusions.py)."""
    return (yield from ops.elementwise(r, scores.shape, name,
                                       lambda: causal_softmax_forward(scores.data),
                                       fusions.masked_softmax_forward(scores.nbytes, fused)))


def softmax_grad(r, dprobs: Tensor, probs: Tensor, name: str, fused: bool = True):
    """d scores of the softmax from d probs and the kept probs: fused reads both, writes one;
    unfused also masked_fill's backward (base/fusions.py)."""
    return (yield from ops.elementwise(r, probs.shape, name,
                                       lambda: softmax_backward(dprobs.data, probs.data),
                                       fusions.masked_softmax_backward(probs.nbytes, fused)))


def attention_keep(r, spec, b: int, heads: int):
    """The flash tiles' dropout keep-mask drawer (global coordinates: each tile is a slice of
    the unfused path's mask), or None without dropout or data."""
    p = spec.model.attention_dropout
    if p == 0 or not r.numeric:
        return None
    site, start = site_id(spec.layer, "attention"), r.tp.index * heads
    return lambda i0, i1, j0, j1: keep_mask(
        p, r.seed, site, (spec.sample_offset, start, i0, j0), (b, heads, i1 - i0, j1 - j0))


def cp_attention_keep(r, spec, b: int, heads: int):
    """The context-parallel attention's dropout keep-mask drawer, at global positions:
    (q_pos (nq,), k_pos (nk,), first head, heads) -> (b, heads, nq, nk), the coordinates of
    attention_keep's tiles (so every layout drops the same probabilities); None without
    dropout or data."""
    p = spec.model.attention_dropout
    if p == 0 or not r.numeric:
        return None
    site, start = site_id(spec.layer, "attention"), r.tp.index * heads
    return lambda q_pos, k_pos, first, count: keep_mask(
        p, r.seed, site, (spec.sample_offset, start + first, q_pos, k_pos),
        (b, count, len(q_pos), len(k_pos)))


# ---------------------------------------------------------------------------------------------
# the core, forward


def forward(r, spec, q, k, v, stash):
    """The core on q, k (b, a/t, s, d), v (b, a/t, s, d_v) (flash: k, v (b, G/t, s, ·)
    unexpanded), stashing them and what the core's backward needs: -> proj_input
    (s, b, a·d_v/t)."""
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        stash.put(name, tensor)
    if not spec.model.flash:
        return (yield from _unfused_core(r, spec, q, k, v, stash))
    if r.cp is not None:  # context parallelism: the ring (or all-to-all) over CP ranks
        out, lse = yield from _cp_forward(r, spec, q, k, v, stash)
    else:
        keep = attention_keep(r, spec, q.shape[0], q.shape[1])
        out, lse = yield from flash_attention(r, q, k, v, keep, spec.model.attention_dropout,
                                              "proj_input", "softmax_lse")
    _keep_softmax_stats(r, spec, lse, stash)
    return out


def attention_core(r, spec, q, k, v):
    """softmax(QKᵀ/√d) -> dropout -> ·V. Returns probs, mask, dropped, context (b, a/t, s, ·)."""
    b, heads, s, d = q.shape
    scores = yield from ops.batched_matmul(r, q, k, "attention_scores", transpose_b=True,
                                           scale=1.0 / math.sqrt(d))  # (b, a/t, s, s)
    probs = yield from causal_softmax(r, scores, "softmax_output",
                                  spec.model.masked_softmax_fusion)
    r.free(scores)
    p = spec.model.attention_dropout
    mask = None
    if p > 0:
        starts = (spec.sample_offset, r.tp.index * heads, 0, 0)
        mask = ops.dropout_mask(r, p, site_id(spec.layer, "attention"), starts, probs.shape,
                                "softmax_dropout_mask")
    dropped = yield from ops.dropout(r, probs, mask, p, "attention_dropout_output")
    context = yield from ops.batched_matmul(r, dropped, v, "context")  # (b, a/t, s, d)
    return probs, mask, dropped, context


def _stash_core(stash, probs, mask, dropped):
    """Keep the unfused core's s × s tensors (the dropout output only if dropout made one)."""
    stash.put("softmax_output", probs)
    stash.put("softmax_dropout_mask", mask)
    if dropped is not probs:
        stash.put("attention_dropout_output", dropped)


def _free_core(r, probs, mask, dropped):
    """Free the unfused core's s × s tensors (core_attn recompute rebuilds them)."""
    r.free(probs, mask, None if dropped is probs else dropped)


def _unfused_core(r, spec, q, k, v, stash):
    """The core as separate kernels keeping the s × s tensors; -> proj_input (s, b, a·d/t)."""
    probs, mask, dropped, context = yield from attention_core(r, spec, q, k, v)
    if spec.recomputes("core_attn"):
        _free_core(r, probs, mask, dropped)
    else:
        _stash_core(stash, probs, mask, dropped)
    b, heads, s, d = context.shape
    proj_in = yield from ops.reshape_copy(r, context, (s, b, heads * d), (2, 0, 1, 3),
                                          "proj_input")  # (s, b, a·d/t)
    r.free(context)
    return proj_in


def _keep_softmax_stats(r, spec, lse, stash) -> None:
    """Flash's per-row softmax statistics (fp32): kept for backward, or freed where core_attn
    recompute re-runs the flash forward."""
    if spec.recomputes("core_attn"):
        r.free(lse)
    else:
        stash.put("softmax_lse", lse)


def _cp_forward(r, spec, q, k, v, stash):
    """The CP group's flash core (Rank.cp): -> proj_input (s/cp, b, a·d/t), logsumexp; keeps
    the CP attention's own tensor unless core_attn is recomputed."""
    keep = cp_attention_keep(r, spec, q.shape[0], q.shape[1])
    out, lse = yield from r.cp.forward(r, q, k, v, "proj_input", "softmax_lse", keep,
                                       spec.model.attention_dropout)
    kept = r.cp.saved(r, k, v)  # the ring's K/V block, a2a's head-split output or None
    if spec.recomputes("core_attn"):
        r.free(kept)  # the recompute runs the exchanges again
    else:
        stash.put(r.cp.saved_name, kept)
    return out, lse


def output_projection(r, spec, w: dict, proj_in, residual, stash):
    """The attention block's end: proj_input (s, b, a·d_v/t) @ attn.proj (row parallel), f̄/ḡ,
    dropout, + residual -> the LN2 input (s_l, b, h)."""
    stash.put("proj_input", proj_in)
    out, mask = yield from row_parallel(r, spec, proj_in, w["attn.proj.weight"],
                                        w.get("attn.proj.bias"), "attn", residual, "ln2_input")
    stash.put("attn_dropout_mask", mask)
    return out


# ---------------------------------------------------------------------------------------------
# the core, backward


def output_projection_backward(r, spec, w: dict, g: dict, saved: dict, dres):
    """dres (s_l, b, h) at the LN2 input -> (d proj_input (s, b, a·d_v/t), proj_input); flash
    keeps proj_input (its output) for the core's backward."""
    proj_in = saved.pop("proj_input")
    dproj = yield from row_parallel_backward(r, spec, dres, saved.pop("attn_dropout_mask", None),
                                             proj_in, w, g, "attn.proj",
                                             keep_input=spec.model.flash)
    return dproj, proj_in


def backward(r, spec, saved: dict, dproj, proj_in):
    """d proj_input (s, b, a·d_v/t) -> dq, dk, dv at the q, k, v forward stashed (unexpanded
    under flash), consuming the core's saved tensors."""
    q, k, v = saved.pop("q"), saved.pop("k"), saved.pop("v")
    if not spec.model.flash:
        dctx = yield from _heads_grad(r, dproj, q.shape[1], v.shape[-1])
        probs, mask, dropped = yield from _core_tensors(r, spec, saved, q, k, v)
        return (yield from core_backward(r, spec, q, k, v, probs, mask, dropped, dctx))
    if r.cp is not None:
        return (yield from _cp_core_backward(r, spec, saved, dproj, q, k, v, proj_in))
    return (yield from _flash_core_backward(r, spec, saved, dproj, q, k, v, proj_in))


def core_backward(r, spec, q, k, v, probs, mask, dropped, dctx):
    """Backward of softmax(QKᵀ/√d) -> dropout -> ·V. All (b, a/t, s, ·); returns dq, dk, dv."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    ddropped = yield from ops.batched_matmul(r, dctx, v, "d_attention_dropout_output",
                                             transpose_b=True)  # (b, a/t, s, s)
    dv = yield from ops.batched_matmul(r, dropped, dctx, "d_v", transpose_a=True)
    r.free(dctx, v, None if dropped is probs else dropped)
    dprobs = yield from ops.dropout_backward(r, ddropped, mask, spec.model.attention_dropout,
                                             "d_softmax_output")
    if dprobs is not ddropped:
        r.free(ddropped)
    r.free(mask)
    dscores = yield from softmax_grad(r, dprobs, probs, "d_attention_scores",
                                      spec.model.masked_softmax_fusion)
    r.free(dprobs, probs)
    dq = yield from ops.batched_matmul(r, dscores, k, "d_q", scale=scale)
    dk = yield from ops.batched_matmul(r, dscores, q, "d_k", transpose_a=True, scale=scale)
    r.free(dscores, q, k)
    return dq, dk, dv


def _heads_grad(r, dproj, heads: int, d: int):
    """d proj_input (s, b, a·d/t) -> d context (b, a/t, s, d)."""
    s, b, _ = dproj.shape
    dctx = yield from ops.reshape_copy(r, dproj, (s, b, heads, d), None, "d_context_heads")
    r.free(dproj)
    dctx_t = yield from ops.reshape_copy(r, dctx, (b, heads, s, d), (1, 2, 0, 3),
                                         "d_context")  # (b, a/t, s, d)
    r.free(dctx)
    return dctx_t


def _core_tensors(r, spec, saved, q, k, v):
    """The softmax output, mask and dropout output: saved, or recomputed (selective)."""
    if "softmax_output" in saved:
        probs = saved.pop("softmax_output")
        mask = saved.pop("softmax_dropout_mask", None)
        dropped = saved.pop("attention_dropout_output", probs)
        return probs, mask, dropped
    with recomputing(r):
        probs, mask, dropped, context = yield from attention_core(r, spec, q, k, v)
        r.free(context)
    return probs, mask, dropped


def _cp_core_backward(r, spec, saved, dproj, q, k, v, proj_in):
    """Context parallelism: the ring (or all-to-all) attention backward over the CP group (its
    forward again first when core_attn is recomputed); it frees what its forward kept itself."""
    keep, p = cp_attention_keep(r, spec, q.shape[0], q.shape[1]), spec.model.attention_dropout
    lse = saved.pop("softmax_lse", None)
    if lse is None:  # core_attn recomputed: the ring forward again, for its logsumexp
        with recomputing(r):
            again, lse = yield from r.cp.forward(r, q, k, v, "flash_output", "softmax_lse",
                                                 keep, p)
            r.free(again)
    else:
        kept = saved.pop(r.cp.saved_name, None)
        if kept is not None:
            kept.key = None  # freed by the CP attention's backward
    dq, dk, dv = yield from r.cp.backward(r, dproj, q, k, v, proj_in, lse, keep, p)
    r.free(dproj, proj_in, lse, q, k, v)
    return dq, dk, dv


def _flash_core_backward(r, spec, saved, dproj, q, k, v, proj_in):
    """FlashAttention's backward (its forward again first when core_attn is recomputed, for
    the logsumexp): -> dq, dk, dv."""
    m = spec.model
    lse = saved.pop("softmax_lse", None)
    keep = attention_keep(r, spec, q.shape[0], q.shape[1])
    if lse is None:  # core_attn recomputed: the flash forward again, for its logsumexp
        with recomputing(r):
            again, lse = yield from flash_attention(r, q, k, v, keep, m.attention_dropout,
                                                    "flash_output", "softmax_lse")
            r.free(again)
    grads = yield from flash_attention_backward(r, dproj, q, k, v, proj_in, lse, keep,
                                                m.attention_dropout)
    r.free(dproj, proj_in, lse, q, k, v)
    return grads
