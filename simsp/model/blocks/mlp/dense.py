"""The dense MLP block on one tensor-parallel rank (Megatron-LM megatron/core/transformer/mlp.py
MLP; N21 §2.3): fc1 column parallel (h -> f/t, or 2f/t gated), the activation (mlp/activation.py:
GeLU, or SwiGLU with --swiglu), fc2 row parallel (f/t -> h), then dropout and the residual.
It reads the LN2 output (`fc1_input`) and returns the layer's output. Kept for backward (K22 §4,
docs/MODEL.md#activation-memory; SwiGLU's in docs/llama.md):

| name                       | shape (per rank)      | bytes          |
|----------------------------|-----------------------|----------------|
| fc1_input                  | (s_l, b, h)           | 2sbh  (/t SP)  |
| gelu_input, fc2_input      | (s, b, f/t) each      | 16sbh/t        |
| mlp_dropout_mask           | (s_l, b, h)           | sbh   (/t SP)  |
s_l = s/t under SP, else s; f = 4h in K22's bytes. SwiGLU keeps `swiglu_input` (s, b, 2f/t) in
place of `gelu_input`. Selective recompute: `layernorm` drops fc1_input (rebuilt from
ln2_input), `mlp` drops the activation's input and output (backward re-runs the MLP forward).

Parameters: fc1 (h, f), or (h, 2, f) gated ([gate | up], split over TP along f), fc2 (f, h),
and their biases unless --disable-bias-linear. FLOPs: 2 · (2 or 3 GEMMs) · h · f per token
forward, three times that with the backward (Megatron-LM's num_floating_point_operations).
"""

from simsp.model import mappings
from simsp.model.base import ops
from simsp.model.base.linear import (column_parallel, column_parallel_backward, row_parallel,
                                     row_parallel_backward)
from simsp.model.base.stash import recomputing
from simsp.model.blocks.mlp.activation import (activate, activate_grad, activation_of,
                                               fused_with_bias)
from simsp.model.blocks.norm import recompute_norm
from simsp.model.tensor import Tensor

INPUT = "fc1_input"  # the LN2 output, as this block keeps it
LAYERNORM_LINEAR = True  # LN2 and fc1 are one TE LayerNormLinear (norm + FP8 cast fused)


def shapes(model) -> dict[str, tuple[int, ...]]:
    """fc1 (h, f) or gated (h, 2, f), fc2 (f, h), and their biases (with --add-bias-linear)."""
    h, f = model.hidden_size, model.ffn
    fc1 = (h, 2, f) if activation_of(model).gated else (h, f)
    out = {"mlp.fc1.weight": fc1, "mlp.fc1.bias": fc1[1:], "mlp.fc2.weight": (f, h),
           "mlp.fc2.bias": (h,)}
    return out if model.add_bias_linear else {k: v for k, v in out.items()
                                              if not k.endswith(".bias")}


def forward_token_flops(model) -> int:
    """GEMM FLOPs of one token's forward: 2 · (2 or 3 GEMMs) · h · f."""
    return 2 * activation_of(model).gemms * model.hidden_size * model.ffn


def token_flops(model) -> int:
    """Model FLOPs per token per layer, forward and backward: 6 · (2 or 3) · h · f."""
    return 6 * model.hidden_size * activation_of(model).gemms * model.ffn


def fc1_views(m, table: dict) -> dict:
    """A gated fc1's (h, 2, f/t) weight (and (2, f/t) bias) seen as the (h, 2f/t) GEMM operand
    [gate | up] (views of the same arrays, under the same ledger key: the FP8 test reads it,
    simsp/model/fp8.py is_fp8_weight); an ungated (GeLU) table as it is."""
    if not activation_of(m).gated:
        return table
    views = dict(table)
    for name in ("mlp.fc1.weight", "mlp.fc1.bias"):
        if name in table:
            t = table[name]
            shape = t.shape[:-2] + (2 * t.shape[-1],)
            views[name] = Tensor(shape, t.itemsize,
                                 None if t.data is None else t.data.reshape(shape), t.key)
    return views


def act_input_name(m) -> str:
    """The activation's kept input: gelu_input, swiglu_input."""
    return f"{activation_of(m).name}_input"


def forward(r, spec, w, y2, residual, stash):
    """fc1 -> activation -> fc2 -> dropout -> + residual: the LN2 output y2 (s_l, b, h) ->
    the layer's output (s_l, b, h)."""
    m = spec.model
    act = activation_of(m)
    norm_recomputed, mlp_recomputed = spec.recomputes("layernorm"), spec.recomputes("mlp")
    if not norm_recomputed:
        stash.put(INPUT, y2)
    fc1 = fc1_views(m, w)
    h1 = yield from column_parallel(r, y2, fc1["mlp.fc1.weight"], fc1.get("mlp.fc1.bias"),
                                    "fc1_enter", act_input_name(m), True)  # (s, b, f/t | 2f/t)
    if norm_recomputed:
        r.free(y2)
    if not mlp_recomputed:
        stash.put(act_input_name(m), h1)
    g = yield from activate(r, act, h1, "fc2_input", fused_with_bias(m, act),
                            m.add_bias_linear)  # (s, b, f/t)
    if mlp_recomputed:
        r.free(h1)
    else:
        stash.put("fc2_input", g)
    out, mlp_mask = yield from row_parallel(r, spec, g, w["mlp.fc2.weight"],
                                            w.get("mlp.fc2.bias"), "mlp", residual,
                                            "layer_output")
    if mlp_recomputed:
        r.free(g)
    stash.put("mlp_dropout_mask", mlp_mask)
    return out


def backward(r, spec, w, g, saved, dout):
    """dout (s_l, b, h) at the layer output -> the gradient at the LN2 output (s_l, b, h)."""
    m = spec.model
    act = activation_of(m)
    if INPUT not in saved:  # layernorm recomputed
        saved[INPUT] = yield from recompute_norm(r, m, w, saved["ln2_input"], "ln2", INPUT)
    if "fc2_input" not in saved:  # mlp recomputed
        yield from _recompute(r, spec, w, saved)
    dg = yield from row_parallel_backward(r, spec, dout, saved.pop("mlp_dropout_mask", None),
                                          saved.pop("fc2_input"), w, g, "mlp.fc2")
    name = act_input_name(m)
    dh = yield from activate_grad(r, act, dg, saved[name], f"d_{name}",
                                  fused_with_bias(m, act))
    r.free(dg, saved.pop(name))
    return (yield from column_parallel_backward(r, dh, saved.pop(INPUT), fc1_views(m, w),
                                                fc1_views(m, g), "mlp.fc1", "mlp.fc1.bias" in g,
                                                normed=True))


def _recompute(r, spec, w, saved):
    """--recompute-modules mlp: Megatron checkpoints the whole MLP, so backward re-runs all of
    its forward from the kept fc1 input (fc2 and its f̄/ḡ included, its output dropped) and
    keeps the activation's input and output for the MLP backward."""
    m = spec.model
    with recomputing(r):
        fc1 = fc1_views(m, w)
        h1 = yield from column_parallel(r, saved[INPUT], fc1["mlp.fc1.weight"],
                                        fc1.get("mlp.fc1.bias"), "fc1_enter",
                                        act_input_name(m))  # (s, b, f/t | 2f/t)
        act = activation_of(m)
        g = yield from activate(r, act, h1, "fc2_input", fused_with_bias(m, act),
                                m.add_bias_linear)  # (s, b, f/t)
        partial = yield from ops.linear(r, g, w["mlp.fc2.weight"], None, "mlp_output")
        reduced = yield from mappings.exit_forward(r, partial, "mlp_exit")  # (s_l, b, h)
        r.free(partial, None if reduced is partial else reduced)
    saved[act_input_name(m)], saved["fc2_input"] = h1, g
