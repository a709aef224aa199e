"""The MoE MLP block on an emulated rank (TP = 1, EP = 1): ledger entries, FLOPs and time
around the numpy math of moe_kernels.py (Megatron-LM megatron/core/transformer/moe/moe_layer.py:
router, permute, experts, unpermute; docs/moe.md).

Numeric mode routes on the data; meta mode routes perfectly balanced tokens: T·k pairs spread
evenly over the E experts, each cut to the capacity C (or padded to it). Kept for backward:

| name                      | shape          | bytes |
|---------------------------|----------------|-------|
| moe_input                 | (s, b, h)      | 2sbh  |
| router_logits             | (T, E) fp32    | 4TE   |
| routing_map               | (T, E) bool    | TE    |
| permuted_tokens           | (N, h)         | 2Nh   |
| expert_{gelu,swiglu}_input| (N, f | 2f)    | 2Nf (4Nf) |
| expert_fc2_input          | (N, f)         | 2Nf   |
| expert_output             | (N, h)         | 2Nh   |
T = s·b tokens, N the (token, expert) pairs computed (T·k dropless).
"""

import numpy as np

from simsp.model import moe_kernels as K
from simsp.model.layer import _hidden_mask, norm
from simsp.model.layer_backward import norm_backward
from simsp.model import ops
from simsp.model.tensor import FP16, FP32, MASK

ROUTER, FC1, FC2 = "mlp.router.weight", "mlp.experts.fc1.weight", "mlp.experts.fc2.weight"


def moe_spec(m) -> K.MoeSpec:
    """The model's routing flags (aux loss only with load balancing type aux_loss)."""
    coeff = m.moe_aux_loss_coeff if m.moe_router_load_balancing_type == "aux_loss" else 0.0
    return K.MoeSpec(m.num_experts, m.moe_router_topk, m.moe_router_score_function, coeff,
                     m.moe_expert_capacity_factor, m.moe_pad_expert_input_to_capacity, m.swiglu)


def balanced_counts(T: int, spec: K.MoeSpec) -> np.ndarray:
    """Tokens per expert (E,) under perfectly balanced routing, after capacity."""
    E = spec.num_experts
    pairs = T * spec.topk
    counts = np.full(E, pairs // E) + (np.arange(E) < pairs % E)  # (E,)
    if spec.capacity_factor is None:
        return counts
    capacity = min(K.get_capacity(pairs, E, spec.capacity_factor), T)
    return np.full(E, capacity) if spec.pad_to_capacity else np.minimum(counts, capacity)


def _weights(w: dict) -> dict:
    """The kernels' view: router (h, E), fc1 (E, h, f | 2f), fc2 (E, f, h)."""
    fc1 = w[FC1].data
    return {"router": w[ROUTER].data, "fc1": fc1.reshape(fc1.shape[0], fc1.shape[1], -1),
            "fc2": w[FC2].data}


def moe_mlp_forward(r, spec, w: dict, residual, stash):
    """LN2 -> router -> permute -> experts -> unpermute -> dropout -> + residual."""
    m, mspec = spec.model, moe_spec(spec.model)
    x = yield from norm(r, m, residual, w, "ln2", "moe_input")  # (s, b, h)
    stash.put("moe_input", x)
    s, b, h = x.shape
    T, E, f = s * b, m.num_experts, m.moe_ffn
    width = 2 * f if m.swiglu else f
    c = None
    if r.numeric:
        _, aux, c = K.moe_forward(x.data.reshape(T, h), _weights(w), mspec)
        if r.phase == "forward":  # not again when recomputed
            r.moe_aux_loss += spec.aux_scale * aux
    counts = c["counts"] if r.numeric else balanced_counts(T, mspec)
    N = int(counts.sum())
    data = (lambda key: c[key]) if r.numeric else (lambda key: None)
    logits = r.alloc((T, E), FP32, "router_logits", data=data("logits"))
    yield from r.compute("router", "gemm", 2 * T * h * E, gemm=(T, h, E))
    routing = r.alloc((T, E), MASK, "routing_map", data=data("kept"))
    yield from r.compute("router_topk", "elementwise", nbytes=logits.nbytes + routing.nbytes)
    xp = r.alloc((N, h), FP16, "permuted_tokens", data=data("xp"))
    yield from r.compute("permute", "elementwise", nbytes=2 * xp.nbytes)
    act_in = r.alloc((N, width), FP16, f"expert_{'swiglu' if m.swiglu else 'gelu'}_input",
                     data=data("h1"))
    yield from r.compute("experts_fc1", "gemm", 2 * N * h * width, gemm=(N, h, width))
    act_out = r.alloc((N, f), FP16, "expert_fc2_input", data=data("g"))
    yield from r.compute("experts_act", "elementwise", nbytes=act_in.nbytes + act_out.nbytes)
    out = r.alloc((N, h), FP16, "expert_output", data=data("out"))
    yield from r.compute("experts_fc2", "gemm", 2 * N * f * h, gemm=(N, f, h))
    combined = r.alloc((s, b, h), FP16, "moe_output",
                       data=_combine(c, T, h).reshape(s, b, h) if r.numeric else None)
    yield from r.compute("unpermute", "elementwise", nbytes=out.nbytes + combined.nbytes)
    for name, tensor in (("router_logits", logits), ("routing_map", routing),
                         ("permuted_tokens", xp), (act_in_name(m), act_in),
                         ("expert_fc2_input", act_out), ("expert_output", out)):
        stash.put(name, tensor)
    mask = _hidden_mask(r, spec, "mlp_out", combined)
    result = yield from ops.bias_dropout_add(r, combined, None, mask, m.hidden_dropout,
                                             residual, "layer_output")  # (s, b, h)
    r.free(combined)
    stash.put("mlp_dropout_mask", mask)
    return result


def act_in_name(m) -> str:
    return f"expert_{'swiglu' if m.swiglu else 'gelu'}_input"


def _combine(c: dict, T: int, h: int) -> np.ndarray:
    """Σ_e p[t, e] · expert_e(x[t]) over the kept pairs: (T, h)."""
    y = np.zeros((T, h), dtype=c["out"].dtype)
    weight = c["probs"][c["tokens"], c["experts"]][:, None]  # (N, 1)
    np.add.at(y, c["tokens"], weight * c["out"])
    return y


def _cache(saved: dict, m, mspec, T: int, h: int) -> dict:
    """Rebuild the kernels' cache from the kept tensors (the top-k recomputed from the logits)."""
    logits = saved["router_logits"].data  # (T, E)
    probs, top = K.topk_routing(logits, mspec)
    kept = saved["routing_map"].data  # (T, E) bool
    experts, tokens = np.nonzero(kept.T)
    c = dict(x=saved["moe_input"].data.reshape(T, h), logits=logits, probs=probs, top=top,
             kept=kept, tokens=tokens, experts=experts,
             counts=np.bincount(experts, minlength=kept.shape[1]),
             xp=saved["permuted_tokens"].data, h1=saved[act_in_name(m)].data,
             g=saved["expert_fc2_input"].data, out=saved["expert_output"].data)
    c["dscores"], c["scores"] = (K.aux_loss(logits, mspec)[1:] if mspec.aux_loss_coeff > 0
                                 else (None, None))
    return c


def moe_mlp_backward(r, spec, w: dict, g: dict, saved: dict, dout):
    """dout (s, b, h) -> gradient at the block input (s, b, h); the aux loss's gradient is
    spec.aux_scale (b/B: Megatron's 1/micro-batches, then the DP average)."""
    m, mspec = spec.model, moe_spec(spec.model)
    mask = saved.pop("mlp_dropout_mask", None)
    dy = yield from ops.dropout_backward(r, dout, mask, m.hidden_dropout, "d_moe_output")
    r.free(mask)
    x = saved["moe_input"]
    s, b, h = x.shape
    T, E, f = s * b, m.num_experts, m.moe_ffn
    xp, act_in = saved["permuted_tokens"], saved[act_in_name(m)]
    N, width = xp.shape[0], act_in.shape[1]
    dx_data = None
    if r.numeric:
        dx2, grads = K.moe_backward(dy.data.reshape(T, h), _weights(w),
                                    _cache(saved, m, mspec, T, h), mspec, spec.aux_scale)
        g[ROUTER].data += grads["router"]
        g[FC1].data += grads["fc1"].reshape(g[FC1].shape)
        g[FC2].data += grads["fc2"]
        dx_data = dx2.reshape(s, b, h)
    steps = (("d_expert_output", (N, h), FP16, "elementwise", 0, dy.nbytes + 2 * N * h),
             ("d_expert_fc2", (N, f), FP16, "gemm", 2 * 2 * N * f * h, 0),
             ("d_expert_act_input", (N, width), FP16, "elementwise", 0, 3 * act_in.nbytes),
             ("d_expert_fc1", (N, h), FP16, "gemm", 2 * 2 * N * h * width, 0),
             ("d_router_logits", (T, E), FP32, "elementwise", 0, 8 * T * E),
             ("d_router", (s, b, h), FP16, "gemm", 2 * 2 * T * h * E, 0))
    previous = None
    for name, shape, itemsize, kind, flops, nbytes in steps:
        last = name == "d_router"
        tensor = r.alloc(shape, itemsize, name, data=dx_data if last else None)
        yield from r.compute(name, kind, flops, nbytes=nbytes,
                             gemm=(shape[0], shape[-1], h) if kind == "gemm" else None)
        r.free(previous)
        previous = tensor
    if dy is not dout:
        r.free(dy)
    for name in ("router_logits", "routing_map", "permuted_tokens", act_in_name(m),
                 "expert_fc2_input", "expert_output"):
        r.free(saved.pop(name))
    dln = yield from norm_backward(r, m, previous, saved["ln2_input"], w, g, "ln2",
                                   "d_ln2_input")
    r.free(previous, saved.pop("moe_input"), saved.pop("ln2_input"))
    dres = yield from ops.add(r, dout, dln, "d_residual")
    r.free(dout, dln)
    return dres
