"""Where meta mode's shortcuts are exact: which links each group's traffic can share.

A collective timed in closed form (engine/collectives/ring_timing.py) moves no flows, so it is exact only
while no other transfer crosses a link its ring could be slowed on; the representative-rank
shortcut is exact only while the ranks it leaves out cannot slow the ones it simulates, and
every rank of a stage sits on the nodes as its representative does. Both are decided here
from the routes alone (cluster/topology.py hop_route over engine/collectives/ring_plan.py channel_rings),
before anything runs: a group whose links other traffic shares runs its ring step by step, which
loads its links in the fair-shared network (engine/network.py) as the full simulation does; a
group whose links only its own channels share is timed as its ring alone (engine/collectives/ring_alone.py). Sufficient conditions, not necessary ones: a shortcut refused
here is never wrong, only slower.
"""

from collections import Counter
from dataclasses import dataclass
import math

import networkx as nx

from simsp.cluster.grid import RankGrid
from simsp.cluster.topology import (NODES_PER_LEAF, SPINE, build_topology, gpu_name, hop_route,
                                   leaf_name, nodes_hosting, nvswitch_name)
from simsp.model.blocks.moe.placement import expert_grid
from simsp.model.blocks.moe.routing import uniform_routing
from simsp.engine.collectives.ring_alone import node_segment
from simsp.engine.collectives.ring_plan import COLLECTIVES, channel_rings
from simsp.hardware.constants import LinkCalibration
from simsp.model.params import param_shapes
from simsp.model.tensor import FP16, FP32
from simsp.model.sharding import local_shape
from simsp.shortcuts.cp_traffic import cp_moe_owners, cp_traffic_owners
from simsp.training.data_parallel.fsdp_units import stage_units
from simsp.training.pipeline.plan import stage_param_names, stage_plans
from simsp.shortcuts.rail_symmetry import RailSymmetry, rail_symmetry

Edge = tuple[str, str]
Owner = tuple[str, tuple[int, ...]]  # ("tp" | "dp" | "embedding" | "p2p", its ranks)


@dataclass(frozen=True)
class ShortcutVerdict:
    """Which shortcuts are exact for a layout, why, and the groups that must run stepwise."""

    representative: bool
    closed_form: bool
    templates: bool
    stepwise_groups: frozenset[tuple[int, ...]]
    reasons: tuple[tuple[str, str], ...]  # (shortcut, why used or not), in a fixed order
    # the ranks simulated and the links their hops also load where they stand for the others
    # by rail symmetry (shortcuts/rail_symmetry.py); None: one rank per stage, no images
    symmetry: RailSymmetry | None = None
    # EP groups whose all-to-alls no other owner's traffic meets: timed as alone
    alone_all_to_all: frozenset[tuple[int, ...]] = frozenset()
    # stepwise groups whose hops meet only their own group's collectives (FSDP's overlapping
    # gathers and reductions): they may run as one node's piece of one channel
    # (engine/collectives/ring_alone.py node_segment) on the shared links
    segment_groups: frozenset = frozenset()


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
    if p > 1:
        for first in range(t * d):  # activations down, gradients up (interleaved wraps)
            group = tuple(range(first, t * d * p, t * d))  # rank = tp + t·dp + t·d·pp
            ahead = group[1:] + group[:1] if interleaved else group[1:]
            pairs = set(zip(group, ahead))
            owners += [("p2p", pair) for pair in sorted(pairs | {(b, a) for a, b in pairs})]
            owners.append(("embedding", (group[0], group[-1])))
    return owners


def expert_owners(sc) -> list[Owner]:
    """The MoE layers' all-to-all groups (expert parallelism; docs/moe.md): every ordered pair
    of an EP group sends at once."""
    if sc.model.num_experts is None or sc.parallel.ep == 1:
        return []
    return [("ep", group) for group in expert_grid(sc).groups("ep")]


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


def _can_bind(edge: Edge) -> bool:
    """Leaf-spine links never bind: a leaf's uplink bundle carries as much as all its GPU
    links (cluster/topology.py _add_fabric), which every route through it also crosses."""
    return SPINE not in edge


def link_users(graph: nx.DiGraph, owners: list[Owner]) -> dict[Edge, list[Owner]]:
    """Per link that can bind: one entry per hop crossing it, naming the hop's owner."""
    users: dict[Edge, list[Owner]] = {}
    for owner in owners:
        for route in owner_routes(graph, owner):
            for edge in route:
                if _can_bind(edge):
                    users.setdefault(edge, []).append(owner)
    return users


def _gpu_of_link(edge: Edge) -> int:
    """The GPU whose NVLink port or NIC this link is (every link that can bind has one)."""
    end = edge[0] if edge[0].startswith("gpu") else edge[1]
    return int(end[3:])


@dataclass(frozen=True)
class Overlaps:
    """The flags that let one GPU's traffic kinds run at once: DP buckets during the backward
    pass (`overlap_grad_reduce`), pipeline transfers during compute and its TP collectives
    (`overlap_p2p_communication`)."""

    grad_reduce: bool
    p2p: bool


def _in_turn(edge: Edge, a: Owner, b: Owner, overlaps: Overlaps) -> bool:
    """Two owners on a link of GPU x that both include x run one after the other: x's
    collectives and blocking point-to-point calls complete for all members before x goes on,
    and training/data_parallel/finalize.py reduces gradients after x's schedule, DP before the tied
    embedding. Not so for the kinds that `overlaps` lets run at once."""
    x = _gpu_of_link(edge)
    if x not in a[1] or x not in b[1]:
        return False
    kinds = {a[0], b[0]}
    if overlaps.grad_reduce and "dp" in kinds and kinds & {"tp", "p2p", "ep"}:
        return False
    return not (overlaps.p2p and "p2p" in kinds and kinds & {"tp", "ep"})


def conflicts(users: dict[Edge, list[Owner]], overlaps: Overlaps):
    """(link, owner, other) for every two hops that may cross one link at the same time:
    two hops of one owner, or of two owners not in turn (_in_turn). Each clash once per link,
    in the order of its first appearance (an all-to-all puts dozens of one owner's hops on a
    NIC: their pairs are one clash)."""
    for edge, owners in users.items():
        if len(owners) < 2:
            continue
        hops = Counter(owners)  # distinct owners in first-appearance order, with their hops
        distinct = list(hops)
        for i, owner in enumerate(distinct):
            if hops[owner] > 1:
                yield edge, owner, owner
            for other in distinct[i + 1:]:
                if not _in_turn(edge, owner, other, overlaps):
                    yield edge, owner, other


def stepwise_groups(clashes: list) -> frozenset[tuple[int, ...]]:
    """Collective groups whose ring may share a link with another owner's hop (`clashes` from
    conflicts): their time depends on what else runs, so they run step by step. A clash of
    two hops of one owner does not count: its collectives run one at a time (one stream per
    rank), so alone on their links (engine/collectives/ring_alone.py)."""
    shared = set()
    for _edge, owner, other in clashes:
        if owner != other:
            shared.update(o[1] for o in (owner, other) if o[0] != "p2p")
    return frozenset(shared)


def _aligned(a: int, b: int) -> bool:
    """a and b tile each other: one is a multiple of the other."""
    return a % b == 0 or b % a == 0


def representative_why_not(grid: RankGrid, gpus_per_node: int, clashes: list) -> str:
    """Why one rank per stage cannot stand for the others ("" when it can)."""
    t, d = grid.tp, grid.dp
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
        image = _image_at_representative(grid, gpus_per_node, edge, owner, other)
        if image is None or _clash_key(*image) not in seen or not all(
                _is_simulated(o, simulated) for o in image[1:]):
            return (f"link {edge[0]}->{edge[1]} may carry traffic of simulated and of "
                    f"represented ranks at once ({owner[0]} {owner[1][:4]}, {other[0]} "
                    f"{other[1][:4]}), unlike the representative's own")
    return ""


def _clash_key(edge: Edge, owner: Owner, other: Owner) -> tuple:
    """A clash, whatever the order of its owners and of their ranks."""
    return (edge, frozenset({(owner[0], frozenset(owner[1])), (other[0], frozenset(other[1]))}))


def _image_at_representative(grid: RankGrid, gpus_per_node: int, edge: Edge, owner: Owner,
                             other: Owner):
    """The same clash moved by whole nodes so that its link's GPU is its stage's
    representative (None where that is no move by whole nodes). A clash whose image the
    representative run meets among its own traffic is mirrored: every member of a ring meets
    at its own GPU what the representative's member meets at the same moments, so the ring,
    run step by step, keeps the full simulation's pace (tests/test_shortcut_layouts.py)."""
    per_stage = grid.tp * grid.dp
    shift = _gpu_of_link(edge) % per_stage
    if shift % gpus_per_node:
        return None

    def move(rank: int) -> int:
        return rank - rank % per_stage + (rank % per_stage - shift) % per_stage

    return (_move_edge(edge, move, gpus_per_node), (owner[0], tuple(map(move, owner[1]))),
            (other[0], tuple(map(move, other[1]))))


def _move_edge(edge: Edge, move, gpus_per_node: int) -> Edge:
    """The link of the moved GPU that plays the same part (its NVLink port or its NIC)."""
    gpu = _gpu_of_link(edge)
    moved = move(gpu)
    node, rail = divmod(moved, gpus_per_node)
    far = {"nvswitch": nvswitch_name(node), "leaf": leaf_name(node // NODES_PER_LEAF, rail)}

    def rename(end: str) -> str:
        if end.startswith("gpu"):
            return gpu_name(moved)
        return far["nvswitch" if end.endswith("nvswitch") else "leaf"]

    return rename(edge[0]), rename(edge[1])


def _is_simulated(owner: Owner, simulated: set[int]) -> bool:
    """The representative run executes this owner's traffic: a collective with a simulated
    member, or a point-to-point pair sent by a simulated rank."""
    kind, ranks = owner
    return ranks[0] in simulated if kind == "p2p" else bool(simulated.intersection(ranks))


def _segments_why(segments: frozenset, gpus_per_node: int) -> str:
    """What the verdict says of the groups run as pieces (docs/shortcuts.md)."""
    if not segments:
        return ""
    leaves = any(len({gpu // gpus_per_node // NODES_PER_LEAF for gpu in group}) > 1
                 for group in segments)
    return (f"; {len(segments)} of them meet only their own collectives (FSDP) and run as one "
            f"node's piece of one channel" + (", each like hop at its slowest latency (their "
                                              "rings cross a leaf boundary)" if leaves else ""))


def _units_split_evenly(sc, grid: RankGrid, graph: nx.DiGraph) -> bool:
    """Every FSDP collective (a unit's padded buffer, training/data_parallel/fsdp_units.py, in 2- or 4-byte
    elements) can run as one node's piece of one channel (engine/collectives/ring_alone.py node_segment:
    nodes alike, one channel per member, equal slices)."""
    if sc.parallel.fsdp is None:
        return False
    shapes = param_shapes(sc.padded_model)
    d, calibration = grid.dp * grid.cp, LinkCalibration.from_cluster(sc.cluster)
    for rank, plan in stage_plans(sc, grid).items():
        if grid.coords(rank)[:2] != (0, 0):
            continue
        gpus = list(grid.dp_cp_group(rank))
        numels = {n: math.prod(local_shape(n, shapes[n], grid.tp))
                  for n in stage_param_names(shapes, plan)}
        if any(node_segment(graph, gpus, calibration, collective, unit.padded * elem, elem,
                            slowest_latency=True) is None for unit in stage_units(numels, d) for collective in COLLECTIVES
               for elem in (FP16, FP32)):
            return False
    return True


def closed_form_why(clashes: list, stepwise: frozenset) -> str:
    """How collectives are timed: as a whole (alone on their links, engine/collectives/ring_alone.py) or,
    sharing links with other traffic, step by step."""
    own = len({owner[1] for _edge, owner, other in clashes
               if owner == other and owner[0] != "p2p"} - stepwise)
    if not own and not stepwise:
        return "used: no collective's ring shares a link"
    alone = (f"{own} collective group(s) share links only among their own channels and are "
             f"timed as their ring alone, run once step by step" if own else "")
    if not stepwise:
        return "used: " + alone
    return (f"used where exact: {len(stepwise)} collective group(s) share links with other "
            f"traffic and run step by step, loading them; "
            + (alone + "; the others are timed as a whole" if alone else
               "the others are timed as a whole"))


def check_shortcuts(sc) -> ShortcutVerdict:
    """The exact shortcuts of a meta-mode scenario, with the reason for each."""
    p, cluster = sc.parallel, sc.cluster
    grid = RankGrid(p.tp, p.pp, p.dp, p.cp)
    graph = build_topology(cluster, nodes_hosting(range(grid.world_size), cluster.gpus_per_node))
    interleaved = p.schedule_name == "interleaved"
    owners = (traffic_owners(grid, interleaved) if p.cp == 1 else  # CP: shortcuts/cp_traffic.py
              cp_traffic_owners(grid, interleaved, p.cp_comm_type) + cp_moe_owners(sc)) \
        + expert_owners(sc)
    users = link_users(graph, owners)
    # FSDP's gathers and reductions run beside the compute's TP and p2p traffic, and beside
    # each other on the same DP group (two streams): its DP rings run step by step (docs/fsdp.md)
    overlaps = Overlaps(p.overlap_grad_reduce or p.fsdp is not None, p.overlap_p2p_communication)
    clashes = list(conflicts(users, overlaps))
    shared = stepwise_groups(clashes)
    fsdp_rings = (frozenset(ranks for kind, ranks in owners if kind == "dp" and len(ranks) > 1)
                  if p.fsdp is not None else frozenset())
    stepwise = shared | fsdp_rings
    not_rep = representative_why_not(grid, cluster.gpus_per_node, clashes)
    symmetry = None
    # not under FSDP: a DP rank's shard (its padding, its optimizer work) makes ranks of a
    # stage end at different times, so they are not images of each other
    if not_rep.startswith("link ") and p.cp == 1 and sc.model.num_experts is None and \
            p.fsdp is None:
        symmetry = rail_symmetry(graph, grid, owners, stepwise)
        not_rep = "" if symmetry is not None else not_rep
    expert_groups = sc.model.num_experts is not None and (p.ep > 1 or p.etp > 1)
    if expert_groups and not not_rep and not uniform_routing(sc) and (
            p.overlap_grad_reduce or p.overlap_param_gather):
        not_rep = ("the MoE all-to-alls of represented expert groups could share NICs with "
                   "overlapped DP communication")
    tp_groups = {ranks for kind, ranks in owners if kind == "tp"}
    ep_groups = {ranks for kind, ranks in owners if kind == "ep"}
    if not_rep:
        templates_why = "not used: needs the representative shortcut"
    elif expert_groups and (stepwise & ep_groups or not uniform_routing(sc) or p.etp > 1):
        templates_why = "not used: the MoE all-to-alls run as flows whose time may vary"
    elif sc.model.num_experts is not None and sc.model.moe_routing_imbalance > 0:
        templates_why = "not used: imbalanced routing loads each MoE layer differently"
    elif stepwise & tp_groups:
        templates_why = "not used: TP collectives share links, so a layer step's time varies"
    else:
        templates_why = "used: every layer step of a stage is alike, recorded once and replayed"
    segments = (fsdp_rings - shared) if _units_split_evenly(sc, grid, graph) else frozenset()
    closed_why = closed_form_why(clashes, stepwise) + _segments_why(segments,
                                                                    cluster.gpus_per_node)
    rep_why = ("not used: " + not_rep if not_rep else
               "used: every rank of a stage is placed and loaded as its representative" + (
                   f" up to rail symmetry ({len(symmetry.ranks)} ranks simulated): the "
                   f"{len(symmetry.loads)} hops they send also load their images' links, for "
                   f"the groups they leave out" if symmetry else ""))
    return ShortcutVerdict(representative=not not_rep, closed_form=True,
                           templates=templates_why.startswith("used"),
                           stepwise_groups=stepwise, symmetry=symmetry,
                           segment_groups=segments,
                           reasons=(("representative", rep_why), ("closed_form", closed_why),
                                    ("templates", templates_why)),
                           alone_all_to_all=frozenset(ep_groups - stepwise))
