"""The MoE MLP block on an emulated rank (Megatron-LM megatron/core/transformer/moe/
moe_layer.py MoELayer; docs/moe.md): router -> permute -> token dispatch -> experts -> combine
-> unpermute (+ shared experts) -> dropout -> + residual, in place of the dense MLP in the
layers --moe-layer-freq names. It reads the LN2 output (`moe_input`) and returns the layer's
output; this module composes the MoE's rooms and holds its parameter shapes and FLOPs:

- router.py: gating, top-k, capacity, aux loss, permute / unpermute (numpy and ops);
- routing.py: meta mode's routing model (balanced, or the seeded Zipf model of
  --moe-routing-imbalance);
- dispatch.py: the alltoall token dispatcher (and the local path without expert parallelism),
  allgather.py: the allgather dispatcher (--moe-token-dispatcher-type);
- experts.py: the routed experts; shared.py: the shared experts;
- placement.py: which experts a rank holds, its EP/ETP/EDP groups.

Kept for backward, besides the router's, the experts' and the shared experts' tables:

| name                      | shape          | bytes |
|---------------------------|----------------|-------|
| moe_input                 | (s, b, h)      | 2sbh  |
| mlp_dropout_mask          | (s, b, h)      | sbh   |
T = s·b tokens (s/t·b under SP), N the (token, expert) pairs this rank routed (T·k dropless),
N_in the rows its experts compute (N without expert or expert tensor parallelism; else what
its ETP·EP group sent it). `--recompute-modules moe` keeps only moe_input and re-runs the rest,
communication included, in backward.
"""

import numpy as np

from simsp.model.base import ops
from simsp.model.base.dropout_sites import dropout_add
from simsp.model.base.stash import Stash, recomputing
from simsp.model.blocks.mlp.activation import activation_of
from simsp.model.blocks.moe import allgather, dispatch, shared
from simsp.model.blocks.moe.placement import expert_parallel
from simsp.model.blocks.moe.router import (AUX_TOKENS, ROUTER, Routed, aux_group, aux_loss,
                                           moe_spec, route, router_grad, sequence_aux,
                                           topk_routing)
from simsp.model.blocks.moe.routing import model_counts
from simsp.model.tensor import FP32, MASK

INPUT = "moe_input"  # the LN2 output, as this block keeps it


def shapes(model) -> dict[str, tuple[int, ...]]:
    """The router (h, E) and E bias-free experts, fc1 (E, h, f) or gated (E, h, 2, f), fc2
    (E, f, h), and with --moe-shared-expert-intermediate-size f_s the shared experts' fc1
    (h, f_s) or (h, 2, f_s) and fc2 (f_s, h)."""
    h, f, E = model.hidden_size, model.moe_ffn, model.num_experts
    gated = activation_of(model).gated
    out = {"mlp.router.weight": (h, E),
           "mlp.experts.fc1.weight": (E, h, 2, f) if gated else (E, h, f),
           "mlp.experts.fc2.weight": (E, f, h)}
    f_s = model.moe_shared_expert_intermediate_size
    if f_s:
        out["mlp.shared_experts.fc1.weight"] = (h, 2, f_s) if gated else (h, f_s)
        out["mlp.shared_experts.fc2.weight"] = (f_s, h)
    return out


def token_flops(model) -> int:
    """Model FLOPs per token per MoE layer, forward and backward: 6 · (2 or 3) · h · (f·k +
    f_s), the top-k routed experts and the shared experts (the router is not counted)."""
    shared_f = getattr(model, "moe_shared_expert_intermediate_size", None) or 0
    routed_f = model.moe_ffn * model.moe_router_topk
    return 6 * model.hidden_size * activation_of(model).gemms * (routed_f + shared_f)


# ---------------------------------------------------------------------------------------------
# ops on a rank


def forward(r, spec, w: dict, x, residual, stash):
    """The MoE layer -> dropout -> + residual: the LN2 output x (s, b, h) -> the layer's
    output (s, b, h). `--recompute-modules moe` keeps only the MoE input."""
    stash.put(INPUT, x)
    whole = spec.recomputes("moe")
    inner = Stash(r, keep=False) if whole else stash
    combined = yield from moe_core(r, spec, w, x, inner)  # (s, b, h)
    if whole:
        inner.release()
    out, mask = yield from dropout_add(r, spec, combined, None, "mlp_out", residual,
                                       "layer_output")  # (s, b, h)
    stash.put("mlp_dropout_mask", mask)
    return out


def moe_core(r, spec, w: dict, x, stash):
    """The MoE layer proper on x (s, b, h): routed experts plus shared experts, (s, b, h)."""
    routed = yield from _route(r, spec, w, x, stash)
    path = allgather if expert_parallel(r) and r.moe.dispatcher == "allgather" else dispatch
    combined, expert_rows = yield from path.forward(r, spec, w, x, routed, stash)
    _count_load(r, routed.pairs, routed.real, int(routed.counts.sum()), expert_rows)
    if spec.model.moe_shared_expert_intermediate_size:
        yield from shared.forward(r, spec, w, x, combined, stash)
    return combined


def _route(r, spec, w: dict, x, stash) -> Routed:
    """The router on x (s, b, h): the data's routing (numeric) or the routing model's (meta),
    the aux loss (its tokens_e reduced over the tp_cp group under SP or CP), the router GEMM
    and top-k kernels, router_logits (T, E) and routing_map (T, E) allocated."""
    m, mspec = spec.model, moe_spec(spec.model)
    s, b, h = x.shape
    T, E = s * b, m.num_experts
    c = route(x.data.reshape(T, h), w[ROUTER].data, mspec) if r.numeric else None
    if mspec.aux_loss_coeff > 0 and len(aux_group(r)) > 1:
        stash.tensors[AUX_TOKENS] = yield from sequence_aux(r, mspec, c, E, T)
    if r.numeric and r.phase == "forward":  # not again when recomputed
        r.moe_aux_loss += spec.aux_scale * c["aux"]
    if r.numeric:
        counts, routed = c["counts"], T * mspec.topk  # (E,)
        real = int((c["probs"][c["tokens"], c["experts"]] > 0).sum())
    else:
        routed_e, counts = model_counts(r, spec, T)  # (E,) each
        routed, real = int(routed_e.sum()), int(np.minimum(routed_e, counts).sum())
    data = (lambda key: c[key]) if r.numeric else (lambda key: None)
    logits = r.alloc((T, E), FP32, "router_logits", data=data("logits"))
    yield from r.compute("router", "gemm", 2 * T * h * E, gemm=(T, h, E))
    routing = r.alloc((T, E), MASK, "routing_map", data=data("kept"))
    yield from r.compute("router_topk", "elementwise", nbytes=logits.nbytes + routing.nbytes)
    return Routed(c, counts, routed, real, logits, routing)


def _count_load(r, routed: int, real: int, rows: int, expert_rows: int) -> None:
    """Forward only: pairs routed, kept (real) and dropped, padding rows, rows computed by this
    rank's experts (its load: the slowest expert rank has the most)."""
    if r.phase != "forward":
        return
    for key, value in (("routed_pairs", routed), ("dropped_pairs", routed - real),
                       ("padding_rows", rows - real), ("expert_rows", expert_rows)):
        r.moe_load[key] = r.moe_load.get(key, 0) + value


def backward(r, spec, w: dict, g: dict, saved: dict, dout):
    """dout (s, b, h) at the layer output -> the gradient at the LN2 output (s, b, h), which
    stays kept (`moe_input`) until the norm's backward; the aux loss's gradient is
    spec.aux_scale (b/B: Megatron's 1/micro-batches, then the DP average)."""
    m = spec.model
    if spec.recomputes("moe"):  # the MoE layer again from its input, communication included
        inner = Stash(r, keep=True)
        with recomputing(r):
            combined = yield from moe_core(r, spec, w, saved[INPUT], inner)
        r.free(combined)
        saved.update(inner.tensors)
    mask = saved.pop("mlp_dropout_mask", None)
    dy = yield from ops.dropout_backward(r, dout, mask, m.hidden_dropout, "d_moe_output")
    r.free(mask)
    x = saved[INPUT]
    shared_dx = None
    if m.moe_shared_expert_intermediate_size:
        shared_dx = yield from shared.backward(r, m, w, g, saved, dy, x)
    c = _routing_cache(r, saved, m, x.shape)
    path = allgather if expert_parallel(r) and r.moe.dispatcher == "allgather" else dispatch
    dx_tokens, dx_route = yield from path.backward(r, spec, w, g, saved, dy, dout, c)
    dx = yield from router_grad(r, g, dx_tokens, dx_route, x.shape, m.num_experts)
    if shared_dx is not None:
        if r.numeric:
            dx.data = dx.data + shared_dx.data
        yield from r.compute("d_shared_add", "elementwise", nbytes=3 * dx.nbytes)
        r.free(shared_dx)
    for name in ("router_logits", "routing_map", "expert_output"):
        r.free(saved.pop(name))
    return dx


def _routing_cache(r, saved: dict, m, shape: tuple) -> dict | None:
    """The router's cache rebuilt from the kept tensors (the top-k recomputed from the logits;
    numeric mode, else None); the kept tokens_e of the sequence's aux loss is consumed."""
    s, b, h = shape
    T, mspec = s * b, moe_spec(m)
    aux_tokens = saved.pop(AUX_TOKENS, None)
    if not r.numeric:
        return None
    logits = saved["router_logits"].data  # (T, E)
    probs, top = topk_routing(logits, mspec)
    kept = saved["routing_map"].data  # (T, E) bool
    experts, tokens = np.nonzero(kept.T)
    c = dict(x=saved[INPUT].data.reshape(T, h), logits=logits, probs=probs, top=top,
             kept=kept, tokens=tokens, experts=experts)
    tokens_e = None if aux_tokens is None else aux_tokens.data
    c["dscores"], c["scores"] = (aux_loss(logits, mspec, tokens_e, T * len(aux_group(r)))[1:]
                                 if mspec.aux_loss_coeff > 0 else (None, None))
    return c
