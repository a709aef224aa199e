"""One iteration's traffic with context parallelism, listed for shortcuts/check.py (without CP:
shortcuts/traffic.py).

Ranks are placed as Megatron-LM places them with CP (cluster/grid.py: tp + t·cp + t·c·dp +
t·c·d·pp): TP groups of t neighbours, gradients reduced over the dp_cp group (CP fastest),
pipeline pairs and the tied embedding per (tp, cp, dp). The CP exchanges themselves
(docs/context-parallel.md): the ring's K/V and dK/dV sends (p2p), Ulysses' all-to-alls (a2a)
and a2a+p2p's all-to-alls inside its a2a groups and ring across them run as flows between the
group's ranks inside the attention op, in turn with the rank's TP collectives, so they are
listed as the MoE all-to-alls are ("ep": every ordered pair of the CP group, a superset of
each of these); the all-gather variant's
K/V all-gather and dK/dV reduce-scatter are ring collectives on the compute stream, listed as a
TP group is.
"""

from simsp.cluster.grid import RankGrid
from simsp.shortcuts.traffic import Owner, pipeline_owners


def cp_traffic_owners(grid: RankGrid, interleaved: bool, cp_comm_type: str) -> list[Owner]:
    """Every collective group and point-to-point pair of one iteration with cp > 1 (rank r on
    GPU r), with the same kinds and order rules as shortcuts/traffic.py traffic_owners."""
    owners: list[Owner] = []
    if grid.tp > 1:
        owners += [("tp", group) for group in grid.groups("tp")]
    owners += [("dp", group) for group in grid.groups("dp_cp")]
    cp_kind = "tp" if cp_comm_type == "allgather" else "ep"
    owners += [(cp_kind, group) for group in grid.groups("cp")]
    if grid.pp > 1:
        owners += pipeline_owners(grid.groups("pp"), interleaved)
    return owners


def cp_moe_owners(sc) -> list[Owner]:
    """With MoE layers and cp > 1, the router's tokens-per-expert all-reduce over each tp_cp
    group (t·cp consecutive ranks: megatron/core/transformer/moe/router.py reduces over
    tp_cp_group; model/blocks/moe/layer.py aux_group), a ring collective on the compute stream."""
    p = sc.parallel
    m = sc.model
    if p.cp == 1 or m.num_experts is None or m.moe_aux_loss_coeff == 0 or \
            m.moe_router_load_balancing_type != "aux_loss":
        return []
    span = p.tp * p.cp
    return [("tp", tuple(range(start, start + span)))
            for start in range(0, p.world_size, span)]
