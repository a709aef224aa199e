"""The MoE MLP block on an emulated rank: ledger entries, FLOPs and time around the numpy math
of moe_kernels.py (Megatron-LM megatron/core/transformer/moe/moe_layer.py: router, permute,
token dispatch, experts, combine, unpermute; docs/moe.md).

Numeric mode routes on the data; meta mode routes by simsp/model/blocks/moe/routing.py (balanced, or
the seeded Zipf model of --moe-routing-imbalance). With expert parallelism the permuted rows go
to their experts' ranks and back through simsp/model/blocks/moe/dispatch.py. Kept for backward:

| name                      | shape          | bytes |
|---------------------------|----------------|-------|
| moe_input                 | (s, b, h)      | 2sbh  |
| router_logits             | (T, E) fp32    | 4TE   |
| routing_map               | (T, E) bool    | TE    |
| permuted_tokens           | (N_in, h)      | 2N_in·h |
| expert_{gelu,swiglu}_input| (N_in, f | 2f) | 2N_in·f (4N_in·f) |
| expert_fc2_input          | (N_in, f)      | 2N_in·f |
| expert_output             | (N, h)         | 2Nh   |
T = s·b tokens (s/t·b under SP), N the (token, expert) pairs this rank routed (T·k dropless),
N_in the rows its experts compute (N without expert or expert tensor parallelism; else what
its ETP·EP group sent it), f the expert width over ETP. Shared experts: simsp/model/blocks/moe/shared.py.
"""

import numpy as np

from simsp.model.blocks.moe import allgather as A
from simsp.model.blocks.moe import dispatch as D
from simsp.model.blocks.moe import kernels as K
from simsp.model.layer import Stash, _hidden_mask, norm
from simsp.model.layer_backward import norm_backward
from simsp.model.blocks.moe.routing import kept_counts, routed_counts
from simsp.model.blocks.moe.shared import activation, shared_backward, shared_forward
from simsp.model import mappings, ops
from simsp.model.tensor import FP16, FP32, MASK, Tensor

ROUTER, FC1, FC2 = "mlp.router.weight", "mlp.experts.fc1.weight", "mlp.experts.fc2.weight"
COUNTS = "tokens_per_expert"  # the (EP, E) count matrix, kept outside the ledger (8·EP·E bytes)
AUX_TOKENS = "aux_tokens_per_expert"  # SP: the whole sequence's tokens_e (E,), ledger-less


def moe_spec(m) -> K.MoeSpec:
    """The model's routing flags (aux loss only with load balancing type aux_loss)."""
    coeff = m.moe_aux_loss_coeff if m.moe_router_load_balancing_type == "aux_loss" else 0.0
    return K.MoeSpec(m.num_experts, m.moe_router_topk, m.moe_router_score_function, coeff,
                     m.moe_expert_capacity_factor, m.moe_pad_expert_input_to_capacity, m.swiglu)


def model_counts(r, spec, T: int) -> tuple[np.ndarray, np.ndarray]:
    """Meta mode: the routing model's pairs routed to each expert (E,) and its rows (E,)
    after the capacity, for this layer."""
    m = spec.model
    routed = routed_counts(T, moe_spec(m), m.moe_routing_imbalance, r.seed, spec.layer)
    return routed, kept_counts(routed, T, moe_spec(m))


def _count_load(r, routed: int, real: int, rows: int, expert_rows: int) -> None:
    """Forward only: pairs routed, kept (real) and dropped, padding rows, rows computed by this
    rank's experts (its load: the slowest expert rank has the most)."""
    if r.phase != "forward":
        return
    for key, value in (("routed_pairs", routed), ("dropped_pairs", routed - real),
                       ("padding_rows", rows - real), ("expert_rows", expert_rows)):
        r.moe_load[key] = r.moe_load.get(key, 0) + value


def _weights(w: dict) -> dict:
    """The kernels' view: router (h, E), fc1 (E_local, h, f | 2f), fc2 (E_local, f, h)."""
    fc1 = w[FC1].data
    return {"router": w[ROUTER].data, "fc1": fc1.reshape(fc1.shape[0], fc1.shape[1], -1),
            "fc2": w[FC2].data}


def _expert_parallel(r) -> bool:
    """Whether the experts' rows cross ranks (EP > 1 or ETP > 1)."""
    return r.moe is not None and (r.moe.ep > 1 or r.moe.etp > 1)


def expert_gemm(r, name: str, counts: np.ndarray, k: int, n: int, passes: int = 1):
    """The experts' GEMMs of rows `counts` (E_local,) by (k, n): one grouped GEMM
    (--moe-grouped-gemm, TEGroupedMLP) or one GEMM per expert (SequentialMLP); `passes` 2 for
    a backward's data and weight gradients. An expert without rows launches nothing."""
    total = int(counts.sum())
    if r.moe is None or r.moe.grouped_gemm:
        if total:
            yield from r.compute(name, "gemm", passes * 2 * total * k * n, gemm=(total, k, n))
        return
    for e, rows in enumerate(counts):
        if rows:
            yield from r.compute(f"{name}.{e}", "gemm", passes * 2 * int(rows) * k * n,
                             gemm=(int(rows), k, n))


def moe_mlp_forward(r, spec, w: dict, residual, stash):
    """LN2 -> router -> permute -> dispatch -> experts -> combine -> unpermute (+ shared
    experts) -> dropout -> + residual. `--recompute-modules moe` keeps only the MoE input and
    re-runs the rest, communication included, in backward."""
    m = spec.model
    x = yield from norm(r, m, residual, w, "ln2", "moe_input")  # (s, b, h)
    stash.put("moe_input", x)
    whole = spec.recomputes("moe")
    inner = Stash(r, keep=False) if whole else stash
    combined = yield from moe_core(r, spec, w, x, inner)  # (s, b, h)
    if whole:
        inner.release()
    mask = _hidden_mask(r, spec, "mlp_out", combined)
    result = yield from ops.bias_dropout_add(r, combined, None, mask, m.hidden_dropout,
                                             residual, "layer_output")  # (s, b, h)
    r.free(combined)
    stash.put("mlp_dropout_mask", mask)
    return result


def moe_core(r, spec, w: dict, x, stash):
    """The MoE layer proper on x (s, b, h): routed experts plus shared experts, (s, b, h)."""
    m, mspec = spec.model, moe_spec(spec.model)
    s, b, h = x.shape
    T, E = s * b, m.num_experts
    f = m.moe_ffn // (r.moe.etp if r.moe is not None else 1)  # this rank's f/ETP
    width = 2 * f if m.swiglu else f
    c = None
    if r.numeric:
        c = K.route(x.data.reshape(T, h), w[ROUTER].data, mspec)
    if mspec.aux_loss_coeff > 0 and len(aux_group(r)) > 1:
        stash.tensors[AUX_TOKENS] = yield from _sequence_aux(r, mspec, c, E, T)
    if r.numeric and r.phase == "forward":  # not again when recomputed
        r.moe_aux_loss += spec.aux_scale * c["aux"]
    if r.numeric:
        counts = c["counts"]  # (E,)
        routed = T * mspec.topk
        real = int((c["probs"][c["tokens"], c["experts"]] > 0).sum())
    else:
        routed_e, counts = model_counts(r, spec, T)  # (E,) each
        routed, real = int(routed_e.sum()), int(np.minimum(routed_e, counts).sum())
    N = int(counts.sum())
    data = (lambda key: c[key]) if r.numeric else (lambda key: None)
    logits = r.alloc((T, E), FP32, "router_logits", data=data("logits"))
    yield from r.compute("router", "gemm", 2 * T * h * E, gemm=(T, h, E))
    routing = r.alloc((T, E), MASK, "routing_map", data=data("kept"))
    yield from r.compute("router_topk", "elementwise", nbytes=logits.nbytes + routing.nbytes)
    parallel = _expert_parallel(r)
    if parallel and r.moe.dispatcher == "allgather":
        rows, n_in = yield from _allgather_forward(r, spec, w, x, c, counts, T, E, h, width, f,
                                                   stash)
        _count_load(r, routed, real, N, n_in)
        combined = r.alloc((s, b, h), FP16, "moe_output",
                           data=rows.reshape(s, b, h) if r.numeric else None)
        for name, tensor in (("router_logits", logits), ("routing_map", routing)):
            stash.put(name, tensor)
        return (yield from _with_shared(r, spec, w, x, combined, stash))
    xp = r.alloc((N, h), FP16, "dispatch_input" if parallel else "permuted_tokens",
                 data=data("xp"))
    yield from r.compute("permute", "elementwise", nbytes=2 * xp.nbytes)
    M, x_in = counts[None], xp  # (ETP·EP, E) count matrix; the experts' input rows
    if parallel:
        M = yield from D.exchange_counts(r, r.moe, counts, counts)
        plan = D.exchange(M, r.moe)
        rows = yield from D.dispatch(r, r.moe, plan, xp.data, h, "moe_dispatch")
        r.free(xp)
        x_in = r.alloc((plan.rows_in, h), FP16, "permuted_tokens", data=rows)
        yield from _sort(r, x_in)
    local = plan.local.sum(axis=0) if parallel else counts  # (E_local,)
    _count_load(r, routed, real, N, int(local.sum()))
    expert_out = yield from _experts_forward(r, spec, w, x_in, local, width, f, h, stash)
    out = expert_out
    if parallel:
        yield from _sort(r, expert_out)
        rows = yield from D.combine(r, r.moe, plan, expert_out.data, h, "moe_combine")
        r.free(expert_out)
        out = r.alloc((N, h), FP16, "expert_output", data=rows)
    combined = r.alloc((s, b, h), FP16, "moe_output",
                       data=K.unpermute(out.data, c).reshape(s, b, h) if r.numeric else None)
    yield from r.compute("unpermute", "elementwise", nbytes=out.nbytes + combined.nbytes)
    for name, tensor in (("router_logits", logits), ("routing_map", routing),
                         ("permuted_tokens", x_in), ("expert_output", out)):
        stash.put(name, tensor)
    stash.tensors[COUNTS] = Tensor(M.shape, 8, M)  # ledger-less: 8·ETP·EP·E bytes
    return (yield from _with_shared(r, spec, w, x, combined, stash))


def _with_shared(r, spec, w, x, combined, stash):
    """The routed output `combined` (s, b, h) plus the shared experts' (when the model has)."""
    if spec.model.moe_shared_expert_intermediate_size:
        yield from shared_forward(r, spec, w, x, combined, stash)
    return combined


def aux_group(r) -> tuple:
    """Megatron's tp_cp group, over which router.py reduces tokens_per_expert: the TP group,
    with context parallelism every (tp, cp) rank of this rank's (dp, pp) (rank = tp + t·cp)."""
    if r.cp is None:
        return r.tp.members
    return tuple(member - r.tp.index + i for member in r.cp.members for i in range(r.tp.size))


def _sequence_aux(r, mspec, c, E: int, T: int):
    """Sequence (and context) parallelism: tokens_e (E,) all-reduced over the tp_cp group and
    T·t·cp tokens (moe_utils.py get_tokens_per_expert_and_token_count): this rank's share of
    the whole sequence's aux loss. Returns the summed tokens_e (ledger-less, 8·E bytes)."""
    group = aux_group(r)
    summed = Tensor((E,), 8, K.aux_tokens(c["logits"], mspec) if r.numeric else None)
    yield from mappings.tensor_collective(r, "all_reduce", summed, summed.shape, summed.shape,
                                          "moe_aux_tokens", "all_reduce_moe_aux", group=group)
    if r.numeric:
        c["aux"], c["dscores"], c["scores"] = K.aux_loss(c["logits"], mspec, summed.data,
                                                         T * len(group))
    return summed


def _sort(r, rows):
    """sort_chunks_by_idxs: source-major <-> expert-major rows, a copy, when a rank holds
    more than one expert."""
    if r.moe.num_local_experts > 1:
        yield from r.compute("sort_chunks", "elementwise", nbytes=2 * rows.nbytes)


def _experts_forward(r, spec, w, x_in, local, width: int, f: int, h: int, stash):
    """fc1 -> activation -> fc2 on the experts' rows x_in (N_in, h); returns (N_in, h).
    `--recompute-modules moe_act`: the activation's output is not kept (backward redoes it)."""
    m = spec.model
    n_in = x_in.shape[0]
    h1 = g = out = None
    if r.numeric:
        weights = _weights(w)
        out, h1, g = K.experts_forward(x_in.data, weights["fc1"], weights["fc2"], local,
                                       m.swiglu)
    act_in = r.alloc((n_in, width), FP16, act_in_name(m), data=h1)
    yield from expert_gemm(r, "experts_fc1", local, h, width)
    act_out = r.alloc((n_in, f), FP16, "expert_fc2_input", data=g)
    yield from r.compute("experts_act", "elementwise", nbytes=act_in.nbytes + act_out.nbytes)
    expert_out = r.alloc((n_in, h), FP16, "expert_output", data=out)
    yield from expert_gemm(r, "experts_fc2", local, f, h)
    stash.put(act_in_name(m), act_in)
    if spec.recomputes("moe_act"):
        r.free(act_out)
    else:
        stash.put("expert_fc2_input", act_out)
    return expert_out


def act_in_name(m) -> str:
    return f"expert_{'swiglu' if m.swiglu else 'gelu'}_input"


def _routing_cache(saved: dict, mspec, T: int, h: int, aux_tokens, t: int) -> dict:
    """The router's cache rebuilt from the kept tensors (the top-k recomputed from the logits)."""
    logits = saved["router_logits"].data  # (T, E)
    probs, top = K.topk_routing(logits, mspec)
    kept = saved["routing_map"].data  # (T, E) bool
    experts, tokens = np.nonzero(kept.T)
    c = dict(x=saved["moe_input"].data.reshape(T, h), logits=logits, probs=probs, top=top,
             kept=kept, tokens=tokens, experts=experts)
    c["dscores"], c["scores"] = (K.aux_loss(logits, mspec, aux_tokens, T * t)[1:]
                                 if mspec.aux_loss_coeff > 0 else (None, None))
    return c


def moe_mlp_backward(r, spec, w: dict, g: dict, saved: dict, dout):
    """dout (s, b, h) -> gradient at the block input (s, b, h); the aux loss's gradient is
    spec.aux_scale (b/B: Megatron's 1/micro-batches, then the DP average)."""
    m, mspec = spec.model, moe_spec(spec.model)
    if spec.recomputes("moe"):  # the MoE layer again from its input, communication included
        inner = Stash(r, keep=True)
        r.phase = "recompute"
        combined = yield from moe_core(r, spec, w, saved["moe_input"], inner)
        r.phase = "backward"
        r.free(combined)
        saved.update(inner.tensors)
    mask = saved.pop("mlp_dropout_mask", None)
    dy = yield from ops.dropout_backward(r, dout, mask, m.hidden_dropout, "d_moe_output")
    r.free(mask)
    x = saved["moe_input"]
    shared_dx = None
    if m.moe_shared_expert_intermediate_size:
        shared_dx = yield from shared_backward(r, m, w, g, saved, dy, x)
    s, b, h = x.shape
    T, E = s * b, m.num_experts
    aux_tokens = saved.pop(AUX_TOKENS, None)
    c = _routing_cache(saved, mspec, T, h, None if aux_tokens is None else aux_tokens.data,
                       len(aux_group(r))) if r.numeric else None
    if _expert_parallel(r) and r.moe.dispatcher == "allgather":
        dx_tokens, dprobs = yield from _allgather_backward(r, m, w, g, saved, dy, T, E, h)
        if dy is not dout:
            r.free(dy)
        dx_tokens_t = r.alloc((T, h), FP16, "d_permuted_tokens", data=dx_tokens)
        dx_route = (lambda: K.router_backward(dx_tokens, dprobs, c, w[ROUTER].data, mspec,
                                              spec.aux_scale))
    else:
        dx_tokens_t, dx_route = yield from _alltoall_backward(r, m, mspec, spec, w, g, saved,
                                                              dy, dout, c, T, h)
    dx_data = None
    if r.numeric:
        dx2, drouter = dx_route()
        g[ROUTER].data += drouter
        dx_data = dx2.reshape(s, b, h)
    dlogits = r.alloc((T, E), FP32, "d_router_logits")
    yield from r.compute("d_router_logits", "elementwise", nbytes=8 * T * E)
    r.free(dx_tokens_t)
    dx = r.alloc((s, b, h), FP16, "d_router", data=dx_data)
    yield from r.compute("d_router", "gemm", 2 * 2 * T * h * E, gemm=(T, E, h))
    r.free(dlogits)
    if shared_dx is not None:
        if r.numeric:
            dx.data = dx.data + shared_dx.data
        yield from r.compute("d_shared_add", "elementwise", nbytes=3 * dx.nbytes)
        r.free(shared_dx)
    for name in ("router_logits", "routing_map", "expert_output"):
        r.free(saved.pop(name))
    dln = yield from norm_backward(r, m, dx, saved["ln2_input"], w, g, "ln2", "d_ln2_input")
    r.free(dx, saved.pop("moe_input"), saved.pop("ln2_input"))
    dres = yield from ops.add(r, dout, dln, "d_residual")
    r.free(dout, dln)
    return dres


def _alltoall_backward(r, m, mspec, spec, w, g, saved, dy, dout, c, T: int, h: int):
    """Unpermute's backward at the source, then the pairs' gradients to their experts and the
    rows' gradients back (alltoall dispatcher). Returns the permuted rows' gradient (N, h) and
    the router's backward (a thunk, numeric)."""
    out = saved["expert_output"]
    N, M = out.shape[0], saved.pop(COUNTS).data
    parallel = _expert_parallel(r)
    d_rows = dprobs = None
    if r.numeric:
        d_rows, dprobs = K.unpermute_backward(dy.data.reshape(T, h), out.data, c)
    d_out = r.alloc((N, h), FP16, "d_expert_output", data=d_rows)
    yield from r.compute("d_unpermute", "elementwise", nbytes=dy.nbytes + 2 * N * h)
    if dy is not dout:
        r.free(dy)
    plan = D.exchange(M, r.moe) if parallel else None
    local = plan.local.sum(axis=0) if parallel else M[0]  # (E_local,)
    d_in = d_out
    if parallel:  # combine's backward: the pairs' gradients to their experts
        rows = yield from D.dispatch(r, r.moe, plan, d_out.data, h, "moe_combine_grad")
        r.free(d_out)
        d_in = r.alloc((plan.rows_in, h), FP16, "d_expert_output_recv", data=rows)
        yield from _sort(r, d_in)
    dx_in = yield from _experts_backward(r, m, w, g, saved, d_in, local, h)
    dxp = dx_in
    if parallel:  # dispatch's backward: the rows' gradients to their sources
        yield from _sort(r, dx_in)
        rows = yield from D.combine(r, r.moe, plan, dx_in.data, h, "moe_dispatch_grad")
        r.free(dx_in)
        dxp = r.alloc((N, h), FP16, "d_permuted_tokens", data=rows)
    return dxp, (lambda: K.route_backward(dxp.data, dprobs, c, w[ROUTER].data, mspec,
                                          spec.aux_scale))


def _allgather_forward(r, spec, w, x, c, counts, T: int, E: int, h: int, width: int, f: int,
                       stash):
    """Gather every member's tokens, run this rank's experts on theirs, unpermute into the
    (n·T, h) buffer, reduce-scatter it (moe_allgather.py). Returns (T, h) data (None in meta)
    and the rows this rank's experts computed."""
    er, n = r.moe, len(r.moe.tp_ep_group)
    x_all, probs_t, kept_t = yield from A.gather_tokens(
        r, er, x.data.reshape(T, h) if r.numeric else None, c, T, E, h)
    gathered = r.alloc((n * T, h), FP16, "gathered_tokens", data=x_all)
    local = A.local_counts(kept_t.data, er) if r.numeric else A.modelled_counts(counts, er)
    rows = x_all[A.local_pairs(kept_t.data, er)[0]] if r.numeric else None
    x_in = r.alloc((int(local.sum()), h), FP16, "permuted_tokens", data=rows)
    yield from r.compute("permute", "elementwise", nbytes=gathered.nbytes + x_in.nbytes)
    r.free(gathered)
    out = yield from _experts_forward(r, spec, w, x_in, local, width, f, h, stash)
    partial = r.alloc((n * T, h), FP16, "unpermuted_output", data=A.unpermute_partial(
        out.data, probs_t.data, kept_t.data, er) if r.numeric else None)
    yield from r.compute("unpermute", "elementwise", nbytes=out.nbytes + partial.nbytes)
    combined = yield from A.combine(r, er, partial.data, T, h, "moe_combine")
    r.free(partial)
    for name, tensor in (("gathered_probs", probs_t), ("gathered_routing_map", kept_t),
                         ("permuted_tokens", x_in), ("expert_output", out)):
        stash.put(name, tensor)
    stash.tensors[COUNTS] = Tensor((1, len(local)), 8, local[None])
    return combined, int(local.sum())


def _allgather_backward(r, m, w, g, saved, dy, T: int, E: int, h: int):
    """The conjugates: dy all-gathered, this rank's experts' backward, the tokens' and probs'
    gradients reduce-scattered. Returns dx at the tokens (T, h) and d probs (T, E) (numeric)."""
    er, n = r.moe, len(r.moe.tp_ep_group)
    probs_t, kept_t = saved.pop("gathered_probs"), saved.pop("gathered_routing_map")
    out, local = saved["expert_output"], saved.pop(COUNTS).data[0]
    dy_all = yield from A.gather_grad(r, er, dy.data.reshape(T, h) if r.numeric else None, T, h)
    gathered = r.alloc((n * T, h), FP16, "d_gathered_output", data=dy_all)
    d_rows = dprobs_all = None
    if r.numeric:
        d_rows, dprobs_all = A.unpermute_backward(dy_all, out.data, probs_t.data, kept_t.data, er)
    d_in = r.alloc(out.shape, FP16, "d_expert_output", data=d_rows)
    yield from r.compute("d_unpermute", "elementwise", nbytes=gathered.nbytes + 2 * d_in.nbytes)
    r.free(gathered)
    dx_in = yield from _experts_backward(r, m, w, g, saved, d_in, local, h)
    dx_all = r.alloc((n * T, h), FP16, "d_gathered_tokens", data=A.scatter_add(
        dx_in.data, kept_t.data, er, h) if r.numeric else None)
    dprobs = r.alloc((n * T, E), FP32, "d_gathered_probs", data=dprobs_all)
    yield from r.compute("d_permute", "elementwise", nbytes=dx_in.nbytes + dx_all.nbytes)
    r.free(dx_in)
    dx_tokens, dprobs_local = yield from A.scatter_grads(r, er, dx_all.data, dprobs.data, T, E, h)
    r.free(dx_all, dprobs, probs_t, kept_t)
    return dx_tokens, dprobs_local


def _experts_backward(r, m, w, g, saved, d_in, local, h: int):
    """d of fc2, the activation and fc1 on the experts' rows: d_in (N_in, h) -> (N_in, h);
    the local experts' weight gradients accumulate in g."""
    x_in, act_in = saved.pop("permuted_tokens"), saved.pop(act_in_name(m))
    act_out = saved.pop("expert_fc2_input", None)
    if act_out is None:  # moe_act recomputed
        f = act_in.shape[1] // (2 if m.swiglu else 1)
        r.phase = "recompute"
        act_out = yield from activation(r, m, act_in, "expert_fc2_input", f,
                                         "recompute_experts_act")
        r.phase = "backward"
    n_in, width, f = x_in.shape[0], act_in.shape[1], act_out.shape[1]
    dx_data = None
    if r.numeric:
        weights = _weights(w)
        dx_data, dfc1, dfc2 = K.experts_backward(d_in.data, x_in.data, act_in.data,
                                                 act_out.data, weights["fc1"], weights["fc2"],
                                                 local, m.swiglu)
        g[FC1].data += dfc1.reshape(g[FC1].shape)
        g[FC2].data += dfc2
    d_act = r.alloc((n_in, f), FP16, "d_expert_fc2")
    yield from expert_gemm(r, "d_expert_fc2", local, f, h, passes=2)
    r.free(d_in, act_out)
    d_act_in = r.alloc((n_in, width), FP16, "d_expert_act_input")
    yield from r.compute("d_expert_act_input", "elementwise", nbytes=3 * act_in.nbytes)
    r.free(d_act, act_in)
    dx_in = r.alloc((n_in, h), FP16, "d_expert_fc1", data=dx_data)
    yield from expert_gemm(r, "d_expert_fc1", local, h, width, passes=2)
    r.free(d_act_in, x_in)
    return dx_in
