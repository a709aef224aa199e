"""The representative shortcut: one simulated rank per pipeline stage, where it is exact.

Every rank of a stage must sit on the nodes as its representative does (t*d and t tile the GPUs
per node), and every clash between traffic the representative run executes and traffic it
leaves out must be mirrored: moved by whole nodes so that its link's GPU is the stage's
representative, it is a clash the run meets among its own traffic (docs/shortcuts.md, "The
conditions"); no ring the run executes with left-out members may meet other owners at both
ends of its hops (_met_at_both_ends), and every replica's routes must be of the classes of
replica 0's (replica_routes_why_not; docs/shortcuts.md, "The audit of the mirror"). Where only
the last fails, and no experts run, TP rank 0 of the first replica of each placement on the
leaves runs on every stage (placement_replicas); where the others fail, the stage's rail
symmetry may still let one rank per orbit stand for the others (shortcuts/rail_symmetry.py).
"""

import functools

import networkx as nx

from simsp.cluster.grid import RankGrid
from simsp.cluster.topology import NODES_PER_LEAF, gpu_name, leaf_name, nvswitch_name
from simsp.shortcuts.rail_symmetry import (RailSymmetry, RouteSignatures, owner_hops,
                                           rail_symmetry)
from simsp.shortcuts.traffic import (Edge, Owner, gpu_of_link, has_expert_groups,
                                     routing_is_uniform)


def representative_verdict(sc, grid: RankGrid, graph: nx.DiGraph, owners: list[Owner],
                           clashes: list, stepwise: frozenset,
                           pieced: frozenset = frozenset()
                           ) -> tuple[str, RailSymmetry | None, bool]:
    """Why one rank per stage (or per orbit of its rail symmetry) cannot stand for the others
    ("" when it can), and the rail symmetry where the plain representative is refused for an
    unmirrored clash. No rail symmetry under FSDP, where DP ranks' shards may differ
    (fsdp_replicas). `pieced`: the rings that would run as the representative's piece (its
    NIC up and down, shortcuts/check.py _pieces_beside_sends). Third: whether one replica per
    placement on the leaves runs instead (placement_replicas), where the replicas' pair routes
    alone differ (replica_routes_why_not; no experts, no CP or FSDP, which have their own)."""
    p = sc.parallel
    not_rep = representative_why_not(grid, sc.cluster.gpus_per_node, clashes,
                                     graph.graph["fabric"].nodes_per_leaf, pieced)
    if p.cp > 1 and not not_rep:
        not_rep = _cp_why_not(sc, grid, clashes, graph.graph["fabric"])
    by_placement = False
    if p.cp == 1 and p.fsdp is None and not not_rep:  # FSDP: no rail symmetry to fall to
        not_rep = replica_routes_why_not(graph, grid, owners, sc.cluster.gpus_per_node)
        by_placement = bool(not_rep) and not has_expert_groups(sc)
        not_rep = "" if by_placement else not_rep
    symmetry = None
    if not_rep.startswith(("link ", "pair ")) and p.cp == 1 and p.fsdp is None:
        experts = experts_why_not_symmetric(sc)
        symmetry = None if experts else rail_symmetry(graph, grid, owners, stepwise)
        not_rep = "" if symmetry is not None else not_rep + experts
    if has_expert_groups(sc) and not not_rep and not routing_is_uniform(sc) and (
            p.overlap_grad_reduce or p.overlap_param_gather):
        not_rep = ("the MoE all-to-alls of represented expert groups could share NICs with "
                   "overlapped DP communication")
    return not_rep, symmetry, by_placement


def placement_replicas(sc, grid: RankGrid, fabric,
                       by_placement: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the DP replicas whose TP rank 0 runs on every stage, per replica its twin): under FSDP
    fsdp_replicas; without it, where `by_placement` (the verdict's: pair routes differ between
    replicas), the first replica of each placement on the leaves, every replica's twin the
    first placed as it is; else replica 0 alone. Replicas placed alike are moved onto each
    other by whole nodes with every route's class kept (placements), so they run alike."""
    if sc.parallel.fsdp is not None:
        return fsdp_replicas(sc, grid, fabric)
    if not by_placement or grid.dp == 1:
        return (0,), ()
    first_placed: dict[tuple, int] = {}  # placement -> the first replica placed so
    twins = tuple(first_placed.setdefault(placement, dp)
                  for dp, placement in enumerate(placements(grid, sc.cluster, fabric)))
    if len(first_placed) == 1:
        return (0,), ()
    return tuple(sorted(first_placed.values())), twins


def fsdp_replicas(sc, grid: RankGrid, fabric) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the DP replicas whose TP rank 0 the representative run simulates on every stage, and
    per replica the first placed as it is) under FSDP ((0,), () without it): the first of each
    kind, a kind being the replica's placement on the leaves and pods (placements: a stage
    across a leaf boundary puts some replicas' pipeline pairs on a spine, t1 p3 d8 on 1-GPU
    nodes and leaves of 20, 2.0e-3 and 4.1e-3 short with replica 0 alone) and its SP-partial
    slices (sp_kinds). Replicas of one kind run alike: moved onto each other by whole nodes
    with every route's class kept, the same programs. The placements: () where all alike."""
    if sc.parallel.fsdp is None or grid.dp == 1:
        return (0,), ()
    first_of: dict[tuple, int] = {}  # (placement, shard kind) -> the first replica of it
    placed = placements(grid, sc.cluster, fabric)  # [dp]
    for dp, kind in enumerate(zip(placed, sp_kinds(sc, grid))):
        first_of.setdefault(kind, dp)
    first_placed: dict[tuple, int] = {}  # placement -> the first replica placed so
    twins = tuple(first_placed.setdefault(placement, dp) for dp, placement in enumerate(placed))
    return tuple(sorted(first_of.values())), twins if len(first_placed) > 1 else ()


def sp_kinds(sc, grid: RankGrid) -> list[tuple]:
    """Per DP replica, the kind of its SP-partial slices (all alike where no slice is summed
    over TP after the schedule). Under FSDP with sequence parallelism and sharded gradients
    each rank all-reduces over TP, after the schedule, the slice of its gradient shard that
    holds SP-partial parameters (the norms), one all-reduce per unit with such a slice
    (training/data_parallel/fsdp_reductions.py _sync_sp_shards), so replicas whose slices
    differ in size end at different times (t8 p2 d4 ZeRO-3: 5.8e-4 of the iteration,
    tests/test_fsdp_representative.py). The FSDP units are imported only under FSDP."""
    p = sc.parallel
    if not p.sequence_parallel or grid.tp == 1:
        return [()] * grid.dp
    from simsp.training.data_parallel.fsdp_units import sharding_of
    if not sharding_of(sc).shard_grads:  # the SP sums run on full gradients, alike
        return [()] * grid.dp
    return list(zip(*sp_slices_per_dp_rank(sc, grid)))  # per replica: its slices per stage


def sp_slices_per_dp_rank(sc, grid: RankGrid) -> list[list[tuple[int, ...]]]:
    """Per stage, per DP rank: the SP-partial elements of each unit in that rank's shard (the
    sizes of its _sync_sp_shards all-reduces, 0 where it runs none)."""
    import math

    from simsp.model.params import param_shapes
    from simsp.model.sharding import local_shape
    from simsp.training.data_parallel.fsdp_units import stage_units
    from simsp.training.pipeline.plan import stage_param_names, stage_plans
    shapes, d = param_shapes(sc.padded_model), grid.dp * grid.cp
    stages = []
    for _pp, plan in sorted(stage_plans(sc, RankGrid(1, grid.pp, 1, 1)).items()):
        numels = {n: math.prod(local_shape(n, shapes[n], grid.tp))
                  for n in stage_param_names(shapes, plan)}
        units = stage_units(numels, d)
        stages.append([tuple(_sp_in_window(u, i * u.shard(d), (i + 1) * u.shard(d))
                             for u in units) for i in range(d)])
    return stages


def _sp_in_window(unit, start: int, stop: int) -> int:
    """SP-partial elements of `unit` in its flat window [start, stop) (fsdp_reductions.py _sp_indices)."""
    from simsp.training.data_parallel.fsdp_units import sp_partial_ranges
    return sum(hi - lo for lo, hi in sp_partial_ranges(unit, start, stop))


def _cp_why_not(sc, grid: RankGrid, clashes: list, fabric) -> str:
    """With context parallelism every CP rank of TP rank 0 runs, in DP replica 0 and in the
    first replica of each placement on the leaves (cp_replicas; shortcuts/plan.py
    simulated_ranks). The others are images: the shift of the TP rank renames rails inside
    each node (t divides the GPUs per node), and a replica moves onto the simulated one of its
    placement by whole leaves and a renaming of rails (cp_replica_tiling). Exact where no link
    may carry traffic of a simulated owner and of a left-out one at once: then every simulated
    flow shares its links as in the full simulation, and a left-out member of a simulated
    collective arrives with its image. No experts or FSDP (whose representatives grow or
    whose shards differ)."""
    p = sc.parallel
    if sc.model.num_experts is not None or p.fsdp is not None:
        return ("context parallelism keeps TP rank 0's CP ranks only without experts and "
                "FSDP")
    if sc.cluster.gpus_per_node % grid.tp:
        return f"t = {grid.tp} does not divide the GPUs per node: the TP shift moves nodes"
    tiling = cp_replica_tiling(grid, sc.cluster.gpus_per_node)
    if tiling:
        return tiling
    simulated = set(cp_simulated_ranks(grid, cp_replicas(grid, sc.cluster, fabric)))
    for edge, owner, other in clashes:
        if _is_simulated(owner, simulated) != _is_simulated(other, simulated):
            return (f"link {edge[0]}->{edge[1]} may carry traffic of simulated and of "
                    f"represented ranks at once ({owner[0]} {owner[1][:4]}, {other[0]} "
                    f"{other[1][:4]}) under context parallelism")
    return ""


def cp_replica_tiling(grid: RankGrid, gpus_per_node: int) -> str:
    """Why DP replicas of t·c ranks are not moved onto each other by whole nodes and a renaming
    of rails inside every node ("" when they are: d = 1; or each replica fills whole nodes; or
    t·c divides the GPUs per node and a stage's d·t·c ranks fill whole nodes, so replica j
    sits in block j mod (GPUs per node / t·c) of its node on every stage)."""
    replica = grid.tp * grid.cp
    if grid.dp == 1 or replica % gpus_per_node == 0 or (
            gpus_per_node % replica == 0 and grid.dp * replica % gpus_per_node == 0):
        return ""
    return (f"a replica's t*c = {replica} ranks and a stage's d*t*c = {grid.dp * replica} do "
            f"not tile the GPUs per node ({gpus_per_node}): replicas are not moved onto each "
            f"other by whole nodes")


def cp_replicas(grid: RankGrid, cluster, fabric) -> tuple[int, ...]:
    """The DP replicas whose TP rank 0 runs all its CP ranks on every stage: the first of each
    placement on the leaves (placements). Needs cp_replica_tiling."""
    first_of: dict[tuple, int] = {}  # placement -> the first replica placed so
    for dp, placement in enumerate(placements(grid, cluster, fabric)):
        first_of.setdefault(placement, dp)
    return tuple(sorted(first_of.values()))


def placements(grid: RankGrid, cluster, fabric) -> list[tuple[tuple, ...]]:
    """Per DP replica, its placement on the leaves and pods (_leaf_pattern). Two replicas
    placed alike are moved onto each other with every route's class kept (same node, same
    leaf, same pod: cluster/topology.py _fabric_path), so their traffic runs alike; a replica
    across a leaf boundary is not placed as one inside a leaf (t8 c16: 16-node replicas on
    20-node leaves, 5 placements)."""
    return [_leaf_pattern(grid, cluster, fabric, dp) for dp in range(grid.dp)]


def _leaf_pattern(grid: RankGrid, cluster, fabric, dp: int) -> tuple[tuple, ...]:
    """Replica `dp`'s nodes on every stage, each as (its scalable unit, its pod) less those of
    the replica's first node: replica j's first node on stage s is (s·d + j)·t·c // (GPUs
    per node), and it holds max(1, t·c / GPUs per node) nodes (cp_replica_tiling)."""
    per_node, replica = cluster.gpus_per_node, grid.tp * grid.cp
    span = max(1, replica // per_node)  # nodes a replica holds on one stage

    def place(node: int) -> tuple[int, int]:
        unit = node // fabric.nodes_per_leaf
        return unit, fabric.pod_of(unit, cluster.nodes) or 0

    first = place(dp * replica // per_node)
    return tuple((unit - first[0], pod - first[1]) for unit, pod in (
        place((pp * grid.dp + dp) * replica // per_node + k)
        for pp in range(grid.pp) for k in range(span)))


def cp_simulated_ranks(grid: RankGrid, replicas: tuple[int, ...] = (0,)) -> list[int]:
    """The ranks a CP representative run simulates: TP rank 0 of each of `replicas`, every CP
    rank of every stage, ascending."""
    return sorted(grid.rank_of(0, dp, pp, cp) for dp in replicas for pp in range(grid.pp)
                  for cp in range(grid.cp))


def experts_why_not_symmetric(sc) -> str:
    """Why a model's experts could make ranks of one orbit of rail symmetry differ ("" when
    they cannot: no experts, or ETP 1, the alltoall dispatcher and uniform routing, so every
    EP member computes alike and sends every other the same bytes, its all-to-all's hops the
    direct pairs shortcuts/rail_symmetry.py owner_hops lists; docs/shortcuts.md, "Rail
    symmetry with expert all-to-alls")."""
    p = sc.parallel
    if not has_expert_groups(sc):
        return ""
    if p.etp > 1 or p.moe_token_dispatcher_type != "alltoall":
        return (f"; rail symmetry is not tried with the {p.moe_token_dispatcher_type} "
                f"dispatcher or ETP > 1 (their expert traffic is not listed hop by hop)")
    if not routing_is_uniform(sc):
        return "; rail symmetry needs uniform routing (every EP member sending alike)"
    return ""


def _aligned(a: int, b: int) -> bool:
    """a and b tile each other: one is a multiple of the other."""
    return a % b == 0 or b % a == 0


def representative_why_not(grid: RankGrid, gpus_per_node: int, clashes: list,
                           per_leaf: int = NODES_PER_LEAF, pieced: frozenset = frozenset()) -> str:
    """Why one rank per stage cannot stand for the others ("" when it can); `per_leaf`: the
    fabric's nodes per leaf (hardware/fabric.py); `pieced`: rings run as the representative's
    piece, whose one hop crosses its NIC up and down (exempt from _met_at_both_ends)."""
    t, d = grid.tp, grid.dp
    if grid.cp > 1:  # its own rules: the TP shift and the replicas' tiling (_cp_why_not)
        return ""
    if not _aligned(t * d, gpus_per_node):
        return (f"ranks per stage (t*d = {t * d}) and GPUs per node ({gpus_per_node}) do not "
                f"tile: stages share nodes unevenly")
    if not _aligned(t, gpus_per_node):
        return f"t = {t} and GPUs per node ({gpus_per_node}) do not tile: TP groups differ"
    simulated = {grid.rank_of(0, 0, pp) for pp in range(grid.pp)}
    seen = {_clash_key(*clash) for clash in clashes}
    for edge, owner, other in clashes:
        if _is_simulated(owner, simulated) == _is_simulated(other, simulated):
            continue
        image = _image_at_representative(grid, gpus_per_node, edge, owner, other, per_leaf)
        if image is None or _clash_key(*image) not in seen or not all(
                _is_simulated(o, simulated) for o in image[1:]):
            return (f"link {edge[0]}->{edge[1]} may carry traffic of simulated and of "
                    f"represented ranks at once ({owner[0]} {owner[1][:4]}, {other[0]} "
                    f"{other[1][:4]}), unlike the representative's own")
    return _met_at_both_ends(clashes, simulated, pieced)


def _met_at_both_ends(clashes: list, simulated: set[int], pieced: frozenset) -> str:
    """Why a ring the run executes with left-out members would keep a slower pace in the full
    simulation ("" where it would not): its hops meet other owners on links of two roles (a
    GPU's NIC or NVLink port, out or in), so each hop of the full simulation may be slowed at
    both its ends, at different moments, while the run puts other traffic only on the
    representative's links: there its outgoing hop meets what reaches the out-link, its incoming
    hop what reaches the in-link, and no hop both (docs/shortcuts.md, "The conditions")."""
    roles: dict[Owner, dict[tuple[str, str], Edge]] = {}  # ring -> link role -> a link
    for edge, owner, other in clashes:
        if owner == other:
            continue
        for ring in (owner, other):
            if ring[0] != "p2p" and ring[1] not in pieced and _is_simulated(
                    ring, simulated) and not simulated.issuperset(ring[1]):
                roles.setdefault(ring, {}).setdefault(_link_role(edge), edge)
    for ring, links in roles.items():
        if len(links) > 1:
            (a, b), (c, e) = list(links.values())[:2]
            return (f"link {a}->{b} and link {c}->{e}: the hops of {ring[0]} {ring[1][:4]} may "
                    f"meet other traffic at both ends, which the run puts only on the "
                    f"representative's links (a hop there meets one end's)")
    return ""


def _link_role(edge: Edge) -> tuple[str, str]:
    """The part a link plays for a hop through its GPU: out of or into it, by NVLink or NIC."""
    out = edge[0].startswith("gpu")
    far = edge[1] if out else edge[0]
    return ("out" if out else "in", "nvlink" if far.endswith("nvswitch") else "nic")


def replica_routes_why_not(graph: nx.DiGraph, grid: RankGrid, owners: list[Owner],
                           gpus_per_node: int) -> str:
    """Why some replica's pipeline pairs, tied embedding or (across nodes) TP groups cross links
    of other classes than replica 0's ("" where none does): a stage across a leaf boundary puts
    some replicas' pairs on a spine (other latencies), so they are not images of the
    representative's (t1 p3 d8 on 1-GPU nodes: stage 2 on nodes 16-23, leaves of 20)."""
    routes, per_stage = RouteSignatures(graph), grid.tp * grid.dp
    kinds = ("p2p", "embedding") + (("tp",) if grid.tp > gpus_per_node else ())
    for kind, ranks in owners:
        image = tuple(r - r % per_stage + r % grid.tp for r in ranks)  # its replica 0 image
        if kind not in kinds or image == ranks:
            continue
        mine = sorted(routes.full(h) for h in owner_hops(graph, (kind, ranks)))
        if mine != sorted(routes.full(h) for h in owner_hops(graph, (kind, image))):
            return (f"pair routes: {kind} {ranks[:4]} crosses links of other classes than its "
                    f"image {image[:4]} in replica 0 (leaf, spine: other latencies)")
    return ""


def _clash_key(edge: Edge, owner: Owner, other: Owner) -> tuple:
    """A clash, whatever the order of its owners and of their ranks."""
    return (edge, frozenset({(owner[0], _members(owner[1])), (other[0], _members(other[1]))}))


@functools.lru_cache(maxsize=65536)
def _members(ranks: tuple[int, ...]) -> frozenset[int]:
    """An owner's ranks as a set (a DP ring's hundreds of ranks meet in many clashes)."""
    return frozenset(ranks)


def _image_at_representative(grid: RankGrid, gpus_per_node: int, edge: Edge, owner: Owner,
                             other: Owner, per_leaf: int):
    """The same clash moved by whole nodes so that its link's GPU is its stage's
    representative (None where that is no move by whole nodes). A clash whose image the
    representative run meets among its own traffic is mirrored: every member of a ring meets
    at its own GPU what the representative's member meets at the same moments, so the ring,
    run step by step, keeps the full simulation's pace (tests/test_shortcut_layouts.py)."""
    per_stage = grid.tp * grid.dp
    shift = gpu_of_link(edge) % per_stage
    if shift % gpus_per_node:
        return None

    def move(rank: int) -> int:
        return rank - rank % per_stage + (rank % per_stage - shift) % per_stage

    return (_move_edge(edge, move, gpus_per_node, per_leaf), (owner[0], tuple(map(move, owner[1]))),
            (other[0], tuple(map(move, other[1]))))


def _move_edge(edge: Edge, move, gpus_per_node: int, per_leaf: int) -> Edge:
    """The link of the moved GPU that plays the same part (its NVLink port or its NIC)."""
    gpu = gpu_of_link(edge)
    moved = move(gpu)
    node, rail = divmod(moved, gpus_per_node)
    far = {"nvswitch": nvswitch_name(node), "leaf": leaf_name(node // per_leaf, rail)}

    def rename(end: str) -> str:
        if end.startswith("gpu"):
            return gpu_name(moved)
        return far["nvswitch" if end.endswith("nvswitch") else "leaf"]

    return rename(edge[0]), rename(edge[1])


def _is_simulated(owner: Owner, simulated: set[int]) -> bool:
    """The representative run executes this owner's traffic: a collective with a simulated
    member, or a point-to-point pair sent by a simulated rank."""
    kind, ranks = owner
    return ranks[0] in simulated if kind == "p2p" else not simulated.isdisjoint(_members(ranks))
