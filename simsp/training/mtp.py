"""Multi-token prediction on the last pipeline stage (Megatron-LM
megatron/core/transformer/multi_token_prediction.py; DeepSeek-V3, arXiv 2412.19437 §2.2;
docs/mtp.md).

Depth k = 1..D reads the previous depth's output h_{k-1} (h_0: the final norm's output) and
the embedding of the tokens shifted by k (the shared word embedding, its own dropout site):
    cat = [enorm(emb) | hnorm(h_{k-1})]  (s_l, b, 2h)
    p = cat W_eh  (column parallel, 2h -> h/t; gathered over TP, then scattered back to s/t
        under SP: Megatron's gather_from_tensor_model_parallel_region and
        scatter_to_sequence_parallel_region)
    h_k = final_ln_k(transformer layer k (p)),  built as the model's last layer
and the shared output layer's cross entropy on the labels shifted by k, the last k positions
masked (roll_tensor). Its weight in the objective is mtp_loss_scaling_factor / D per depth,
over the (s − k)·B positions left (process_mtp_loss; MTPLossAutoScaler's 1/micro-batches,
then the data-parallel average). Under full recompute the transformer layer keeps only its
input and recomputes itself; the norms and the projection keep theirs.
"""

import numpy as np

from simsp.model import mappings
from simsp.model.base import ops
from simsp.model.base.linear import column_parallel_backward
from simsp.model.blocks.embedding import embedding_backward, embedding_forward
from simsp.model.blocks.head import output_loss_backward, output_loss_forward
from simsp.model.blocks.norm import norm, norm_backward
from simsp.model.layer import LayerSpec, layer_backward, layer_forward
from simsp.model.tensor import FP16
from simsp.training.data_parallel.grad_scaling import loss_gradient_factor


def shifted(tokens: np.ndarray | None, k: int):
    """Tokens (s, b) rolled up by k, the last k rows 0 (Megatron's roll_tensor, k times)."""
    if tokens is None:
        return None
    out = np.zeros_like(tokens)  # (s, b)
    out[:len(tokens) - k] = tokens[k:]
    return out


def kept_positions(s: int, b: int, k: int) -> np.ndarray:
    """The loss mask of depth k: (s, b), 0 on the last k positions."""
    mask = np.ones((s, b))
    mask[s - k:] = 0.0
    return mask


def _spec(sc, layer: int, offset: int) -> LayerSpec:
    """The depth's transformer layer: its own index (dropout sites), the run's recompute."""
    p = sc.parallel
    modules = p.recompute_module_set or LayerSpec.modules
    aux_scale = p.micro_batch_size / p.global_batch if sc.model.num_experts else 1.0
    return LayerSpec(sc.model, layer, p.recompute_granularity, offset, modules, aux_scale,
                     loss_gradient_factor(p))


def _layer_tables(state, k: int) -> tuple[dict, dict]:
    """Depth k's transformer layer weights and gradients, keyed by suffix."""
    return state.layer_tables(f"mtp.{k}.layer.")


def mtp_forward(r, sc, state, y, tokens, targets, offset: int, losses: dict, key: tuple):
    """Every depth forward from the final norm's output y (s_l, b, h): depth k's masked loss
    goes to losses[key + (k,)] (key: (dp, micro_batch)); returns the stash for mtp_backward."""
    m, scope = sc.model, r.scope
    h_prev, depths = y, []
    for k in range(m.mtp_num_layers):
        r.scope = f"{scope}mtp{k}."
        saved = yield from depth_forward(r, sc, state, k, h_prev, tokens, offset)
        s, b = m.seq_length, sc.parallel.micro_batch_size
        loss, saved["head"] = yield from output_loss_forward(
            r, m, state.weights, saved["output"], shifted(targets, k + 1),
            kept_positions(s, b, k + 1) if r.numeric else None)
        losses[key + (k,)] = loss
        depths.append(saved)
        h_prev = saved["output"]
    r.scope = scope
    return depths


def depth_forward(r, sc, state, k: int, h_prev, tokens, offset: int):
    """Depth k from h_prev (s_l, b, h): its output h_k and what backward needs."""
    m, w = sc.model, state.weights
    prefix, layer = f"mtp.{k}.", m.num_layers + k
    s, b = m.seq_length, sc.parallel.micro_batch_size
    emb, emb_saved = yield from embedding_forward(r, m, w, shifted(tokens, k + 1), (s, b), offset,
                                                  dropout_layer=layer)
    r.save(emb, "enorm_input")
    e = yield from norm(r, m, emb, w, f"{prefix}enorm", "enorm_output")
    hn = yield from norm(r, m, h_prev, w, f"{prefix}hnorm", "hnorm_output")
    cat = yield from ops.elementwise(r, e.shape[:-1] + (2 * m.hidden_size,), "eh_proj_input",
                                     lambda: np.concatenate([e.data, hn.data], axis=-1),
                                     2 * (e.nbytes + hn.nbytes))  # (s_l, b, 2h)
    r.free(e, hn)
    r.save(cat, "eh_proj_input")
    cat_full = yield from mappings.enter_forward(r, cat, "eh_proj_enter")  # (s, b, 2h)
    proj = yield from ops.linear(r, cat_full, w[f"{prefix}eh_proj.weight"], None,
                                 "eh_proj_output")  # (s, b, h/t)
    if cat_full is not cat:
        r.free(cat_full)
    x = yield from _gather_hidden(r, proj)  # (s_l, b, h)
    spec = _spec(sc, layer, offset)
    lw, _ = _layer_tables(state, k)
    if spec.recompute == "full":
        r.save(x, "layer_input")
        out, layer_saved = yield from layer_forward(r, spec, lw, x, keep=False)
        layer_saved = {"layer_input": x}
    else:
        out, layer_saved = yield from layer_forward(r, spec, lw, x, keep=True)
    r.save(out, "mtp_final_ln_input")
    h_k = yield from norm(r, m, out, w, f"{prefix}final_ln", "mtp_output")
    return {"embedding": emb_saved, "enorm_input": emb, "hnorm_input": h_prev,
            "eh_proj_input": cat, "layer": layer_saved, "final_ln_input": out, "output": h_k,
            "spec": spec}


def _gather_hidden(r, proj):
    """(s, b, h/t) column-parallel output -> all hidden columns (s, b, h), then this rank's
    s/t rows under SP (gather_from_tensor_model_parallel_region, scatter_to_sequence_...)."""
    t = r.tp.size
    if t == 1:
        return proj
    s, b, part = proj.shape
    gathered = yield from mappings.tensor_collective(
        r, "all_gather", proj, (t,) + proj.shape, (t,) + proj.shape, "eh_proj_gather",
        label="all_gather_eh_proj")  # (t, s, b, h/t)
    r.free(proj)
    rows = s // t if r.tp.sequence_parallel else s
    start = r.tp.index * rows if r.tp.sequence_parallel else 0
    x = yield from ops.elementwise(
        r, (rows, b, t * part), "mtp_layer_input",
        lambda: np.ascontiguousarray(
            gathered.data.transpose(1, 2, 0, 3).reshape(s, b, t * part)[start:start + rows]),
        2 * 2 * rows * b * t * part)  # read and write the rank's rows
    r.free(gathered)
    return x


def _split_hidden(r, dx):
    """Backward of _gather_hidden: dx (s_l, b, h) -> this rank's columns (s, b, h/t), the
    sequence all-gathered first under SP."""
    t = r.tp.size
    if t == 1:
        return dx
    full = yield from mappings.enter_forward(r, dx, "eh_proj_scatter_grad")  # (s, b, h)
    if full is not dx:
        r.free(dx)
    s, b, h = full.shape
    part = h // t
    d_proj = yield from ops.elementwise(
        r, (s, b, part), "d_eh_proj_output",
        lambda: np.ascontiguousarray(full.data[..., r.tp.index * part:(r.tp.index + 1) * part]),
        2 * 2 * s * b * part)
    r.free(full)
    return d_proj


def depth_loss_gradient(sc, k: int) -> float:
    """d(objective)/d(depth k's summed masked token loss): λ/D over its (s − k − 1)·B
    positions, with the loss gradient's data-parallel factor (process_mtp_loss)."""
    m = sc.model
    return m.mtp_loss_scaling_factor * loss_gradient_factor(sc.parallel) / (
        m.mtp_num_layers * (m.seq_length - k - 1) * sc.parallel.global_batch)


def mtp_backward(r, sc, state, depths: list, tokens, targets):
    """Every depth backward, the last first -> the gradient at the final norm's output
    (s_l, b, h), to add to the main head's."""
    m, scope = sc.model, r.scope
    s, b = m.seq_length, sc.parallel.micro_batch_size
    dnext = None
    for k in reversed(range(m.mtp_num_layers)):
        r.scope = f"{scope}mtp{k}."
        saved = depths[k]
        dloss = depth_loss_gradient(sc, k)
        dh = yield from output_loss_backward(
            r, m, state.weights, state.grads, shifted(targets, k + 1), saved["head"], dloss,
            kept_positions(s, b, k + 1) if r.numeric else None)
        if dnext is not None:
            yield from ops.accumulate(r, dh, dnext, "d_mtp_output")
            r.free(dnext)
        dnext = yield from depth_backward(r, sc, state, k, saved, dh, tokens)
    r.scope = scope
    return dnext


def depth_backward(r, sc, state, k: int, saved: dict, dh, tokens, own_table: bool = False):
    """Depth k backward from dh at its output h_k -> the gradient at h_{k-1}; `own_table`: the
    standalone MTP stage's word table, which only the depths' lookups reach."""
    m, w, g = sc.model, state.weights, state.grads
    prefix = f"mtp.{k}."
    dout = yield from norm_backward(r, m, dh, saved["final_ln_input"], w, g,
                                    f"{prefix}final_ln", "d_mtp_final_ln_input")
    r.free(dh, saved["final_ln_input"])
    lw, lg = _layer_tables(state, k)
    dx = yield from layer_backward(r, saved["spec"], lw, lg, dict(saved["layer"]), dout)
    d_proj = yield from _split_hidden(r, dx)  # (s, b, h/t)
    dcat = yield from column_parallel_backward(r, d_proj, saved["eh_proj_input"], w, g,
                                               f"{prefix}eh_proj", has_bias=False)
    h = m.hidden_size
    de, dhn = (yield from _halves(r, dcat, h))
    dprev = yield from norm_backward(r, m, dhn, saved["hnorm_input"], w, g, f"{prefix}hnorm",
                                     "d_hnorm_input")
    demb = yield from norm_backward(r, m, de, saved["enorm_input"], w, g, f"{prefix}enorm",
                                    "d_enorm_input")
    r.free(de, dhn, saved["enorm_input"])
    # the table's gradient (the depths run last first): after the tied output layer's
    # placeholder or a later depth's; folded into the main gradient at the last lookup to run
    # when no main lookup follows on this rank (PP > 1)
    after_other = (m.tied and not own_table) or k < m.mtp_num_layers - 1
    fold = ((own_table or not m.tied) and sc.parallel.pipeline_model_parallel_size > 1
            and k == 0 and sc.parallel.fsdp != "fsdp2")
    yield from embedding_backward(r, m, w, g, shifted(tokens, k + 1), saved["embedding"], demb,
                                  after_other, fold)
    return dprev


def _halves(r, dcat, h: int):
    """(s_l, b, 2h) -> its [embedding | hidden] halves, (s_l, b, h) each."""
    halves = []
    for i, name in enumerate(("d_enorm_output", "d_hnorm_output")):
        half = r.alloc(dcat.shape[:-1] + (h,), FP16, name)
        if r.numeric:
            half.data = np.ascontiguousarray(dcat.data[..., i * h:(i + 1) * h])
        halves.append(half)
    yield from r.compute("split_eh_grad", "elementwise", nbytes=2 * dcat.nbytes)
    r.free(dcat)
    return halves

