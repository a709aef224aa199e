"""Where a rank sits among the expert layers: its expert-parallel group and experts, its
expert-data-parallel group (simsp/cluster/expert_grid.py, Megatron-LM's rank order)."""

from dataclasses import dataclass

from simsp.cluster.expert_grid import ExpertGrid


@dataclass(frozen=True)
class ExpertRank:
    """One rank's share of every MoE layer: experts [first, first + local) of E, the EP group
    that exchanges tokens, the EDP group that reduces the experts' gradients."""

    ep_group: tuple[int, ...]  # ranks exchanging tokens, in EP order
    ep_index: int  # this rank's position in ep_group
    edp_group: tuple[int, ...]  # ranks holding the same experts (gradients reduced here)
    num_experts: int  # E
    dispatcher: str  # --moe-token-dispatcher-type: allgather | alltoall
    grouped_gemm: bool  # --moe-grouped-gemm

    @property
    def ep(self) -> int:
        return len(self.ep_group)

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


def expert_grid(sc) -> ExpertGrid:
    """The scenario's expert grid (ETP defaults to t)."""
    p = sc.parallel
    return ExpertGrid(p.tp, p.pp, p.dp, p.ep, p.etp)


def expert_rank(sc, rank: int) -> ExpertRank | None:
    """The rank's expert placement, or None for a dense model."""
    if sc.model.num_experts is None:
        return None
    grid = expert_grid(sc)
    group = grid.group("ep", rank)
    p = sc.parallel
    return ExpertRank(group, group.index(rank), grid.group("edp", rank), sc.model.num_experts,
                      p.moe_token_dispatcher_type, p.moe_grouped_gemm)


def is_expert_param(name: str) -> bool:
    """Whether a canonical parameter is an expert weight (sharded over EP, reduced over EDP)."""
    return ".mlp.experts." in name


def local_expert_slice(er: ExpertRank | None, name: str, shape: tuple) -> slice | None:
    """The slice of axis 0 (experts) this rank holds of an expert weight, else None."""
    if er is None or not is_expert_param(name):
        return None
    return slice(er.first_expert, er.first_expert + er.num_local_experts)
