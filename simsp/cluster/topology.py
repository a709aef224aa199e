"""Cluster topology as a networkx DiGraph: DGX A100 nodes on a rail-optimised leaf/spine fat tree.

Inside a node every GPU has one NVLink edge to and from the node's NVSwitch fabric (modelled as
one switch vertex). Between nodes GPU j of every node owns one HDR NIC cabled to the leaf switch
of rail j (rail-optimised, as in the DGX SuperPOD); leaves meet at a non-blocking spine.
Edges carry `bandwidth_Bps` (bytes/s, per direction), `latency_s` and `kind` ("nvlink" | "ib").
"""

import networkx as nx

from simsp.config import Cluster
from simsp.units import GB

# DGX SuperPOD scalable unit: the leaf switch of each rail serves 20 nodes.
NODES_PER_LEAF = 20
SPINE = "spine"


def gpu_name(index: int) -> str:
    """Vertex name of the GPU with global index `index`: 'gpu0', 'gpu1', ..."""
    return f"gpu{index}"


def nvswitch_name(node: int) -> str:
    """Vertex name of the NVSwitch fabric of DGX node `node`."""
    return f"node{node}/nvswitch"


def leaf_name(leaf_group: int, rail: int) -> str:
    """Vertex name of the leaf switch of `rail` in scalable unit `leaf_group`."""
    return f"leaf{leaf_group}/rail{rail}"


def _link(graph: nx.DiGraph, a: str, b: str, bandwidth_Bps: float, latency_s: float,
          kind: str) -> None:
    """Add a full-duplex link: one directed edge each way with the same speed and latency."""
    for u, v in ((a, b), (b, a)):
        graph.add_edge(u, v, bandwidth_Bps=bandwidth_Bps, latency_s=latency_s, kind=kind)


def _add_node(graph: nx.DiGraph, cluster: Cluster, node: int) -> None:
    """One DGX node: its GPUs, each linked to the node's NVSwitch fabric."""
    nvlink_Bps = cluster.nvlink_bandwidth_GBps * GB
    # cluster.nvlink_latency_us is per hop *through* the switch: half on each GPU<->switch edge.
    half_hop_s = cluster.nvlink_latency_us * 1e-6 / 2
    for local in range(cluster.gpus_per_node):
        gpu = gpu_name(node * cluster.gpus_per_node + local)
        graph.add_node(gpu, kind="gpu", node=node, local=local)
        _link(graph, gpu, nvswitch_name(node), nvlink_Bps, half_hop_s, "nvlink")


def _add_fabric(graph: nx.DiGraph, cluster: Cluster) -> None:
    """Rail-optimised leaves (one per rail per scalable unit) under one non-blocking spine."""
    ib_Bps = cluster.ib_bandwidth_GBps * GB
    ib_s = cluster.ib_latency_us * 1e-6
    downlinks: dict[str, int] = {}
    for node in range(cluster.nodes):
        for rail in range(cluster.gpus_per_node):
            leaf = leaf_name(node // NODES_PER_LEAF, rail)
            _link(graph, gpu_name(node * cluster.gpus_per_node + rail), leaf, ib_Bps, ib_s, "ib")
            downlinks[leaf] = downlinks.get(leaf, 0) + 1
    # Full bisection: a leaf's bundle of uplinks carries as much as all its downlinks.
    for leaf, count in downlinks.items():
        _link(graph, leaf, SPINE, count * ib_Bps, ib_s, "ib")


def build_topology(cluster: Cluster) -> nx.DiGraph:
    """The whole cluster: `cluster.nodes` DGX nodes of `cluster.gpus_per_node` GPUs each."""
    graph = nx.DiGraph(num_gpus=cluster.num_gpus, gpus_per_node=cluster.gpus_per_node,
                       nodes=cluster.nodes, route_cache={})
    for node in range(cluster.nodes):
        graph.add_node(nvswitch_name(node), kind="switch")
        _add_node(graph, cluster, node)
    _add_fabric(graph, cluster)
    return graph


def route(graph: nx.DiGraph, src: str, dst: str) -> list[tuple[str, str]]:
    """Fewest-hop (then lowest-latency) path from GPU `src` to GPU `dst`; GPUs never forward.

    Deterministic (networkx breaks ties by insertion order) and cached on the graph.
    """
    cache = graph.graph.setdefault("route_cache", {})
    if (src, dst) not in cache:
        cache[(src, dst)] = _shortest_route(graph, src, dst)
    return cache[(src, dst)]


def _shortest_route(graph: nx.DiGraph, src: str, dst: str) -> list[tuple[str, str]]:
    """Dijkstra over a view where only `src` and `dst` may be GPU vertices.

    Edge weight 1 + latency_s: hop count decides, latency (microseconds) only breaks ties.
    """
    if src == dst:
        return []

    def transit(vertex: str) -> bool:
        """Switches carry traffic through; a GPU only as the route's own end."""
        return graph.nodes[vertex].get("kind") != "gpu" or vertex in (src, dst)

    view = nx.subgraph_view(graph, filter_node=transit)
    path = nx.shortest_path(view, src, dst, weight=lambda u, v, data: 1.0 + data["latency_s"])
    return list(zip(path[:-1], path[1:]))


def route_latency_s(graph: nx.DiGraph, edges: list[tuple[str, str]]) -> float:
    """Sum of the per-edge latencies along a route."""
    return sum(graph.edges[edge]["latency_s"] for edge in edges)
