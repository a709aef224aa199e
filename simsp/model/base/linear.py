"""Megatron-LM's tensor-parallel linear layers on an emulated rank (N21 §2.3; megatron/core/
tensor_parallel/layers.py ColumnParallelLinear, RowParallelLinear): column parallel enters the
TP region (f, or g under SP) and splits its output columns; row parallel splits its input rows
and leaves the region (f̄, or ḡ under SP), then the block's bias, dropout and residual.

Overlap as Megatron-LM's column-parallel backward does it (K22 §4.2.2, §5): under SP the
LN output is all-gathered again while the input-gradient GEMM runs, and the input gradient's
all-reduce (TP) or reduce-scatter (SP) runs while the weight-gradient GEMM runs.
"""

from simsp.model import mappings
from simsp.model.base import ops
from simsp.model.base.dropout_sites import dropout_add


def column_parallel(r, x, weight, bias, enter_tag: str, name: str, normed: bool = False):
    """f / g, then y = x W (+ b): x (s_l, b, k) -> y (s, b, n/t); x stays the caller's.
    `normed`: x is the norm output of a TE LayerNormLinear (ops.linear)."""
    x_full = yield from mappings.enter_forward(r, x, enter_tag)  # (s, b, k)
    y = yield from ops.linear(r, x_full, weight, bias, name, normed)  # (s, b, n/t)
    if x_full is not x:
        r.free(x_full)
    return y


def row_parallel(r, spec, x, weight, bias, name: str, residual, out_name: str):
    """x @ W (partial sums) -> f̄/ḡ -> residual + dropout(· + bias): x (s, b, k/t) ->
    (output (s_l, b, h), dropout mask)."""
    partial = yield from ops.linear(r, x, weight, None, f"{name}_output")  # (s, b, h)
    reduced = yield from mappings.exit_forward(r, partial, f"{name}_exit")  # (s_l, b, h)
    if reduced is not partial:
        r.free(partial)
    return (yield from dropout_add(r, spec, reduced, bias, f"{name}_out", residual, out_name))


def column_parallel_backward(r, dy, saved_input, w: dict, g: dict, prefix: str,
                             has_bias: bool = True):
    """dy (s, b, n/t) of y = x W + b with x kept as `saved_input` -> dx (s_l, b, k)."""
    weight = w[f"{prefix}.weight"]
    gather = None
    if r.tp.sequence_parallel:
        gather = mappings.start(r, mappings.all_gather_seq(
            r, saved_input, f"{prefix}_regather", label="all_gather_ln_output", blocking=False))
    dx_full = yield from ops.linear_grad_input(r, dy, weight, f"d_{prefix}_input")  # (s, b, k)
    x_full = (yield from mappings.finish(r, gather)) if gather else saved_input  # (s, b, k)
    reduce = mappings.start(r, mappings.enter_backward(r, dx_full, f"{prefix}_enter_grad",
                                                       blocking=False))
    yield from ops.linear_grad_weight(r, dy, x_full, g, f"{prefix}.weight",
                                      f"{prefix}.bias" if has_bias else None,
                                      f"d_{prefix}_weight")
    dx = yield from mappings.finish(r, reduce)  # (s_l, b, k)
    if x_full is not saved_input:
        r.free(x_full)
    if dx is not dx_full:
        r.free(dx_full)
    r.free(saved_input, dy)
    return dx


def row_parallel_backward(r, spec, dout, mask, saved_input, w: dict, g: dict, prefix: str,
                          keep_input: bool = False):
    """Through hidden dropout, bias, f̄/ḡ and x W: dout (s_l, b, h) -> dx (s, b, k/t).
    `keep_input`: the saved input outlives this (FlashAttention's output is the proj input)."""
    dropped = yield from ops.dropout_backward(r, dout, mask, spec.model.hidden_dropout,
                                              f"d_{prefix}_dropout")
    r.free(mask)
    if f"{prefix}.bias" in g:
        yield from ops.bias_grad(r, dropped, g, f"{prefix}.bias", f"d_{prefix}_bias")
    dfull = yield from mappings.exit_backward(r, dropped, f"{prefix}_exit_grad")  # (s, b, h)
    if dfull is not dropped and dropped is not dout:
        r.free(dropped)
    dx = yield from ops.linear_grad_input(r, dfull, w[f"{prefix}.weight"], f"d_{prefix}_input")
    yield from ops.linear_grad_weight(r, dfull, saved_input, g, f"{prefix}.weight", None,
                                      f"d_{prefix}_weight")
    if not keep_input:
        r.free(saved_input)
    if dfull is not dout:
        r.free(dfull)
    return dx
