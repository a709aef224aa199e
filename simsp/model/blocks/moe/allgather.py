"""Megatron-LM's allgather token dispatcher (megatron/core/transformer/moe/token_dispatcher.py
MoEAllGatherTokenDispatcher) across the ETP·EP ranks of an expert group: it is the all-gather
and reduce-scatter it is (docs/moe.md).

Forward: all-gather every member's tokens (T, h), probabilities (T, E) fp32 and routing map
(T, E) over the group (gather_from_sequence_parallel_region), so each member holds all n·T
tokens; it permutes those kept for its own experts, runs them (its f/ETP slice), unpermutes
with the probabilities into an (n·T, h) buffer and reduce-scatters it
(reduce_scatter_to_sequence_parallel_region): each member gets the sum, over the group, of
every expert's output for its own T tokens. Backward: the all-gather's and reduce-scatter's
conjugates: dy all-gathered, the tokens' and the probabilities' gradients reduce-scattered.
"""

import numpy as np

from simsp.model.blocks.moe import experts
from simsp.model.blocks.moe.experts import COUNTS
from simsp.model.blocks.moe.router import ROUTER, moe_spec, router_backward
from simsp.model.tensor import FP16, FP32, MASK, Tensor


def _gather(r, er, data, shape: tuple, itemsize: int, tag: str, label: str):
    """All-gather (ring) a (T, ·) array over the ETP·EP group -> (n·T, ·) (None in meta)."""
    n = len(er.tp_ep_group)
    full = (n * shape[0],) + tuple(shape[1:])
    nbytes = itemsize * int(np.prod(full))
    start = r.env.now
    r.count_comm(label, (n - 1) * nbytes // n)
    buffer = None if data is None else np.ascontiguousarray(data, dtype=float).reshape(-1)
    result = yield from r.tp.comm.all_gather(er.tp_ep_group, r.rank, buffer, nbytes, tag,
                                             elem_bytes=itemsize)
    r.count_exposed("ep_comm", r.env.now - start)
    return None if result is None else result.reshape(full)


def _scatter(r, er, data, shape: tuple, itemsize: int, tag: str, label: str):
    """Reduce-scatter (ring) an (n·T, ·) array over the group -> this member's (T, ·) sum."""
    n = len(er.tp_ep_group)
    nbytes = itemsize * int(np.prod(shape))
    start = r.env.now
    r.count_comm(label, (n - 1) * nbytes // n)
    buffer = None if data is None else data.reshape(-1)
    result = yield from r.tp.comm.reduce_scatter(er.tp_ep_group, r.rank, buffer, nbytes, tag,
                                                 elem_bytes=itemsize)
    r.count_exposed("ep_comm", r.env.now - start)
    return None if result is None else result.reshape((shape[0] // n,) + tuple(shape[1:]))


def local_pairs(kept_all, er):
    """(tokens, experts) of the gathered pairs kept for this member's experts, expert-major,
    tokens ascending; experts numbered locally."""
    mine = kept_all[:, er.first_expert:er.first_expert + er.num_local_experts]  # (n·T, E_l)
    experts, tokens = np.nonzero(mine.T)
    return tokens, experts


def gather_tokens(r, er, x, c, T: int, E: int, h: int):
    """Forward all-gathers: tokens, probs, routing map. Returns (x_all, probs_all, kept_all)
    arrays (None in meta) and allocates the gathered probs and map (kept for backward)."""
    n = len(er.tp_ep_group)
    x_all = yield from _gather(r, er, x, (T, h), FP16, "moe_ag_tokens", "all_gather_moe")
    probs = yield from _gather(r, er, None if c is None else c["probs"], (T, E), FP32,
                               "moe_ag_probs", "all_gather_moe")
    kept = yield from _gather(r, er, None if c is None else c["kept"], (T, E), MASK,
                              "moe_ag_map", "all_gather_moe")
    probs_t = r.alloc((n * T, E), FP32, "gathered_probs", data=probs)
    kept_t = r.alloc((n * T, E), MASK, "gathered_routing_map",
                     data=None if kept is None else kept.astype(bool))
    return x_all, probs_t, kept_t


def unpermute_partial(out, probs_all, kept_all, er):
    """(n·T, h): this member's experts' outputs out (N_in, h) weighted and summed per token."""
    tokens, experts = local_pairs(kept_all, er)
    weight = probs_all[tokens, experts + er.first_expert][:, None]  # (N_in, 1)
    y = np.zeros((probs_all.shape[0], out.shape[1]), dtype=out.dtype)  # (n·T, h)
    np.add.at(y, tokens, weight * out)
    return y


def unpermute_backward(dy_all, out, probs_all, kept_all, er):
    """d out rows (N_in, h) and d probs (n·T, E) of unpermute_partial."""
    tokens, experts = local_pairs(kept_all, er)
    columns = experts + er.first_expert
    dprobs = np.zeros_like(probs_all)  # (n·T, E)
    dprobs[tokens, columns] = (dy_all[tokens] * out).sum(axis=1)
    return probs_all[tokens, columns][:, None] * dy_all[tokens], dprobs


def scatter_add(rows, kept_all, er, h: int):
    """(n·T, h): the experts' input gradient rows (N_in, h) added at their tokens."""
    tokens, _ = local_pairs(kept_all, er)
    dx = np.zeros((kept_all.shape[0], h), dtype=rows.dtype)
    np.add.at(dx, tokens, rows)
    return dx


def local_counts(kept_all, er) -> np.ndarray:
    """(E_local,) gathered rows per local expert."""
    mine = kept_all[:, er.first_expert:er.first_expert + er.num_local_experts]
    return mine.sum(axis=0)


def modelled_counts(counts: np.ndarray, er) -> np.ndarray:
    """Meta: every member routes as the model says, so each local expert gets n times this
    rank's count."""
    n = len(er.tp_ep_group)
    return n * counts[er.first_expert:er.first_expert + er.num_local_experts]


def combine(r, er, y_all, T: int, h: int, tag: str):
    """Reduce-scatter the (n·T, h) partial outputs -> (T, h)."""
    n = len(er.tp_ep_group)
    return (yield from _scatter(r, er, y_all, (n * T, h), FP16, tag, "reduce_scatter_moe"))


def gather_grad(r, er, dy, T: int, h: int):
    """Backward of the reduce-scatter: all-gather dy (T, h) -> (n·T, h)."""
    return (yield from _gather(r, er, dy, (T, h), FP16, "moe_ag_grad", "all_gather_moe"))


def scatter_grads(r, er, dx_all, dprobs_all, T: int, E: int, h: int):
    """Backward of the tokens' and probs' all-gathers: reduce-scatter both -> (T, h), (T, E)."""
    n = len(er.tp_ep_group)
    dx = yield from _scatter(r, er, dx_all, (n * T, h), FP16, "moe_rs_grad", "reduce_scatter_moe")
    dprobs = yield from _scatter(r, er, dprobs_all, (n * T, E), FP32, "moe_rs_probs_grad",
                                 "reduce_scatter_moe")
    return dx, dprobs


# ---------------------------------------------------------------------------------------------
# the MoE layer's dispatch through it


def forward(r, spec, w, x, routed, stash):
    """Gather every member's tokens, run this rank's experts on theirs, unpermute into the
    (n·T, h) buffer, reduce-scatter it: x (s, b, h) -> the routed output (s, b, h), and the
    rows this rank's experts computed."""
    s, b, h = x.shape
    T, E = s * b, spec.model.num_experts
    er, n, c = r.moe, len(r.moe.tp_ep_group), routed.cache
    x_all, probs_t, kept_t = yield from gather_tokens(
        r, er, x.data.reshape(T, h) if r.numeric else None, c, T, E, h)
    gathered = r.alloc((n * T, h), FP16, "gathered_tokens", data=x_all)
    local = local_counts(kept_t.data, er) if r.numeric else modelled_counts(routed.counts, er)
    rows = x_all[local_pairs(kept_t.data, er)[0]] if r.numeric else None
    x_in = r.alloc((int(local.sum()), h), FP16, "permuted_tokens", data=rows)
    yield from r.compute("permute", "elementwise", nbytes=gathered.nbytes + x_in.nbytes)
    r.free(gathered)
    out = yield from experts.forward(r, spec, w, x_in, local, stash)
    partial = r.alloc((n * T, h), FP16, "unpermuted_output", data=unpermute_partial(
        out.data, probs_t.data, kept_t.data, er) if r.numeric else None)
    yield from r.compute("unpermute", "elementwise", nbytes=out.nbytes + partial.nbytes)
    y = yield from combine(r, er, partial.data, T, h, "moe_combine")  # (T, h)
    r.free(partial)
    for name, tensor in (("gathered_probs", probs_t), ("gathered_routing_map", kept_t),
                         ("permuted_tokens", x_in), ("expert_output", out)):
        stash.put(name, tensor)
    stash.tensors[COUNTS] = Tensor((1, len(local)), 8, local[None])
    combined = r.alloc((s, b, h), FP16, "moe_output",
                       data=y.reshape(s, b, h) if r.numeric else None)
    for name, tensor in (("router_logits", routed.logits), ("routing_map", routed.routing_map)):
        stash.put(name, tensor)
    return combined, int(local.sum())


def backward(r, spec, w, g, saved, dy, dout, c):
    """dy (s, b, h) at the routed output -> the tokens' gradient (T, h), and the router's
    backward (a thunk, numeric) from the probabilities' gradient."""
    m = spec.model
    s, b, h = dy.shape
    T = s * b
    dx_tokens, dprobs = yield from _gradients(r, m, w, g, saved, dy, T, m.num_experts, h)
    if dy is not dout:
        r.free(dy)
    dx_tokens_t = r.alloc((T, h), FP16, "d_permuted_tokens", data=dx_tokens)
    return dx_tokens_t, (lambda: router_backward(dx_tokens, dprobs, c, w[ROUTER].data,
                                                 moe_spec(m),
                                                 spec.aux_scale * spec.gradient_factor))


def _gradients(r, m, w, g, saved, dy, T: int, E: int, h: int):
    """The conjugates: dy all-gathered, this rank's experts' backward, the tokens' and probs'
    gradients reduce-scattered. Returns dx at the tokens (T, h) and d probs (T, E) (numeric)."""
    er, n = r.moe, len(r.moe.tp_ep_group)
    probs_t, kept_t = saved.pop("gathered_probs"), saved.pop("gathered_routing_map")
    out, local = saved["expert_output"], saved.pop(COUNTS).data[0]
    dy_all = yield from gather_grad(r, er, dy.data.reshape(T, h) if r.numeric else None, T, h)
    gathered = r.alloc((n * T, h), FP16, "d_gathered_output", data=dy_all)
    d_rows = dprobs_all = None
    if r.numeric:
        d_rows, dprobs_all = unpermute_backward(dy_all, out.data, probs_t.data, kept_t.data, er)
    d_in = r.alloc(out.shape, FP16, "d_expert_output", data=d_rows)
    yield from r.compute("d_unpermute", "elementwise", nbytes=gathered.nbytes + 2 * d_in.nbytes)
    r.free(gathered)
    dx_in = yield from experts.backward(r, m, w, g, saved, d_in, local, h)
    dx_all = r.alloc((n * T, h), FP16, "d_gathered_tokens", data=scatter_add(
        dx_in.data, kept_t.data, er, h) if r.numeric else None)
    dprobs = r.alloc((n * T, E), FP32, "d_gathered_probs", data=dprobs_all)
    yield from r.compute("d_permute", "elementwise", nbytes=dx_in.nbytes + dx_all.nbytes)
    r.free(dx_in)
    dx_tokens, dprobs_local = yield from scatter_grads(r, er, dx_all.data, dprobs.data, T, E, h)
    r.free(dx_all, dprobs, probs_t, kept_t)
    return dx_tokens, dprobs_local
