"""Megatron-LM's tensor-parallel linear layers on an emulated rank (N21 §2.3; megatron/core/
tensor_parallel/layers.py ColumnParallelLinear, RowParallelLinear): column parallel enters the
TP region (f, or g under SP) and splits its output columns; row parallel splits its input rows
and leaves the region (f̄, or ḡ under SP), then the block's bias, dropout and residual.

Overlap as Megatron-LM's column-parallel backward does it (K22 §4.2.2, §5): under SP the
LN output is all-gathered again while the input-gradient GEMM runs, and the input gradient's
all-reduce (TP) or reduce-scatter (SP) runs while the weight-gradient GEMM runs. Under TE's
dgrad reduce-scatter overlap the input gradient is reduce-scattered beside its own GEMM instead
(docs/tp-overlap.md).
"""

from simsp.model import fp8, mappings
from simsp.model.base import ops, tp_overlap
from simsp.model.base.dropout_sites import dropout_add
from simsp.model.tensor import FP16
from simsp.scenario.tp_overlap import RING_EXCHANGE, is_dgrad_rs

# the Transformer Engine GEMM (transformer_engine/pytorch/module/base.py initialize_ub) each
# linear's tag names: overlapped under --tp-comm-overlap (base/tp_overlap.py), others never
TE_GEMMS = {"qkv_enter": "qkv", "fc1_enter": "fc1", "attn": "proj", "mlp": "fc2",
            "attn.qkv": "qkv", "mlp.fc1": "fc1", "attn.proj": "proj", "mlp.fc2": "fc2"}


def _ub(r, tag: str, role: str):
    """The overlap of the TE GEMM `tag` names in `role` (fprop, dgrad, wgrad), else None."""
    gemm = TE_GEMMS.get(tag)
    return None if gemm is None else tp_overlap.ub_of(r, f"{gemm}_{role}")


def column_parallel(r, x, weight, bias, enter_tag: str, name: str, normed: bool = False):
    """f / g, then y = x W (+ b): x (s_l, b, k) -> y (s, b, n/t); x stays the caller's.
    `normed`: x is the norm output of a TE LayerNormLinear (ops.linear)."""
    ub = _ub(r, enter_tag, "fprop")
    if ub is not None:  # ring exchange: the all-gather beside the GEMM's row chunks
        x_full = r.alloc((x.shape[0] * r.tp.size,) + x.shape[1:], x.itemsize, enter_tag,
                         category="communication")  # (s, b, k)
        y = yield from ops.linear(r, x_full, weight, bias, name, normed,
                                  tp_overlap.ring_exchange(ub, x, x_full, enter_tag))
        r.free(x_full)
        return y
    x_full = yield from mappings.enter_forward(r, x, enter_tag)  # (s, b, k)
    y = yield from ops.linear(r, x_full, weight, bias, name, normed)  # (s, b, n/t)
    if x_full is not x:
        r.free(x_full)
    return y


def row_parallel(r, spec, x, weight, bias, name: str, residual, out_name: str):
    """x @ W (partial sums) -> f̄/ḡ -> residual + dropout(· + bias): x (s, b, k/t) ->
    (output (s_l, b, h), dropout mask)."""
    ub = _ub(r, name, "fprop")
    if ub is not None:  # pipelined (column chunks) or ring exchange (row chunks to their ranks)
        rows = x.shape[0] // r.tp.size
        reduced = r.alloc((rows,) + x.shape[1:-1] + (weight.shape[1],), FP16, f"{name}_exit",
                          category="communication")  # (s_l, b, h)
        runner = (tp_overlap.ring_exchange_rs if ub.method == RING_EXCHANGE
                  else tp_overlap.pipelined_rs)
        partial = yield from ops.linear(r, x, weight, None, f"{name}_output",
                                        runner=runner(ub, reduced, f"{name}_exit"))
    else:
        partial = yield from ops.linear(r, x, weight, None, f"{name}_output")  # (s, b, h)
        reduced = yield from mappings.exit_forward(r, partial, f"{name}_exit")  # (s_l, b, h)
    if reduced is not partial:
        r.free(partial)
    return (yield from dropout_add(r, spec, reduced, bias, f"{name}_out", residual, out_name))


def column_parallel_backward(r, dy, saved_input, w: dict, g: dict, prefix: str,
                             has_bias: bool = True, normed: bool = False):
    """dy (s, b, n/t) of y = x W + b with x kept as `saved_input` -> dx (s_l, b, k). Under TP
    overlap both pairs are TE's bulk overlaps, the GEMMs sharing the SMs (base/tp_overlap.py).
    `normed`: x is a TE LayerNormLinear's norm output (TE 1.8 transposes it here,
    fp8.normed_transpose)."""
    weight = w[f"{prefix}.weight"]
    ub_dgrad, ub_wgrad = _ub(r, prefix, "dgrad"), _ub(r, prefix, "wgrad")
    if ub_dgrad is not None and is_dgrad_rs(ub_dgrad):
        return (yield from _dgrad_rs_backward(r, dy, saved_input, w, g, prefix, has_bias,
                                              ub_dgrad, normed))
    gather = None
    if r.tp.sequence_parallel:
        gather = _start(r, ub_dgrad, mappings.all_gather_seq(
            r, saved_input, f"{prefix}_regather", label="all_gather_ln_output", blocking=False,
            sms=_sms(ub_dgrad)))
    dx_full = yield from ops.linear_grad_input(r, dy, weight, f"d_{prefix}_input",
                                               _beside(ub_dgrad, gather))  # (s, b, k)
    x_full = (yield from _finish(r, ub_dgrad, gather)) if gather else saved_input  # (s, b, k)
    reduce = _start(r, ub_wgrad, mappings.enter_backward(r, dx_full, f"{prefix}_enter_grad",
                                                         blocking=False, sms=_sms(ub_wgrad)))
    if normed:
        yield from fp8.normed_transpose(r, f"d_{prefix}_weight", weight, x_full.numel)
    yield from ops.linear_grad_weight(r, dy, x_full, g, f"{prefix}.weight",
                                      f"{prefix}.bias" if has_bias else None,
                                      f"d_{prefix}_weight", _beside(ub_wgrad, reduce, wgrad=True))
    dx = yield from _finish(r, ub_wgrad, reduce)  # (s_l, b, k)
    if x_full is not saved_input:
        r.free(x_full)
    if dx is not dx_full:
        r.free(dx_full)
    r.free(saved_input, dy)
    return dx


def _dgrad_rs_backward(r, dy, saved_input, w: dict, g: dict, prefix: str, has_bias: bool,
                       ub, normed: bool = False):
    """`column_parallel_backward` under TE's ub_overlap_rs_dgrad (transformer_engine/pytorch/
    module/layernorm_linear.py backward at d0067d0d; Megatron-Core's qkv and fc1 are TE
    LayerNormLinears): the saved input's
    all-gather for the weight gradient launched on NCCL's stream (gather_along_first_dim,
    async: no userbuffer, no bulk overlap) beside the dgrad GEMM, whose output is
    reduce-scattered in chunks beside its own pieces (`ub`: pipelined or ring exchange); then
    the weight-gradient GEMM alone. dy (s, b, n/t) -> dx (s_l, b, k)."""
    weight = w[f"{prefix}.weight"]
    gather = mappings.start(r, mappings.all_gather_seq(
        r, saved_input, f"{prefix}_regather", label="all_gather_ln_output", blocking=False))
    dx = r.alloc((dy.shape[0] // r.tp.size,) + dy.shape[1:-1] + (weight.shape[0],), FP16,
                 f"{prefix}_enter_grad", category="communication")  # (s_l, b, k)
    runner = (tp_overlap.ring_exchange_rs if ub.method == RING_EXCHANGE
              else tp_overlap.pipelined_rs)
    dx_full = yield from ops.linear_grad_input(r, dy, weight, f"d_{prefix}_input",
                                               runner(ub, dx, f"{prefix}_enter_grad"))
    x_full = yield from mappings.finish(r, gather)  # (s, b, k)
    if normed:
        yield from fp8.normed_transpose(r, f"d_{prefix}_weight", weight, x_full.numel)
    yield from ops.linear_grad_weight(r, dy, x_full, g, f"{prefix}.weight",
                                      f"{prefix}.bias" if has_bias else None,
                                      f"d_{prefix}_weight")
    r.free(x_full, dx_full, saved_input, dy)
    return dx


def _start(r, ub, body):
    """Launch a backward collective on the communication stream: (process, its seconds box)
    under a bulk overlap `ub`, else the process alone."""
    if ub is None:
        return mappings.start(r, body)
    box = []
    return mappings.start(r, tp_overlap.timed(r, body, box)), box


def _sms(ub) -> int | None:
    """The SMs a bulk-overlapped collective's kernel holds; None (NCCL's) without `ub`."""
    return None if ub is None else tp_overlap.comm_sms(ub)


def _beside(ub, launched, wgrad: bool = False):
    """The bulk runner of a GEMM (a weight gradient's: `wgrad`) beside the collective `_start`
    launched, None without `ub`."""
    return None if ub is None or launched is None else tp_overlap.bulk(ub, wgrad)


def _finish(r, ub, launched):
    """Wait for a collective `_start` launched; exposed and hidden counted under a bulk one."""
    if ub is None:
        return (yield from mappings.finish(r, launched))
    return (yield from tp_overlap.finish_bulk(r, ub, *launched))


def row_parallel_backward(r, spec, dout, mask, saved_input, w: dict, g: dict, prefix: str,
                          keep_input: bool = False):
    """Through hidden dropout, bias, f̄/ḡ and x W: dout (s_l, b, h) -> dx (s, b, k/t).
    `keep_input`: the saved input outlives this (FlashAttention's output is the proj input)."""
    dropped = yield from ops.dropout_backward(r, dout, mask, spec.model.hidden_dropout,
                                              f"d_{prefix}_dropout")
    r.free(mask)
    if f"{prefix}.bias" in g:
        yield from ops.bias_grad(r, dropped, g, f"{prefix}.bias", f"d_{prefix}_bias")
    ub = _ub(r, prefix, "dgrad")
    if ub is not None:  # ring exchange: dout's all-gather beside the dgrad GEMM's row chunks
        dfull = r.alloc((dropped.shape[0] * r.tp.size,) + dropped.shape[1:], dropped.itemsize,
                        f"{prefix}_exit_grad", category="communication")  # (s, b, h)
        dx = yield from ops.linear_grad_input(
            r, dfull, w[f"{prefix}.weight"], f"d_{prefix}_input",
            tp_overlap.ring_exchange(ub, dropped, dfull, f"{prefix}_exit_grad"))
        if dropped is not dout:
            r.free(dropped)
    else:
        dfull = yield from mappings.exit_backward(r, dropped, f"{prefix}_exit_grad")  # (s, b, h)
        if dfull is not dropped and dropped is not dout:
            r.free(dropped)
        dx = yield from ops.linear_grad_input(r, dfull, w[f"{prefix}.weight"],
                                              f"d_{prefix}_input")
    yield from ops.linear_grad_weight(r, dfull, saved_input, g, f"{prefix}.weight", None,
                                      f"d_{prefix}_weight")
    if not keep_input:
        r.free(saved_input)
    if dfull is not dout:
        r.free(dfull)
    return dx
