"""The shortcut check's work made to grow less with the world (docs/shortcuts.md, "Cost of the
check"), each piece equal to what it replaced, kept here as the oracle: large groups' ranks
hashed once (shortcuts/ranks.py), route signatures read per link (rail_symmetry.py
RouteSignatures) and link representatives worked out per GPU (quotient.py
link_representatives), on layouts that stress them: a leaf boundary inside a stage, a core tier,
a graph of some nodes only, expert groups, every group hashed once."""

import pickle

import pytest

from simsp.cluster.grid import RankGrid
from simsp.cluster.topology import build_topology, hop_route
from simsp.hardware.fabric import Fabric
from simsp.scenario.config import Cluster
from simsp.shortcuts import check, quotient, rail_symmetry, ranks
from simsp.shortcuts.rail_symmetry import RouteSignatures, StageAxes, owner_hops
from simsp.shortcuts.ranks import Ranks, hashed_once
from simsp.shortcuts.traffic import can_bind, gpu_of_link, traffic_owners
from simsp.training.driver.iteration import Shortcuts
from tests.test_shortcut_ep_quotient import moe_layout
from tests.test_shortcut_layouts import layout_scenario

LEAF_BOUNDARY = Fabric(nodes_per_leaf=3)  # 8 nodes: leaves of 3, 3 and 2 nodes
CORE_TIER = Fabric(nodes_per_leaf=1, two_tier_max_units=2, units_per_pod=2)  # pods of 2 nodes


def old_link_representatives(graph, to_origin, moved):
    """quotient.link_representatives before (39d160a): every link of the graph scanned, the
    orbit worked out per link."""
    by_role: dict[int, dict] = {}
    for edge in graph.edges:
        if can_bind(edge):
            by_role.setdefault(gpu_of_link(edge), {})[quotient._role(edge)] = edge
    return {edge: by_role[moved(gpu, to_origin(gpu))][role]
            for gpu, roles in by_role.items() for role, edge in roles.items()}


def old_full(graph, hop):
    """RouteSignatures.full before (39d160a): each link's kind, speed, latency off the graph."""
    return tuple((graph.edges[e]["kind"], graph.edges[e]["bandwidth_Bps"],
                  graph.edges[e]["latency_s"]) for e in hop_route(graph, *hop))


def old_binding(graph, hop):
    """RouteSignatures.binding before (39d160a)."""
    return tuple((graph.edges[e]["kind"], graph.edges[e]["bandwidth_Bps"])
                 for e in hop_route(graph, *hop) if can_bind(e))


def test_ranks_are_their_tuple():
    """Equal to the tuple, the same hash (a plain tuple finds it in a dict and back), the same
    answers to `in`, slices and repr of a plain tuple (refusals name them unchanged), and
    pickled whole."""
    group = tuple(range(3, 60, 3))
    held = Ranks(group)
    assert held == group and hash(held) == hash(group) and hash(held) == hash(group)
    assert {group: "ring"}[held] == "ring" and {held: "ring"}[group] == "ring"
    assert [r in held for r in range(64)] == [r in group for r in range(64)]
    assert type(held[:4]) is tuple and held[:4] == (3, 6, 9, 12)
    assert repr(held) == repr(group) and f"{held[:2]}" == "(3, 6)"
    assert pickle.loads(pickle.dumps(held)) == group


def test_only_large_groups_are_hashed_once():
    """Groups of MIN_RANKS ranks or more become Ranks, the rest stay tuples; kinds and order
    kept."""
    owners = [("tp", tuple(range(8))), ("dp", tuple(range(0, 64, 4))), ("p2p", (0, 8))]
    held = hashed_once(owners)
    assert held == owners
    assert [type(r) for _, r in held] == [tuple, Ranks, tuple]


@pytest.mark.parametrize("fabric, hosted, tp, per_stage, steps", [
    (Fabric(), range(8), 2, 16, (1, 1, 1)),
    (LEAF_BOUNDARY, range(8), 1, 32, (1, 2, 2)),  # stages across a leaf boundary
    (LEAF_BOUNDARY, range(8), 4, 64, (2, 1, 1)),  # one stage over three leaves, uneven
    (CORE_TIER, range(8), 2, 32, (1, 1, 2)),  # stages across pods
    (CORE_TIER, range(2, 6), 1, 16, (1, 2, 1)),  # a graph of nodes 2-5 only
])
def test_link_representatives_equal_the_link_scan(fabric, hosted, tp, per_stage, steps):
    """Per GPU (its orbit once for its four links) equals scanning every link of the graph,
    on 8-GPU nodes: leaf boundaries, a core tier, a graph hosting some nodes only."""
    graph = build_topology(Cluster(nodes=8), list(hosted), fabric)
    axes = StageAxes(per_stage, min(per_stage, 8), tp)

    def to_origin(rank):
        return axes.to_origin(rank, steps)

    mine = quotient.link_representatives(graph, to_origin, axes.moved)
    oracle = old_link_representatives(graph, to_origin, axes.moved)
    assert mine == oracle
    assert len(mine) == 4 * 8 * len(hosted)  # NVLink port and NIC, each way, every GPU
    origins = [gpu for gpu in range(8 * 8) if gpu // 8 in hosted and not any(to_origin(gpu))]
    assert set(mine.values()) == {edge for edge in mine if gpu_of_link(edge) in origins}


@pytest.mark.parametrize("fabric", [LEAF_BOUNDARY, CORE_TIER])
def test_route_signatures_equal_the_graph_reads(fabric):
    """Every hop of every owner of t2 p4 d8 on 8 nodes (TP, DP rings with their PXN relays,
    pipeline pairs, embedding groups), across leaf boundaries or pods: read per link, the
    signatures are the graph's, and a ring's hops are owner_hops'."""
    graph = build_topology(Cluster(nodes=8), None, fabric)
    routes = RouteSignatures(graph)
    owners = traffic_owners(RankGrid(2, 4, 8, 1), interleaved=True)
    for owner in owners:
        assert routes.hops(owner) == owner_hops(graph, owner)
        assert routes.sorted_hops(owner) == sorted(owner_hops(graph, owner))
        for hop in owner_hops(graph, owner):
            assert routes.full(hop) == old_full(graph, hop)
            assert routes.binding(hop) == old_binding(graph, hop)
    # the longest direct routes climb to a spine (GPU, leaf, spine, leaf, GPU) or through the
    # core (GPU, leaf, pod spine, core, pod spine, leaf, GPU); relayed hops (PXN) there too
    hops = [h for o in owners for h in routes.hops(o)]
    assert max(len(routes.full(h)) for h in hops if h[2] is None) == (
        6 if fabric is CORE_TIER else 4)
    assert any(h[2] is not None for h in hops)


def _verdict(shortcuts: Shortcuts) -> tuple:
    """Everything the check decides: methods, reasons, replicas and twins, and under rail
    symmetry its ranks, image loads, link representatives, ring pieces and pair orbits."""
    symmetry = shortcuts.symmetry
    reduced = () if symmetry is None else (symmetry.ranks, symmetry.loads, symmetry.link_reps,
                                           symmetry.pieces, symmetry.pair_orbits)
    return (shortcuts.flags(), shortcuts.methods, shortcuts.reasons, shortcuts.replicas,
            shortcuts.twins, reduced)


def _old_check(sc, monkeypatch) -> Shortcuts:
    """The check with plain tuples and the link scan, as before (39d160a)."""
    with monkeypatch.context() as patched:
        patched.setattr(check, "hashed_once", lambda owners: owners)
        patched.setattr(quotient, "link_representatives", old_link_representatives)
        return Shortcuts.for_scale(sc)


@pytest.mark.parametrize("layout", ["gpt3-like", "gpt3-core", "experts", "experts-leaves"])
def test_the_verdict_equals_the_plain_tuples(layout, monkeypatch):
    """The whole check with every group of 2 ranks or more hashed once (MIN_RANKS lowered) and
    links mapped per GPU equals the plain tuples' and the link scan's: gpt3-175b-h100's layout
    small (t4 SP p4 interleaved, d4, the quotient by rail symmetry), the same on a core tier,
    and EP groups under the quotient (d = EP 8, 2-GPU nodes, ZB-H1) within one leaf and across
    a leaf boundary."""
    from simsp.hardware import cluster_hardware

    if layout == "gpt3-like":
        sc = layout_scenario(8, 4, 4, 4, True, True, True, 8, system="dgx-h100")
    elif layout == "gpt3-core":  # 8 nodes, pods of 2: a stage per pod
        monkeypatch.setattr(cluster_hardware, "DEFAULT", CORE_TIER)
        sc = layout_scenario(8, 4, 4, 4, True, True, True, 8)
    else:
        if layout == "experts-leaves":  # stage 0 on nodes 0-3 over leaves {0, 1}, {2, 3}
            monkeypatch.setattr(cluster_hardware, "DEFAULT", Fabric(nodes_per_leaf=2))
        sc = moe_layout("zb-h1", 2, 1, 8, 8)
    oracle = _old_check(sc, monkeypatch)
    monkeypatch.setattr(ranks, "MIN_RANKS", 2)
    mine = Shortcuts.for_scale(sc)
    assert _verdict(mine) == _verdict(oracle)
    assert mine.representative and mine.symmetry.link_reps and mine.symmetry.pieces


def old_symmetry_breach(graph, shift, owners, stepwise):
    """rail_symmetry.symmetry_breach before (39d160a): every owner's hops listed, sorted and
    their routes read off the graph per shift; a pair's hops compared as a ring's are."""
    routes = RouteSignatures(graph)  # its channel keys, unchanged
    by_key = {rail_symmetry._owner_key(o): o for o in owners}
    image_hop = rail_symmetry._image_hop
    for owner in owners:
        image = by_key.get(rail_symmetry._owner_key((owner[0], tuple(shift[r] for r in owner[1]))))
        named = f"{owner[0]} {owner[1][:4]}"
        if image is None or (owner[1] in stepwise) != (image[1] in stepwise):
            return f"maps {named} onto no owner of its kind and timing"
        hops = owner_hops(graph, owner)
        if sorted(image_hop(shift, h) for h in hops) != sorted(owner_hops(graph, image)):
            return f"maps the hops of {named} onto other hops than its image's"
        if owner[0] in ("p2p", "ep"):
            if any(old_full(graph, h) != old_full(graph, image_hop(shift, h)) for h in hops):
                return (f"moves {named} onto a route of another class (leaf, spine, core: "
                        f"other link latencies)")
            if owner[0] == "p2p":
                continue
            owner, image = rail_symmetry.as_ring(owner), rail_symmetry.as_ring(image)
            hops = owner_hops(graph, owner)
            if sorted(image_hop(shift, h) for h in hops) != sorted(owner_hops(graph, image)):
                return f"maps the token-count ring of {named} onto other hops than its image's"
        mine, theirs = routes.channel_keys(owner), routes.channel_keys(image)
        if any(old_binding(graph, h) != old_binding(graph, image_hop(shift, h))
               or mine[h] != theirs[image_hop(shift, h)] for h in hops):
            return f"moves a hop of {named} into a channel of other hop routes"
    return ""


@pytest.mark.parametrize("fabric, d", [(Fabric(nodes_per_leaf=4), 6),  # pairs change class
                                       (Fabric(nodes_per_leaf=2), 8),  # rings cross a spine
                                       (CORE_TIER, 4)])  # pairs and rings through the core
def test_symmetry_breach_equals_the_former(fabric, d, monkeypatch):
    """Every shift along every axis of t2 p2 (interleaved) stages of d·2 ranks on 4-GPU nodes,
    with expert groups of 4: the refusal (or none) is the former function's, word for word,
    with plain tuples and with every group of two ranks or more hashed once."""
    monkeypatch.setattr(ranks, "MIN_RANKS", 2)
    cluster = Cluster(nodes=2 * 2 * d // 4, gpus_per_node=4)
    graph = build_topology(cluster, None, fabric)
    grid = RankGrid(2, 2, d, 1)
    owners = traffic_owners(grid, interleaved=True) + [
        ("ep", tuple(range(base, base + 8, 2))) for base in range(0, grid.world_size, 8)]
    axes = StageAxes(2 * d, 4, 2)
    stepwise = frozenset(ranks for kind, ranks in owners if kind == "dp")
    verdicts = set()
    for axis, size in enumerate(axes.sizes):
        for step in range(1, size):
            shift = axes.shift(grid.world_size, tuple(step if i == axis else 0 for i in range(3)))
            oracle = old_symmetry_breach(graph, shift, owners, stepwise)
            for held in (owners, hashed_once(owners)):
                assert rail_symmetry.symmetry_breach(graph, shift, held, stepwise) == oracle
            verdicts.add(" ".join(oracle.split(" ")[:2]))
    assert "" in verdicts and len(verdicts) > 1  # some shifts are symmetries, some refused
    # 3 nodes a stage on leaves of 4: a node shift moves a pair from one leaf onto the spine
    assert ("moves p2p" in verdicts) == (fabric.nodes_per_leaf == 4)
