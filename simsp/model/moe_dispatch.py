"""Tokens to their experts' ranks and back: Megatron-LM's alltoall token dispatcher
(megatron/core/transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher) on the
expert-parallel group, through the communicator's all-to-all-v over the real links.

Each rank routes its own tokens and permutes the kept pairs expert-major (moe_kernels.route);
the EP group first all-gathers every member's tokens per expert (E,) (the dispatcher's
`num_global_tokens_per_expert`), so every rank knows the (EP, E) count matrix M. Dispatch: rank
i sends rank j its rows for j's experts (a contiguous block of its expert-major rows,
Σ_e∈j M[i, e] rows of h bf16 values). Rank j receives them source-major and sorts them
expert-major (sort_chunks_by_idxs) when it holds more than one expert. Combine is the
reverse: unsort, all-to-all back, and the source then unpermutes with its probabilities.
Backward runs the same two exchanges in the other order (combine's backward is a dispatch).
"""

import numpy as np

from simsp.model.tensor import FP16

COUNT_BYTES = 8  # int64 tokens per expert


def local_matrix(M: np.ndarray, er) -> np.ndarray:
    """(EP, E_local): rows each source sends to this rank, per local expert."""
    return M[:, er.first_expert:er.first_expert + er.num_local_experts]


def send_rows(M: np.ndarray, er, source: int) -> list[int]:
    """Rows the EP member `source` sends to each member (its rows for their experts)."""
    return [int(M[source, list(er.experts_of(j))].sum()) for j in range(er.ep)]


def sort_by_expert(chunks: list, local: np.ndarray) -> np.ndarray:
    """Source-major received chunks (chunk i expert-major, local[i] rows per expert) ->
    expert-major rows (N_recv, h), sources ascending within an expert."""
    starts = [np.concatenate(([0], np.cumsum(row)[:-1])) for row in local]
    return np.concatenate([chunks[i][starts[i][e]:starts[i][e] + local[i, e]]
                           for e in range(local.shape[1]) for i in range(local.shape[0])])


def unsort_by_expert(rows: np.ndarray, local: np.ndarray) -> list:
    """Inverse of sort_by_expert: expert-major rows -> one chunk per source."""
    pieces = [[None] * local.shape[1] for _ in range(local.shape[0])]
    offset = 0
    for e in range(local.shape[1]):
        for i in range(local.shape[0]):
            pieces[i][e] = rows[offset:offset + local[i, e]]
            offset += local[i, e]
    return [np.concatenate(p) for p in pieces]


def split_rows(rows: np.ndarray, counts: list[int]) -> list:
    """Consecutive blocks of `rows` of the given sizes."""
    ends = np.cumsum(counts)
    return [rows[e - c:e] for c, e in zip(counts, ends)]


def exchange_counts(r, er, counts: np.ndarray, model_matrix):
    """All-gather the tokens per expert (E,) over the EP group -> M (EP, E). Numeric mode reads
    the gathered counts; meta mode takes `model_matrix()` (every member's modelled counts)."""
    E = er.num_experts
    start = r.env.now
    buffer = counts.astype(np.int64) if r.numeric else None
    result = yield from r.tp.comm.all_gather(er.ep_group, r.rank, buffer, COUNT_BYTES * E * er.ep,
                                             "moe_counts", elem_bytes=COUNT_BYTES)
    r.count_comm("all_gather_moe_counts", COUNT_BYTES * E * (er.ep - 1))
    r.count_exposed("ep_comm", r.env.now - start)
    return result.reshape(er.ep, E) if r.numeric else model_matrix()


def all_to_all(r, er, chunks, rows: list[int], h: int, tag: str, label: str):
    """Send rows[j] rows of h bf16 values (chunks[j]) to EP member j; returns the received
    chunks (None in meta). The whole wait is exposed EP communication."""
    start = r.env.now
    nbytes = [n * h * FP16 for n in rows]
    r.count_comm(label, sum(b for j, b in enumerate(nbytes) if j != er.ep_index))
    received = yield from r.tp.comm.all_to_all(er.ep_group, r.rank, chunks, nbytes, tag)
    r.count_exposed("ep_comm", r.env.now - start)
    if r.trace is not None:
        r.trace.add_span(r.rank, "ep_comm", f"all_to_all {tag}", start, r.env.now,
                         {"phase": r.phase, "bytes": sum(nbytes)})
    return received


def dispatch(r, er, xp, M: np.ndarray, tag: str):
    """Expert-major rows xp (N, h) of this rank -> its experts' rows (N_recv, h), expert-major
    (data; None in meta) and how many (N_recv)."""
    local = local_matrix(M, er)
    h = xp.shape[1]
    rows = send_rows(M, er, er.ep_index)
    chunks = split_rows(xp.data, rows) if r.numeric else None
    received = yield from all_to_all(r, er, chunks, rows, h, tag, "all_to_all_dispatch")
    data = sort_by_expert(received, local) if r.numeric else None
    return data, int(local.sum())


def combine(r, er, out, M: np.ndarray, tag: str):
    """This rank's experts' rows out (N_recv, h) back to their sources -> this rank's own pairs
    (N, h) in its expert-major order (data; None in meta) and how many."""
    local = local_matrix(M, er)
    h = out.shape[1]
    rows = [int(n) for n in local.sum(axis=1)]  # to each source, its rows
    chunks = unsort_by_expert(out.data, local) if r.numeric else None
    received = yield from all_to_all(r, er, chunks, rows, h, tag, "all_to_all_combine")
    mine = send_rows(M, er, er.ep_index)
    data = np.concatenate(received) if r.numeric else None
    return data, sum(mine)
