"""Megatron-LM's flex token dispatcher with DeepEP (--moe-token-dispatcher-type flex
--moe-enable-deepep; megatron/core/transformer/moe/token_dispatcher.py MoEFlexTokenDispatcher,
fused_a2a.py): the EP exchange of dispatch and combine as DeepEP's normal kernels run it, each
token once per node over RDMA and once per rank over NVLink (engine/collectives/deepep.py).

Which EP members a token reaches (DeepEP's is_token_in_rank, (T, EP) bool) is the kept routing
map folded over each member's experts in numeric mode. Meta mode has counts only: each expert's
kept rows are drawn from the T tokens uniformly without replacement (seeded by the run's seed),
the counts kept exactly; a token's experts are then spread as random top-k routing spreads
them; member i's table is member 0's turned by i, alike in every layer, as the alltoall
dispatcher's byte rows are (docs/deepep.md). The rows moved, and so the numerics, are the alltoall
dispatcher's: only the bytes on each link and their timing differ.
"""

from dataclasses import replace
from functools import lru_cache

import numpy as np

from simsp.model.tensor import FP16, Tensor

ROUTES = "deepep_in_rank"  # stash key: (T, EP) bool, ledger-less (DeepEP's handle)


@lru_cache(maxsize=256)
def _drawn(seed: int, T: int, counts: tuple, ep: int) -> np.ndarray:
    """Meta mode's (T, EP) bool for EP member 0: expert e's counts[e] rows drawn from T tokens
    uniformly (member i's is this turned by i: docs/deepep.md "Meta mode")."""
    rng = np.random.default_rng([seed, 4099])
    E = len(counts)
    kept = np.zeros((T, E), dtype=bool)  # (T, E)
    for e, n in enumerate(counts):
        kept[rng.choice(T, size=n, replace=False), e] = True
    return kept.reshape(T, ep, E // ep).any(axis=2)


def in_rank(r, routed) -> np.ndarray:
    """(T, EP) bool: which EP members each of this rank's tokens reaches."""
    er, T = r.moe, routed.logits.shape[0]
    if r.numeric:
        kept = routed.cache["kept"]  # (T, E)
        return kept.reshape(T, er.ep, er.num_local_experts).any(axis=2)
    drawn = _drawn(r.seed, T, tuple(int(c) for c in routed.counts), er.ep)  # (T, EP)
    return np.roll(drawn, er.ep_index, axis=1)


def with_routes(r, plan, routed, stash):
    """The exchange plan with its routes for flex (stashed for backward); unchanged else."""
    if r.moe.dispatcher != "flex":
        return plan
    routes = in_rank(r, routed)
    stash.tensors[ROUTES] = Tensor(routes.shape, 1, routes)
    return replace(plan, in_rank=routes)


def saved_routes(plan, saved: dict):
    """Backward's plan with the routes forward stashed (flex), popped."""
    routes = saved.pop(ROUTES, None)
    return plan if routes is None else replace(plan, in_rank=routes.data)


def exchange(r, er, routes, chunks, rows, h: int, tag: str, combine: bool):
    """DeepEP's dispatch (or combine) over the EP group: chunks[q] (numeric) to member q;
    returns the received chunks (None in meta). The whole wait is exposed EP communication."""
    start = r.env.now
    received = yield from r.tp.comm.deepep(er.ep_group, r.rank, chunks, routes, h * FP16, tag,
                                           combine)
    label = "deepep_combine" if combine else "deepep_dispatch"
    r.count_comm(label, sum(int(n) * h * FP16 for q, n in enumerate(rows) if q != er.ep_index))
    r.count_exposed("ep_comm", r.env.now - start)
    if r.trace is not None:
        r.trace.add_span(r.rank, "ep_comm", f"deepep {tag}", start, r.env.now,
                         {"phase": r.phase})
    return received
