"""The shortcut check's binding links in closed form (shortcuts/route_ends.py, docs/shortcuts.md
"Cost of the check"): a hop's links that can bind, named from its GPUs' own four, equal to its
whole route (cluster/topology.py hop_route) filtered by can_bind, for every ordered pair and
relay on leaf boundaries, a core tier and a graph of some nodes; and the check's link users equal
to the listing it replaced (every hop's route walked, its links that can bind counted in order)."""

from collections import Counter
from itertools import chain

import pytest

from simsp.cluster.grid import RankGrid
from simsp.cluster.topology import build_topology, hop_route
from simsp.hardware.fabric import Fabric
from simsp.scenario.loading import load_scenario
from simsp.shortcuts.cp_traffic import cp_traffic_owners
from simsp.shortcuts.route_ends import hop_ends
from simsp.shortcuts.traffic import can_bind, link_users, owner_routes, traffic_owners

TWO_TIER = Fabric(nodes_per_leaf=2)
THREE_TIER = Fabric(nodes_per_leaf=1, two_tier_max_units=2, units_per_pod=2)


def _graph(gpus_per_node: int, nodes: int, fabric: Fabric, built=None):
    sc = load_scenario(None, {("cluster", "gpus_per_node"): gpus_per_node,
                              ("cluster", "nodes"): nodes})
    return build_topology(sc.cluster, built, fabric)


def former_link_users(graph, owners) -> dict:
    """The oracle: every owner's routes walked hop by hop (all-to-alls' too, pair by pair),
    its links that can bind counted in the order first crossed."""
    users: dict = {}
    for owner in owners:
        for edge, hops in Counter(chain.from_iterable(owner_routes(graph, owner))).items():
            if can_bind(edge):
                users.setdefault(edge, {})[owner] = users.get(edge, {}).get(owner, 0) + hops
    return users


@pytest.mark.parametrize("gpus_per_node, nodes, fabric, built", [
    (4, 5, TWO_TIER, None),  # three leaves, the last of one node
    (2, 8, THREE_TIER, None),  # four pods
    (4, 6, TWO_TIER, [1, 2, 5]),  # some nodes built
])
def test_every_hop_is_its_route_filtered(gpus_per_node, nodes, fabric, built):
    """Every ordered pair, directly and relayed through every GPU of the sender's node (NCCL
    PXN, as ring channels relay), to itself included: the route's binding links in order."""
    graph = _graph(gpus_per_node, nodes, fabric, built)
    gpus = sorted(int(v[3:]) for v in graph if v.startswith("gpu"))
    ends = hop_ends(graph)
    for src in gpus:
        node = src - src % gpus_per_node
        for dst in gpus:
            for via in (None, *range(node, node + gpus_per_node)):
                expected = tuple(e for e in hop_route(graph, src, dst, via) if can_bind(e))
                assert ends.hop(src, dst, via) == expected, (src, dst, via)


@pytest.mark.parametrize("tp, pp, dp, cp, interleaved", [
    (2, 2, 2, 2, True),  # CP: TP, dp_cp rings across nodes, CP all-to-alls, pipeline pairs
    (1, 2, 4, 2, False),  # CP groups and DP rings with two members per node (PXN relays)
])
def test_cp_link_users_are_the_former_listing(tp, pp, dp, cp, interleaved):
    """The CP layout's owners on 4-GPU nodes, two per leaf: per link the same owners, in the
    same order, with the same hop counts."""
    grid = RankGrid(tp, pp, dp, cp)
    graph = _graph(4, grid.world_size // 4, TWO_TIER)
    owners = cp_traffic_owners(grid, interleaved, "p2p")
    assert list(link_users(graph, owners).items()) == list(
        former_link_users(graph, owners).items())


def test_link_users_with_relays_are_the_former_listing():
    """Without CP, TP 2 and DP rings of two members per node over three-tier pods (their
    node-crossing hops relayed, PXN): per link the same owners, order and hop counts."""
    grid = RankGrid(2, 2, 4, 1)
    graph = _graph(2, grid.world_size // 2, THREE_TIER)
    owners = traffic_owners(grid, True) + [("dp", (0, 1, 4, 5, 14, 15))]
    assert list(link_users(graph, owners).items()) == list(
        former_link_users(graph, owners).items())
