"""Where a rank sits among the expert layers: its expert-parallel group and experts, its
expert-data-parallel group (simsp/cluster/expert_grid.py, Megatron-LM's rank order)."""

from dataclasses import dataclass

import numpy as np

from simsp.cluster.expert_grid import ExpertGrid


@dataclass(frozen=True)
class ExpertRank:
    """One rank's share of every MoE layer: experts [first, first + local) of E, the EP group
    that exchanges tokens, the EDP group that reduces the experts' gradients."""

    ep_group: tuple[int, ...]  # ranks exchanging tokens, in EP order
    ep_index: int  # this rank's position in ep_group
    edp_group: tuple[int, ...]  # ranks holding the same experts (gradients reduced here)
    etp_group: tuple[int, ...]  # ranks splitting these experts' f (expert tensor parallelism)
    etp_index: int  # this rank's position in etp_group
    tp_ep_group: tuple[int, ...]  # the ETP·EP ranks exchanging token counts, etp fastest
    num_experts: int  # E
    dispatcher: str  # --moe-token-dispatcher-type: allgather | alltoall
    grouped_gemm: bool  # --moe-grouped-gemm

    @property
    def ep(self) -> int:
        return len(self.ep_group)

    @property
    def etp(self) -> int:
        return len(self.etp_group)

    @property
    def num_local_experts(self) -> int:
        return self.num_experts // self.ep

    @property
    def first_expert(self) -> int:
        return self.ep_index * self.num_local_experts

    def experts_of(self, ep_index: int) -> range:
        """The experts held by the EP group's member `ep_index`."""
        n = self.num_local_experts
        return range(ep_index * n, (ep_index + 1) * n)

    def holds(self, name: str) -> bool:
        """Whether a canonical parameter is an expert weight, sharded here by expert."""
        return is_expert_param(name)

    def shard(self, name: str, full):
        """This rank's experts of an expert weight, their f split over ETP: (E/EP, ...) array."""
        experts = full[self.first_expert:self.first_expert + self.num_local_experts]
        return np.array_split(experts, self.etp, axis=etp_split_axis(name))[self.etp_index].copy()

    def shard_shape(self, name: str, shape: tuple) -> tuple:
        """The shape of `shard` of an expert weight of full shape `shape`."""
        out = [self.num_local_experts] + list(shape[1:])
        out[etp_split_axis(name)] //= self.etp
        return tuple(out)


def expert_parallel(r) -> bool:
    """Whether rank r's expert rows cross ranks (EP > 1 or ETP > 1)."""
    return r.moe is not None and (r.moe.ep > 1 or r.moe.etp > 1)


def expert_grid(sc) -> ExpertGrid:
    """The scenario's expert grid (ETP defaults to t)."""
    p = sc.parallel
    return ExpertGrid(p.tp, p.pp, p.dp * p.cp, p.ep, p.etp)  # the CP ranks tile it too


def expert_rank(sc, rank: int) -> ExpertRank | None:
    """The rank's expert placement, or None for a dense model."""
    if sc.model.num_experts is None:
        return None
    grid = expert_grid(sc)
    group, etp = grid.group("ep", rank), grid.group("etp", rank)
    c = grid.coords(rank)
    tp_ep = tuple(grid.rank_of(c._replace(etp=j, ep=i)) for i in range(grid.ep)
                  for j in range(grid.etp_size))
    p = sc.parallel
    return ExpertRank(group, group.index(rank), grid.group("edp", rank), etp, etp.index(rank),
                      tp_ep, sc.model.num_experts, p.moe_token_dispatcher_type,
                      p.moe_grouped_gemm)


def is_expert_param(name: str) -> bool:
    """Whether a canonical parameter is an expert weight (sharded over EP, reduced over EDP)."""
    return ".mlp.experts." in name


ETP_SPLIT_AXIS = {"mlp.experts.fc1.weight": -1, "mlp.experts.fc2.weight": 1}  # f: column, row


def etp_split_axis(name: str) -> int:
    """The axis of an expert weight split over ETP: fc1's f (column parallel), fc2's f (row)."""
    return next(axis for suffix, axis in ETP_SPLIT_AXIS.items() if name.endswith(suffix))


def representatives(sc, ranks: list[int]) -> list[int]:
    """Meta mode's representative ranks grown to whole ETP·EP groups (an all-to-all needs every
    member): the expert groups with expert-data-parallel index 0 of the given ranks."""
    grid = expert_grid(sc)
    out = set()
    for rank in ranks:
        c = grid.coords(rank)._replace(edp=0)
        out.update(grid.rank_of(c._replace(etp=j, ep=i)) for j in range(grid.etp_size)
                   for i in range(grid.ep))
    return sorted(out)


def represented_by(sc, rank: int) -> int | None:
    """The rank standing for `rank` when whole expert groups are simulated: same place in its
    expert group, EDP index 0 (None for a dense model)."""
    if sc.model.num_experts is None:
        return None
    grid = expert_grid(sc)
    return grid.rank_of(grid.coords(rank)._replace(edp=0))
