"""Megatron-LM's shared experts (megatron/core/transformer/moe/shared_experts.py
SharedExpertMLP, no gate) beside the routed experts of a MoE layer: a dense MLP of width
f_s = --moe-shared-expert-intermediate-size on every token, column/row parallel over TP (under
SP the sequence all-gathered before fc1, the output reduce-scattered), added to the routed
output (docs/moe.md). Kept for backward: shared_expert_{gelu,swiglu}_input (s, b, f_s/t | 2f_s/t)
and shared_expert_fc2_input (s, b, f_s/t), unless --recompute-modules shared_experts.
"""

from simsp.model import mappings
from simsp.model.base.stash import recomputing
from simsp.model.blocks.mlp.activation import GELU, SWIGLU, activation_of
from simsp.model.blocks.moe.experts import activation
from simsp.model.tensor import FP16

SHARED_FC1, SHARED_FC2 = "mlp.shared_experts.fc1.weight", "mlp.shared_experts.fc2.weight"


# ---------------------------------------------------------------------------------------------
# numpy


def shared_forward(x, fc1, fc2, swiglu: bool):
    """The shared experts (shared_experts.py SharedExpertMLP, no gate, no bias): x (T, h) ->
    (out (T, h), activation input (T, f_s | 2f_s), fc2 input (T, f_s)); fc1 (h, f_s | 2f_s)."""
    act = (SWIGLU if swiglu else GELU).forward
    h1 = x @ fc1  # (T, f_s | 2f_s)
    g = act(h1)  # (T, f_s)
    return g @ fc2, h1, g


def shared_backward(dy, x, h1, g, fc1, fc2, swiglu: bool):
    """dx (T, h), d fc1, d fc2 of shared_forward."""
    back = (SWIGLU if swiglu else GELU).backward
    dh1 = back(dy @ fc2.T, h1)  # (T, f_s | 2f_s)
    return dh1 @ fc1.T, x.T @ dh1, g.T @ dy


# ---------------------------------------------------------------------------------------------
# ops on a rank


def _shared_fc1(w: dict):
    """The shared experts' fc1 data as the (h, f_s | 2f_s) GEMM operand ([gate | up])."""
    data = w[SHARED_FC1].data
    return data.reshape(data.shape[0], -1)


def _shared_names(m) -> tuple[str, str]:
    """The kept activation input and fc2 input: shared_expert_{gelu,swiglu}_input, ..."""
    return f"shared_expert_{activation_of(m).name}_input", "shared_expert_fc2_input"


def forward(r, spec, w, x, combined, stash):
    """The shared experts (Megatron shared_experts.py SharedExpertMLP, no gate) on every token
    of x (s_l, b, h), added to the routed experts' output `combined` (s_l, b, h): a dense MLP
    of width f_s, column/row parallel over TP (under SP: the sequence all-gathered before fc1,
    the output reduce-scattered). `--recompute-modules shared_experts`: nothing kept
    (backward re-runs fc1 and the activation from the MoE input)."""
    m = spec.model
    x_full = yield from mappings.enter_forward(r, x, "shared_fc1_enter")  # (s, b, h)
    s, b, h = x_full.shape
    T, f = s * b, m.moe_shared_expert_intermediate_size // r.tp.size
    width = activation_of(m).fc1_width(f)
    out = h1 = g = None
    if r.numeric:
        out, h1, g = shared_forward(x_full.data.reshape(T, h), _shared_fc1(w),
                                      w[SHARED_FC2].data, m.swiglu)
    act_name, fc2_name = _shared_names(m)
    act_in = r.alloc((s, b, width), FP16, act_name, data=None if h1 is None else
                     h1.reshape(s, b, width))
    yield from r.compute("shared_fc1", "gemm", 2 * T * h * width, gemm=(T, h, width))
    if x_full is not x:
        r.free(x_full)
    act_out = r.alloc((s, b, f), FP16, fc2_name, data=None if g is None else g.reshape(s, b, f))
    yield from r.compute("shared_act", "elementwise", nbytes=act_in.nbytes + act_out.nbytes)
    partial = r.alloc((s, b, h), FP16, "shared_expert_output",
                      data=None if out is None else out.reshape(s, b, h))
    yield from r.compute("shared_fc2", "gemm", 2 * T * f * h, gemm=(T, f, h))
    shared = yield from mappings.exit_forward(r, partial, "shared_exit")  # (s_l, b, h)
    if shared is not partial:
        r.free(partial)
    if r.numeric:
        combined.data = combined.data + shared.data
    yield from r.compute("shared_add", "elementwise", nbytes=3 * shared.nbytes)
    r.free(shared)
    if spec.recomputes("shared_experts"):
        r.free(act_in, act_out)
    else:
        stash.put(act_name, act_in)
        stash.put(fc2_name, act_out)


def _shared_recompute(r, m, w, x, saved):
    """fc1 and the activation of the shared experts again, from the MoE input x (s_l, b, h)."""
    x_full = yield from mappings.enter_forward(r, x, "shared_fc1_regather")  # (s, b, h)
    s, b, h = x_full.shape
    T, f = s * b, m.moe_shared_expert_intermediate_size // r.tp.size
    width = activation_of(m).fc1_width(f)
    act_name, fc2_name = _shared_names(m)
    h1 = x_full.data.reshape(T, h) @ _shared_fc1(w) if r.numeric else None  # (T, ·)
    act_in = r.alloc((s, b, width), FP16, act_name,
                     data=None if h1 is None else h1.reshape(s, b, width))
    yield from r.compute("recompute_shared_fc1", "gemm", 2 * T * h * width, gemm=(T, h, width))
    if x_full is not x:
        r.free(x_full)
    saved[act_name] = act_in
    saved[fc2_name] = yield from activation(r, m, act_in, fc2_name, f, "recompute_shared_act")


def backward(r, m, w, g, saved, dy, x):
    """dy (s_l, b, h) at the shared experts' output -> their input gradient (s_l, b, h); their
    weight gradients accumulate in g (Megatron's column/row parallel backward)."""
    act_name, fc2_name = _shared_names(m)
    if act_name not in saved:  # shared_experts recomputed
        with recomputing(r):
            yield from _shared_recompute(r, m, w, x, saved)
    act_in, act_out = saved.pop(act_name), saved.pop(fc2_name)
    dfull = yield from mappings.exit_backward(r, dy, "shared_exit_grad")  # (s, b, h)
    x_full = yield from mappings.enter_forward(r, x, "shared_fc1_regather")  # (s, b, h)
    s, b, h = dfull.shape
    T, f, width = s * b, act_out.shape[2], act_in.shape[2]
    dx_data = None
    if r.numeric:
        dx_data, dfc1, dfc2 = shared_backward(dfull.data.reshape(T, h),
                                                x_full.data.reshape(T, h),
                                                act_in.data.reshape(T, width),
                                                act_out.data.reshape(T, f), _shared_fc1(w),
                                                w[SHARED_FC2].data, m.swiglu)
        g[SHARED_FC1].data += dfc1.reshape(g[SHARED_FC1].shape)
        g[SHARED_FC2].data += dfc2
        dx_data = dx_data.reshape(s, b, h)
    d_act = r.alloc((s, b, f), FP16, "d_shared_fc2")
    yield from r.compute("d_shared_fc2", "gemm", 2 * 2 * T * f * h, gemm=(T, h, f))
    r.free(act_out)
    if dfull is not dy:
        r.free(dfull)
    d_act_in = r.alloc((s, b, width), FP16, "d_shared_act_input")
    yield from r.compute("d_shared_act_input", "elementwise", nbytes=3 * act_in.nbytes)
    r.free(d_act, act_in)
    dx_full = r.alloc((s, b, h), FP16, "d_shared_fc1", data=dx_data)
    yield from r.compute("d_shared_fc1", "gemm", 2 * 2 * T * h * width, gemm=(T, width, h))
    r.free(d_act_in)
    if x_full is not x:
        r.free(x_full)
    dx = yield from mappings.enter_backward(r, dx_full, "shared_fc1_enter_grad")  # (s_l, b, h)
    if dx is not dx_full:
        r.free(dx_full)
    return dx
