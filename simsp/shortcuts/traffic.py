"""One iteration's traffic, listed by owner, and the links each owner's hops cross.

An owner is a collective group (TP, DP, the tied embedding's first and last stage, an EP group's
all-to-all, an expert-data-parallel group's gradient reduction) or a pipeline pair in one
direction; its hops are every ring position of every NCCL
channel (engine/collectives/ring_plan.py channel_rings, PXN relays included), every ordered pair
of an all-to-all, or the pair's one route (cluster/topology.py hop_route). With context
parallelism the owners are listed by shortcuts/cp_traffic.py. Read by shortcuts/clashes.py.
"""

from collections import Counter

import networkx as nx

from simsp.cluster.grid import RankGrid
from simsp.cluster.topology import above_leaves, hop_route
from simsp.engine.collectives.nccl_group import nccl_choice
from simsp.engine.collectives.nccl_tuning import TREE
from simsp.engine.collectives.ring_plan import ALL_REDUCE, channel_rings
from simsp.hardware.constants import LinkCalibration
from simsp.scenario.pipeline_layout import standalone_mtp_stage
from simsp.shortcuts.a2a_links import all_to_all_links
from simsp.shortcuts.route_ends import hop_ends
from simsp.training.fp8_amax import amax_bytes, amax_group, delayed_scaling, stage_fp8_gemms
from simsp.training.pipeline.plan import stage_plans

Edge = tuple[str, str]
Owner = tuple[str, tuple[int, ...]]  # ("tp" | "dp" | "embedding" | "p2p" | "ep" | "edp" | "amax"
#                                        | "mirror", ranks)


def traffic_owners(grid: RankGrid, interleaved: bool) -> list[Owner]:
    """Every collective group and point-to-point pair of one iteration (rank r on GPU r): the
    interleaved schedule also sends from the last stage to the first; with p > 1 the first
    and last stages all-reduce the tied word embedding (training/data_parallel/finalize.py)."""
    owners: list[Owner] = []
    t, d, p = grid.tp, grid.dp, grid.pp
    if t > 1:
        owners += [("tp", tuple(range(base, base + t))) for base in range(0, t * d * p, t)]
    if d > 1:
        owners += [("dp", tuple(range(t * d * pp + tp, t * d * (pp + 1), t)))
                   for pp in range(p) for tp in range(t)]
    if p > 1:  # rank = tp + t·dp + t·d·pp
        owners += pipeline_owners([tuple(range(first, t * d * p, t * d))
                                   for first in range(t * d)], interleaved)
    return owners


def pipeline_owners(pp_groups: list[tuple[int, ...]], interleaved: bool) -> list[Owner]:
    """Per pipeline group, its pairs in both directions (activations down, gradients up; the
    interleaved schedule wraps from the last stage to the first), then its tied embedding's
    first and last stage."""
    owners: list[Owner] = []
    for group in pp_groups:
        ahead = group[1:] + group[:1] if interleaved else group[1:]
        pairs = set(zip(group, ahead))
        owners += [("p2p", pair) for pair in sorted(pairs | {(b, a) for a, b in pairs})]
        owners.append(("embedding", (group[0], group[-1])))
    return owners


def standalone_mtp_owners(sc, pp_groups: list[tuple[int, ...]]) -> list[Owner]:
    """Under Megatron's standalone MTP the embedding group is the first stage, the MTP stage
    and, when tied, the last (training/data_parallel/finalize.py tied_embedding_reduce)."""
    p = sc.parallel
    k = standalone_mtp_stage(p.pipeline_model_parallel_layout)
    if k is None:
        return []
    stages = sorted({0, k % p.pp} | ({p.pp - 1} if sc.model.tied else set()))
    return [("embedding", tuple(group[stage] for stage in stages)) for group in pp_groups]


def mirror_owners(pp_groups: list[tuple[int, ...]]) -> list[Owner]:
    """DualPipe's gradient sum of each stage with its mirror p-1-pp (training/data_parallel/
    finalize.py mirror_reduce: an all-reduce over the pair after the DP reduction) for the
    stages between the ends: the ends' pair is the embedding owner already."""
    return [("mirror", (group[i], group[-1 - i])) for group in pp_groups
            for i in range(1, len(group) // 2)]


def expert_owners(sc) -> list[Owner]:
    """The MoE layers' all-to-all groups (expert parallelism; docs/moe.md): every ordered pair
    of an EP group sends at once; then the expert-data-parallel groups of more than one rank,
    which reduce (and, under the distributed optimizer, gather) the experts' weights as DP
    rings on the DP stream (training/data_parallel/grad_buckets.py expert_buckets; Megatron's
    expert data parallel group). The MoE placement is imported only for a model with experts."""
    if sc.model.num_experts is None or sc.parallel.ep == 1:
        return []
    from simsp.model.blocks.moe.placement import expert_grid
    grid = expert_grid(sc)
    return ([("ep", group) for group in grid.groups("ep")]
            + [("edp", group) for group in grid.groups("edp") if len(group) > 1])


def amax_owners(sc, grid: RankGrid, graph: nx.DiGraph) -> list[Owner]:
    """Under FP8 delayed scaling, each stage's TP x CP x DP amax all-reduce
    (training/fp8_amax.py): a ring collective on the compute stream, in turn with the TP
    collectives as they are. Listed only where NCCL runs one of its two sizes (forward and
    backward amaxes of the stage's FP8 GEMMs) as a ring: a tree all-reduce loads no link
    (engine/timed_collectives.py)."""
    if not delayed_scaling(sc) or grid.tp * grid.cp * grid.dp == 1:
        return []
    calibration, owners = LinkCalibration.from_cluster(sc.cluster), []
    for rank, plan in stage_plans(sc, grid).items():
        group = amax_group(grid, rank)
        if rank != group[0]:
            continue
        gemms = stage_fp8_gemms(sc, plan)
        if gemms and any(nccl_choice(ALL_REDUCE, graph, list(group), amax_bytes(gemms, forward),
                                     calibration).algorithm != TREE for forward in (True, False)):
            owners.append(("amax", group))
    return owners


def has_expert_groups(sc) -> bool:
    """The model has experts split over EP or ETP groups."""
    p = sc.parallel
    return sc.model.num_experts is not None and (p.ep > 1 or p.etp > 1)


def routing_is_uniform(sc) -> bool:
    """The MoE router sends every token alike (model/blocks/moe/routing.py uniform_routing;
    imported only for a model with experts)."""
    from simsp.model.blocks.moe.routing import uniform_routing
    return uniform_routing(sc)


def owner_routes(graph: nx.DiGraph, owner: Owner) -> list[tuple[Edge, ...]]:
    """The route of every hop the owner's traffic takes: every ring position of every NCCL
    channel for a collective, the one route for a point-to-point pair."""
    kind, ranks = owner
    if kind == "p2p":
        return [hop_route(graph, ranks[0], ranks[1])]
    if kind == "ep":  # all-to-all: every ordered pair at once
        return [hop_route(graph, a, b) for a in ranks for b in ranks if a != b]
    gpus = list(ranks)
    routes = []
    for channel in channel_rings(gpus, graph.graph["gpus_per_node"]):
        order = channel.order
        routes += [hop_route(graph, gpus[order[i]], gpus[order[(i + 1) % len(order)]],
                             channel.via[i]) for i in range(len(order))]
    return routes


def can_bind(edge: Edge) -> bool:
    """Links above the leaves never bind where the check runs (shortcuts/check.py refuses a
    fabric where they can: hardware/fabric.py uplinks_can_bind): a leaf's uplink bundle
    carries as much as its NICs, a pod spine's to the core as much as its leaves' uplinks,
    and every route through either also crosses one of those (cluster/topology.py
    _add_fabric)."""
    return not above_leaves(edge)


def owner_binding_links(graph: nx.DiGraph, owner: Owner) -> list[Edge]:
    """The links that can bind of every hop of a collective's or a pair's owner_routes, hop by
    hop in their order (shortcuts/route_ends.py: each hop's ends, not its whole route)."""
    kind, ranks = owner
    hop = hop_ends(graph).hop
    if kind == "p2p":
        return list(hop(*ranks))
    gpus, links = list(ranks), []
    for channel in channel_rings(gpus, graph.graph["gpus_per_node"]):
        order, via = channel.order, channel.via
        for i in range(len(order)):
            links += hop(gpus[order[i]], gpus[order[(i + 1) % len(order)]], via[i])
    return links


def link_users(graph: nx.DiGraph, owners: list[Owner]) -> dict[Edge, dict[Owner, int]]:
    """Per link that can bind: the owners of the hops crossing it, each with its hop count, in
    the order of the hop listing (owners in order, each owner's routes in order). An EP
    group's all-to-all is counted per member, not per pair (shortcuts/a2a_links.py)."""
    users: dict[Edge, dict[Owner, int]] = {}
    for owner in owners:
        if owner[0] == "ep":
            crossings = all_to_all_links(graph, owner[1])
        elif owner[0] == "p2p":  # one hop: its two links (up and down) differ
            crossings = [(edge, 1) for edge in hop_ends(graph).hop(*owner[1])]
        else:  # its links in the order its hops first cross them, each with its hops
            crossings = Counter(owner_binding_links(graph, owner)).items()
        for edge, hops in crossings:
            counts = users.get(edge)
            if counts is None:
                counts = users[edge] = {}
            counts[owner] = counts.get(owner, 0) + hops
    return users


def gpu_of_link(edge: Edge) -> int:
    """The GPU whose NVLink port or NIC this link is (every link that can bind has one)."""
    end = edge[0] if edge[0].startswith("gpu") else edge[1]
    return int(end[3:])
