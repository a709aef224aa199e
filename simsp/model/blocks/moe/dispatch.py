"""Tokens to their experts' ranks and back: Megatron-LM's alltoall token dispatcher
(megatron/core/transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher) on the
expert-parallel (EP) and expert-tensor-parallel (ETP) groups, through the communicator's
all-to-all-v over the real links.

Each rank routes its own tokens and permutes the kept pairs expert-major (moe_kernels.route).
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

from simsp.model.tensor import FP16

COUNT_BYTES = 8  # int64 tokens per expert


@dataclass(frozen=True)
class Exchange:
    """One rank's rows in one MoE layer's dispatch, from the count matrix C (ETP·EP, E)."""

    ep_send: tuple  # rows to each EP member (this rank's pairs for its experts)
    ep_recv: tuple  # rows from each EP member (its pairs for this rank's experts)
    etp_rows: tuple  # rows each ETP member holds after its EP exchange
    local: np.ndarray  # (ETP·EP, E_local) rows per source (j', i') and local expert

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


def dispatch(r, er, plan: Exchange, xp_data, h: int, tag: str):
    """This rank's expert-major rows xp (N, h) -> its experts' rows from every source,
    expert-major (N_in, h) (None in meta)."""
    chunks = split_rows(xp_data, plan.ep_send) if r.numeric else None
    got = yield from all_to_all(r, er.ep_group, er.ep_index, chunks, plan.ep_send, h, tag,
                                "all_to_all_dispatch")
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
    got = yield from all_to_all(r, er.ep_group, er.ep_index, chunks, plan.ep_recv, h, tag,
                                "all_to_all_combine")
    return np.concatenate(got) if r.numeric else None
