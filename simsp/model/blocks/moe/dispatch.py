"""Tokens to their experts' ranks and back: Megatron-LM's alltoall token dispatcher
(megatron/core/transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher) on the
expert-parallel (EP) and expert-tensor-parallel (ETP) groups, through the communicator's
all-to-all-v over the real links.

Each rank routes its own tokens and permutes the kept pairs expert-major (blocks/moe/router.py route).
The ETP·EP ranks of an expert group first all-gather every member's tokens per expert (E,)
(the dispatcher's `num_global_tokens_per_expert`, gathered over tp_ep_group), so every rank
knows the count matrix C (ETP·EP, E), row etp + ETP·ep. Dispatch: rank (j, i) sends each EP
member i' of its ETP index j its rows for i''s experts (a contiguous block of its expert-major
rows). With ETP > 1 the received rows are then all-gathered over the ETP group
(gather_from_sequence_parallel_region with uneven sizes: every member's block to every other,
as all-to-all-v) so each ETP rank holds every row of its experts and computes its f/ETP slice;
the rows are sorted expert-major over the sources (j', i') (sort_chunks_by_idxs) when a rank
holds more than one expert. Combine is the reverse: unsort, reduce-scatter-v over ETP (each
member's partial sums of a block to its owner, summed in ETP order), all-to-all back over EP;
the source then unpermutes with its probabilities. Backward runs the same exchanges, dispatch
for the output gradient and combine for the input gradient.
"""

from dataclasses import dataclass

import numpy as np

from simsp.model.blocks.moe import deepep, experts
from simsp.model.blocks.moe.experts import COUNTS
from simsp.model.blocks.moe.placement import expert_parallel
from simsp.model.blocks.moe.router import ROUTER, moe_spec, route_backward, unpermute, \
    unpermute_backward
from simsp.model.tensor import FP16, Tensor

COUNT_BYTES = 8  # int64 tokens per expert


@dataclass(frozen=True)
class Exchange:
    """One rank's rows in one MoE layer's dispatch, from the count matrix C (ETP·EP, E)."""

    ep_send: tuple  # rows to each EP member (this rank's pairs for its experts)
    ep_recv: tuple  # rows from each EP member (its pairs for this rank's experts)
    etp_rows: tuple  # rows each ETP member holds after its EP exchange
    local: np.ndarray  # (ETP·EP, E_local) rows per source (j', i') and local expert
    in_rank: np.ndarray | None = None  # flex: (T, EP) bool, token t reaches EP member i

    @property
    def rows_in(self) -> int:
        """Rows this rank's experts compute (every ETP member's)."""
        return int(self.local.sum())


def exchange(C: np.ndarray, er) -> Exchange:
    """Who sends whom how many rows, for rank (etp j, ep i) of `er`."""
    etp, ep, j, i = er.etp, er.ep, er.etp_index, er.ep_index
    mine = list(er.experts_of(i))

    def row(jj: int, ii: int):  # the counts of ETP member jj, EP member ii
        return C[jj + etp * ii]

    local = np.array([row(jj, ii)[mine] for jj in range(etp) for ii in range(ep)])
    return Exchange(tuple(int(row(j, i)[list(er.experts_of(ii))].sum()) for ii in range(ep)),
                    tuple(int(row(j, ii)[mine].sum()) for ii in range(ep)),
                    tuple(int(local[jj * ep:(jj + 1) * ep].sum()) for jj in range(etp)),
                    local)


def sort_by_expert(chunks: list, local: np.ndarray) -> np.ndarray:
    """Source-major chunks (chunk q expert-major, local[q] rows per expert) -> expert-major
    rows (N_in, h), sources in order within an expert."""
    starts = [np.concatenate(([0], np.cumsum(row)[:-1])) for row in local]
    return np.concatenate([chunks[q][starts[q][e]:starts[q][e] + local[q, e]]
                           for e in range(local.shape[1]) for q in range(local.shape[0])])


def unsort_by_expert(rows: np.ndarray, local: np.ndarray) -> list:
    """Inverse of sort_by_expert: expert-major rows -> one chunk per source."""
    pieces = [[None] * local.shape[1] for _ in range(local.shape[0])]
    offset = 0
    for e in range(local.shape[1]):
        for q in range(local.shape[0]):
            pieces[q][e] = rows[offset:offset + local[q, e]]
            offset += local[q, e]
    return [np.concatenate(p) for p in pieces]


def split_rows(rows: np.ndarray, counts) -> list:
    """Consecutive blocks of `rows` of the given sizes."""
    ends = np.cumsum(counts)
    return [rows[e - c:e] for c, e in zip(counts, ends)]


def exchange_counts(r, er, counts: np.ndarray, modelled):
    """All-gather the tokens per expert (E,) over the ETP·EP group -> C (ETP·EP, E). Numeric
    mode reads the gathered counts; meta mode takes `modelled` (every member's counts)."""
    E, n = er.num_experts, len(er.tp_ep_group)
    start = r.env.now
    buffer = counts.astype(np.int64) if r.numeric else None
    result = yield from r.tp.comm.all_gather(er.tp_ep_group, r.rank, buffer, COUNT_BYTES * E * n,
                                             "moe_counts", elem_bytes=COUNT_BYTES)
    r.count_comm("all_gather_moe_counts", COUNT_BYTES * E * (n - 1))
    r.count_exposed("ep_comm", r.env.now - start)
    return result.reshape(n, E) if r.numeric else np.tile(modelled, (n, 1))


def all_to_all(r, group: tuple, me: int, chunks, rows, h: int, tag: str, label: str):
    """Send rows[q] rows of h bf16 values (chunks[q]) to group[q]; returns the received chunks
    (None in meta). The whole wait is exposed EP communication."""
    start = r.env.now
    nbytes = [int(n) * h * FP16 for n in rows]
    r.count_comm(label, sum(b for q, b in enumerate(nbytes) if q != me))
    received = yield from r.tp.comm.all_to_all(group, r.rank, chunks, nbytes, tag)
    r.count_exposed("ep_comm", r.env.now - start)
    if r.trace is not None:
        r.trace.add_span(r.rank, "ep_comm", f"all_to_all {tag}", start, r.env.now,
                         {"phase": r.phase, "bytes": sum(nbytes)})
    return received


def ep_exchange(r, er, plan: Exchange, chunks, rows, h: int, tag: str, combine: bool):
    """The EP hop of dispatch (or `combine`): the alltoall dispatcher's all-to-all-v, or
    with --moe-token-dispatcher-type flex DeepEP's two hops (model/blocks/moe/deepep.py)."""
    if er.dispatcher == "flex":
        return (yield from deepep.exchange(r, er, plan.in_rank, chunks, rows, h, tag, combine))
    label = "all_to_all_combine" if combine else "all_to_all_dispatch"
    return (yield from all_to_all(r, er.ep_group, er.ep_index, chunks, rows, h, tag, label))


def dispatch(r, er, plan: Exchange, xp_data, h: int, tag: str):
    """This rank's expert-major rows xp (N, h) -> its experts' rows from every source,
    expert-major (N_in, h) (None in meta)."""
    chunks = split_rows(xp_data, plan.ep_send) if r.numeric else None
    got = yield from ep_exchange(r, er, plan, chunks, plan.ep_send, h, tag, False)
    blocks = [np.concatenate(got)] if r.numeric else None
    if er.etp > 1:  # every ETP member's block to every other
        n = plan.etp_rows[er.etp_index]
        blocks = yield from all_to_all(r, er.etp_group, er.etp_index,
                                       None if blocks is None else blocks * er.etp,
                                       [n] * er.etp, h, f"{tag}_etp", "all_gather_etp")
    if not r.numeric:
        return None
    sources = [chunk for q, block in enumerate(blocks)
               for chunk in split_rows(block, plan.local[q * er.ep:(q + 1) * er.ep].sum(axis=1))]
    return sort_by_expert(sources, plan.local)


def combine(r, er, plan: Exchange, out_data, h: int, tag: str):
    """The experts' rows out (N_in, h) (partial sums over f under ETP) back to their sources
    -> this rank's own pairs (N, h) in its expert-major order (None in meta)."""
    blocks = None
    if r.numeric:
        sources = unsort_by_expert(out_data, plan.local)
        blocks = [np.concatenate(sources[q * er.ep:(q + 1) * er.ep]) for q in range(er.etp)]
    if er.etp > 1:  # each block's partial sums to its owner, summed in ETP order
        got = yield from all_to_all(r, er.etp_group, er.etp_index, blocks, plan.etp_rows, h,
                                    f"{tag}_etp", "reduce_scatter_etp")
        block = sum(got[1:], got[0].copy()) if r.numeric else None
    else:
        block = blocks[0] if r.numeric else None
    chunks = split_rows(block, plan.ep_recv) if r.numeric else None
    got = yield from ep_exchange(r, er, plan, chunks, plan.ep_recv, h, tag, True)
    return np.concatenate(got) if r.numeric else None


# ---------------------------------------------------------------------------------------------
# the MoE layer's dispatch through it (or, without expert parallelism, none)


def on_comm_stream(r, body):
    """An all-to-all `body` on the communication stream beside another micro-batch's compute
    in a combined 1F1B step (comm_stream.py), else `body` as it is."""
    return body if r.ep_streams is None else r.ep_streams.on_comm(r, body)


def sort_chunks(r, rows):
    """sort_chunks_by_idxs: source-major <-> expert-major rows, a copy, when a rank holds
    more than one expert."""
    if r.moe.num_local_experts > 1:
        yield from r.compute("sort_chunks", "elementwise", nbytes=2 * rows.nbytes)


def forward(r, spec, w, x, routed, stash):
    """Permute, dispatch to the experts' ranks, the experts, combine back, unpermute: x
    (s, b, h) -> the routed output (s, b, h), and the rows this rank's experts computed."""
    s, b, h = x.shape
    c, counts = routed.cache, routed.counts
    N, parallel = int(counts.sum()), expert_parallel(r)
    xp = r.alloc((N, h), FP16, "dispatch_input" if parallel else "permuted_tokens",
                 data=c["xp"] if r.numeric else None)
    yield from r.compute("permute", "elementwise", nbytes=2 * xp.nbytes)
    M, x_in = counts[None], xp  # (ETP·EP, E) count matrix; the experts' input rows
    if parallel:
        M = yield from exchange_counts(r, r.moe, counts, counts)
        plan = deepep.with_routes(r, exchange(M, r.moe), routed, stash)
        rows = yield from on_comm_stream(r, dispatch(r, r.moe, plan, xp.data, h, "moe_dispatch"))
        r.free(xp)
        x_in = r.alloc((plan.rows_in, h), FP16, "permuted_tokens", data=rows)
        yield from sort_chunks(r, x_in)
    local = plan.local.sum(axis=0) if parallel else counts  # (E_local,)
    out = yield from experts.forward(r, spec, w, x_in, local, stash)
    if parallel:
        yield from sort_chunks(r, out)
        rows = yield from on_comm_stream(r, combine(r, r.moe, plan, out.data, h, "moe_combine"))
        r.free(out)
        out = r.alloc((N, h), FP16, "expert_output", data=rows)
    combined = r.alloc((s, b, h), FP16, "moe_output",
                       data=unpermute(out.data, c).reshape(s, b, h) if r.numeric else None)
    yield from r.compute("unpermute", "elementwise", nbytes=out.nbytes + combined.nbytes)
    for name, tensor in (("router_logits", routed.logits), ("routing_map", routed.routing_map),
                         ("permuted_tokens", x_in), ("expert_output", out)):
        stash.put(name, tensor)
    stash.tensors[COUNTS] = Tensor(M.shape, 8, M)  # ledger-less: 8·ETP·EP·E bytes
    return combined, int(local.sum())


def backward(r, spec, w, g, saved, dy, dout, c):
    """Unpermute's backward at the source, then the pairs' gradients to their experts and the
    rows' gradients back. Returns the permuted rows' gradient (N, h) and the router's
    backward (a thunk, numeric)."""
    s, b, h = dy.shape
    out = saved["expert_output"]
    N, M = out.shape[0], saved.pop(COUNTS).data
    parallel = expert_parallel(r)
    d_rows = dprobs = None
    if r.numeric:
        d_rows, dprobs = unpermute_backward(dy.data.reshape(s * b, h), out.data, c)
    d_out = r.alloc((N, h), FP16, "d_expert_output", data=d_rows)
    yield from r.compute("d_unpermute", "elementwise", nbytes=dy.nbytes + 2 * N * h)
    if dy is not dout:
        r.free(dy)
    plan = deepep.saved_routes(exchange(M, r.moe), saved) if parallel else None
    local = plan.local.sum(axis=0) if parallel else M[0]  # (E_local,)
    d_in = d_out
    if parallel:  # combine's backward: the pairs' gradients to their experts
        rows = yield from on_comm_stream(r, dispatch(r, r.moe, plan, d_out.data, h,
                                                  "moe_combine_grad"))
        r.free(d_out)
        d_in = r.alloc((plan.rows_in, h), FP16, "d_expert_output_recv", data=rows)
        yield from sort_chunks(r, d_in)
    dx_in = yield from experts.backward(r, spec.model, w, g, saved, d_in, local, h)
    dxp = dx_in
    if parallel:  # dispatch's backward: the rows' gradients to their sources
        yield from sort_chunks(r, dx_in)
        rows = yield from on_comm_stream(r, combine(r, r.moe, plan, dx_in.data, h,
                                                  "moe_dispatch_grad"))
        r.free(dx_in)
        dxp = r.alloc((N, h), FP16, "d_permuted_tokens", data=rows)
    return dxp, (lambda: route_backward(dxp.data, dprobs, c, w[ROUTER].data,
                                        moe_spec(spec.model),
                                        spec.aux_scale * spec.gradient_factor))
