"""Topology: DGX nodes on NVSwitch, rail-optimised IB leaves under a spine, routes between GPUs."""

import pytest

from simsp.cluster.topology import (NODES_PER_LEAF, SPINE, build_topology, gpu_name, leaf_name,
                                    nvswitch_name, route, route_latency_s)
from simsp.scenario.config import Cluster

TWO_NODES = Cluster(nodes=2)


def kinds(graph, edges):
    return [graph.edges[e]["kind"] for e in edges]


def test_every_gpu_exists_with_its_node_and_local_index():
    graph = build_topology(TWO_NODES)
    gpus = [n for n, d in graph.nodes(data=True) if d.get("kind") == "gpu"]
    assert gpus == [gpu_name(i) for i in range(16)]
    assert graph.nodes["gpu11"]["node"] == 1 and graph.nodes["gpu11"]["local"] == 3


def test_edges_carry_configured_speeds_in_bytes_per_second():
    cluster = Cluster(nodes=2, nvlink_bandwidth_GBps=150.0, ib_bandwidth_GBps=12.5,
                      nvlink_latency_us=3.0, ib_latency_us=7.0)
    graph = build_topology(cluster)
    nvlink = graph.edges["gpu3", nvswitch_name(0)]
    ib = graph.edges["gpu3", leaf_name(0, 3)]
    assert (nvlink["bandwidth_Bps"], nvlink["kind"]) == (150e9, "nvlink")
    assert nvlink["latency_s"] == pytest.approx(1.5e-6)  # half of a switch hop on each side
    assert (ib["bandwidth_Bps"], ib["latency_s"], ib["kind"]) == (12.5e9, 7e-6, "ib")


def test_every_link_is_full_duplex():
    graph = build_topology(TWO_NODES)
    for u, v, data in graph.edges(data=True):
        assert graph.edges[v, u] == data


def test_route_inside_a_node_crosses_the_nvswitch_only():
    graph = build_topology(TWO_NODES)
    edges = route(graph, "gpu0", "gpu5")
    assert edges == [("gpu0", nvswitch_name(0)), (nvswitch_name(0), "gpu5")]
    assert route_latency_s(graph, edges) == pytest.approx(TWO_NODES.nvlink_latency_us * 1e-6)


def test_route_between_nodes_on_one_rail_stays_on_its_leaf():
    graph = build_topology(TWO_NODES)
    edges = route(graph, "gpu2", "gpu10")  # local GPU 2 of node 0 -> local GPU 2 of node 1
    assert edges == [("gpu2", leaf_name(0, 2)), (leaf_name(0, 2), "gpu10")]
    assert route_latency_s(graph, edges) == pytest.approx(2 * TWO_NODES.ib_latency_us * 1e-6)


def test_route_between_rails_goes_through_the_spine_never_through_a_gpu():
    graph = build_topology(TWO_NODES)
    edges = route(graph, "gpu7", "gpu8")
    assert [v for _, v in edges] == [leaf_name(0, 7), SPINE, leaf_name(0, 0), "gpu8"]
    assert kinds(graph, edges) == ["ib"] * 4


def test_route_is_cached_and_deterministic():
    graph = build_topology(TWO_NODES)
    first = route(graph, "gpu1", "gpu14")
    assert route(graph, "gpu1", "gpu14") is first
    assert route(build_topology(TWO_NODES), "gpu1", "gpu14") == first
    assert route(graph, "gpu4", "gpu4") == []


def test_leaves_serve_a_scalable_unit_and_uplinks_match_downlinks():
    cluster = Cluster(nodes=NODES_PER_LEAF + 1)
    graph = build_topology(cluster)
    ib = cluster.ib_bandwidth_GBps * 1e9
    assert graph.edges[leaf_name(0, 0), SPINE]["bandwidth_Bps"] == NODES_PER_LEAF * ib
    assert graph.edges[leaf_name(1, 0), SPINE]["bandwidth_Bps"] == 1 * ib
    last_node_gpu = gpu_name(NODES_PER_LEAF * 8 + 5)
    assert route(graph, gpu_name(5), last_node_gpu)[1] == (leaf_name(0, 5), SPINE)


def _networkx_route(graph, src, dst):
    """Oracle: fewest hops (then latency) over a view where only src and dst may be GPUs."""
    import networkx as nx

    def transit(vertex):
        return graph.nodes[vertex].get("kind") != "gpu" or vertex in (src, dst)

    view = nx.subgraph_view(graph, filter_node=transit)
    path = nx.shortest_path(view, src, dst, weight=lambda u, v, d: 1.0 + d["latency_s"])
    return list(zip(path[:-1], path[1:]))


def test_structural_routes_equal_networkx_shortest_paths():
    graph = build_topology(Cluster(nodes=NODES_PER_LEAF + 2))
    gpus = [0, 1, 7, 8, 15, NODES_PER_LEAF * 8 - 1, NODES_PER_LEAF * 8, NODES_PER_LEAF * 8 + 9]
    for src in gpus:
        for dst in gpus:
            if src != dst:
                assert route(graph, gpu_name(src), gpu_name(dst)) == _networkx_route(
                    graph, gpu_name(src), gpu_name(dst))


def test_only_the_nodes_hosting_ranks_are_built():
    cluster = Cluster(nodes=100_000)
    graph = build_topology(cluster, nodes=[0, 21])
    assert sum(1 for _, d in graph.nodes(data=True) if d.get("kind") == "gpu") == 16
    full = build_topology(Cluster(nodes=NODES_PER_LEAF * 2))
    assert graph.edges[leaf_name(1, 3), SPINE] == full.edges[leaf_name(1, 3), SPINE]
    assert route(graph, "gpu0", gpu_name(21 * 8)) == route(full, "gpu0", gpu_name(21 * 8))
