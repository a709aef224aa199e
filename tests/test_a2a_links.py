"""The shortcut check's all-to-all links in closed form (shortcuts/a2a_links.py, docs/shortcuts.md
"The traffic and its links"): per member, not per pair, equal to the pair-by-pair listing it
replaced (every ordered pair routed, its links that can bind walked in order), link order and hop
counts included; on a DeepSeek-V3 layout scaled down the verdict is equal to the full
simulation."""

from collections import Counter

import pytest

from simsp.cluster.grid import RankGrid
from simsp.cluster.topology import build_topology, hop_route, nodes_hosting
from simsp.hardware.fabric import Fabric
from simsp.scenario.loading import load_scenario
from simsp.shortcuts.a2a_links import all_to_all_links
from simsp.shortcuts.check import Shortcuts
from simsp.shortcuts.clashes import Overlaps, conflicts
from simsp.shortcuts.traffic import (can_bind, expert_owners, link_users, owner_routes,
                                     traffic_owners)
from test_shortcut_ep_quotient import assert_equal_to_full, moe_layout


def pair_listing(graph, ranks: tuple[int, ...]) -> list[tuple[tuple[str, str], int]]:
    """The oracle: every ordered pair's direct route, its links that can bind counted in the
    order the pairs (a, then b) first cross them."""
    hops: dict[tuple[str, str], int] = {}
    for a in ranks:
        for b in ranks:
            for edge in hop_route(graph, a, b) if a != b else ():
                if can_bind(edge):
                    hops[edge] = hops.get(edge, 0) + 1
    return list(hops.items())


def _graph(gpus_per_node: int, nodes: int, fabric: Fabric):
    sc = load_scenario(None, {("cluster", "gpus_per_node"): gpus_per_node,
                              ("cluster", "nodes"): nodes})
    return build_topology(sc.cluster, nodes_hosting(range(gpus_per_node * nodes),
                                                    gpus_per_node), fabric)


TWO_TIER = Fabric(nodes_per_leaf=2)
THREE_TIER = Fabric(nodes_per_leaf=1, two_tier_max_units=2, units_per_pod=2)


@pytest.mark.parametrize("gpus_per_node, nodes, fabric, ranks", [
    (4, 4, TWO_TIER, tuple(range(16))),  # EP 16: four nodes on two leaves
    (4, 4, TWO_TIER, (1, 3, 5, 7, 9, 11)),  # stride 2 (t 2): two rails of three nodes
    (2, 8, THREE_TIER, (0, 1, 4, 5, 14, 15)),  # across pods
    (8, 2, TWO_TIER, (9, 0, 8, 3)),  # listed out of order, a node holding one member first
    (4, 3, TWO_TIER, (0, 4, 8)),  # one member per node: NICs only
    (8, 1, TWO_TIER, (2, 5, 6)),  # one node: NVLink ports only
])
def test_the_links_are_the_pair_listings(gpus_per_node, nodes, fabric, ranks):
    """Hop counts and first-crossing order equal to the pair-by-pair listing: each member's
    port or NIC up carries one hop per peer on (or off) its node, and down likewise."""
    graph = _graph(gpus_per_node, nodes, fabric)
    assert all_to_all_links(graph, ranks) == pair_listing(graph, ranks)


def test_a_member_counts_its_peers_on_and_off_its_node():
    """EP 6 over nodes of 4 GPUs holding 4 and 2 members: GPU 0's port up carries its 3
    node-mates, its NIC up its 2 peers away; GPU 4's NIC down the 4 of node 0 (worked by hand)."""
    links = dict(all_to_all_links(_graph(4, 2, TWO_TIER), (0, 1, 2, 3, 4, 5)))
    assert links[("gpu0", "node0/nvswitch")] == 3
    assert links[("gpu0", "leaf0/rail0")] == 2
    assert links[("leaf0/rail0", "gpu4")] == 4
    assert links[("node1/nvswitch", "gpu4")] == 1
    assert sum(links.values()) == 2 * 6 * 5  # every pair's two links


def deepseek_small(schedule: str = "1f1b"):
    """DeepSeek-V3's structure scaled down: p 2, d 8 > EP 4, each EP group across two 2-GPU
    nodes, expert data parallelism of 2, overlapped DP reduction (moe_layout); 4 micro-batches
    per replica under DualPipe (its least), else 2."""
    return moe_layout(schedule, 2, 1, 8, 4, global_batch_size=(32 if schedule == "dualpipe"
                                                               else 16))


def test_the_check_sees_the_pair_listings_clashes():
    """On the scaled-down DeepSeek-V3 the clashes (in order) from per-member counts are those
    of one entry per hop: the verdict cannot move. Dropping one member's NIC down from its EP
    group's links loses a clash: each entry counts."""
    sc = deepseek_small()
    grid = RankGrid(1, 2, 8, 1)
    graph = build_topology(sc.cluster, nodes_hosting(range(16), 2))
    owners = traffic_owners(grid, False) + expert_owners(sc)
    per_hop = {}
    for owner in owners:
        pairs = (pair_listing(graph, owner[1]) if owner[0] == "ep" else
                 Counter(edge for route in owner_routes(graph, owner) for edge in route
                         if can_bind(edge)).items())
        for edge, hops in pairs:
            per_hop.setdefault(edge, []).extend([owner] * hops)
    overlaps = Overlaps(grad_reduce=True, p2p=False)
    users = link_users(graph, owners)
    assert list(users) == list(per_hop)
    clashes = list(conflicts(users, overlaps))
    assert clashes == list(conflicts(per_hop, overlaps))
    ep = next(owner for owner in owners if owner[0] == "ep")
    down = ("leaf0/rail0", "gpu2")  # GPU 2's NIC down: GPU 0's hop to it, GPU 1's too
    assert users[down][ep] == 2
    del users[down][ep]
    assert len(list(conflicts(users, overlaps))) < len(clashes)


@pytest.mark.parametrize("schedule", ["1f1b", "dualpipe"])
def test_scaled_down_deepseek_equals_the_full_simulation(schedule):
    """The verdict from the per-member links, run: the quotient by rail symmetry with its EP
    groups (ranks 0 and 2 of each stage: node shifts by one would move a leaf-bound EP pair),
    iteration time and every stage's exposure equal to the full simulation (Shortcuts()) to
    1e-9."""
    sc = deepseek_small(schedule)
    fast = Shortcuts.for_scale(sc)
    assert fast.symmetry.ranks == (0, 2, 8, 10) and (0, 1, 2, 3) in fast.symmetry.pieces
    assert_equal_to_full(sc, fast)
