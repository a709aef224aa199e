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

from simsp.model.tensor import FP16, FP32, MASK


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

