"""Cluster topology as a networkx DiGraph: DGX A100 nodes on a rail-optimised leaf/spine fat tree.

Inside a node every GPU has one NVLink edge to and from the node's NVSwitch fabric (modelled as
one switch vertex). Between nodes GPU j of every node owns one HDR NIC cabled to the leaf switch
of rail j (rail-optimised, as in the DGX SuperPOD); leaves meet at a non-blocking spine.
Edges carry `bandwidth_Bps` (bytes/s, per direction), `latency_s` and `kind` ("nvlink" | "ib").
"""

from collections.abc import Iterable
import functools

import networkx as nx

from simsp.hardware.constants import NODES_PER_LEAF
from simsp.scenario.config import Cluster
from simsp.units import GB

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


def _add_fabric(graph: nx.DiGraph, cluster: Cluster, nodes: list[int]) -> None:
    """Rail-optimised leaves (one per rail per scalable unit) under one non-blocking spine."""
    ib_Bps = cluster.ib_bandwidth_GBps * GB
    ib_s = cluster.ib_latency_us * 1e-6
    leaves: dict[str, None] = {}  # an ordered set
    for node in nodes:
        for rail in range(cluster.gpus_per_node):
            leaf = leaf_name(node // NODES_PER_LEAF, rail)
            _link(graph, gpu_name(node * cluster.gpus_per_node + rail), leaf, ib_Bps, ib_s, "ib")
            leaves[leaf] = None
    # Full bisection: a leaf's bundle of uplinks carries as much as all its downlinks (every
    # node of its scalable unit in the whole cluster, built or not).
    for leaf in leaves:
        group = int(leaf[len("leaf"):leaf.index("/")])
        count = min(NODES_PER_LEAF, cluster.nodes - group * NODES_PER_LEAF)
        _link(graph, leaf, SPINE, count * ib_Bps, ib_s, "ib")


def build_topology(cluster: Cluster, nodes: Iterable[int] | None = None) -> nx.DiGraph:
    """The cluster's DGX nodes of `cluster.gpus_per_node` GPUs each: all of them, or only
    `nodes` (those hosting ranks), with the leaves and spine they need."""
    built = sorted(set(range(cluster.nodes) if nodes is None else nodes))
    if built and not 0 <= built[0] <= built[-1] < cluster.nodes:
        raise ValueError(f"nodes {built[0]}..{built[-1]} outside the cluster's {cluster.nodes}")
    graph = nx.DiGraph(num_gpus=cluster.num_gpus, gpus_per_node=cluster.gpus_per_node,
                       nodes=cluster.nodes, route_cache={})
    for node in built:
        graph.add_node(nvswitch_name(node), kind="switch")
        _add_node(graph, cluster, node)
    _add_fabric(graph, cluster, built)
    return graph


@functools.lru_cache(maxsize=4096)
def placement(gpus: tuple[int, ...], gpus_per_node: int, nodes: int) -> tuple:
    """A group's place on the fabric up to moving it by whole nodes: per member its GPU in its
    node, its node and scalable unit relative to the first member's, and how many nodes its
    unit has (its spine uplink's width, _add_fabric). Groups of one placement have the same
    routes up to renaming (they depend only on same node, same unit and rails:
    _structural_route) over links of the same speeds and latencies, so traffic runs alike."""
    node0 = gpus[0] // gpus_per_node

    def member(gpu: int) -> tuple:
        node = gpu // gpus_per_node
        unit = node // NODES_PER_LEAF
        return (gpu % gpus_per_node, node - node0, unit - node0 // NODES_PER_LEAF,
                min(NODES_PER_LEAF, nodes - unit * NODES_PER_LEAF))

    return tuple(map(member, gpus))


def nodes_hosting(gpus: Iterable[int], gpus_per_node: int) -> list[int]:
    """The DGX nodes that hold these GPUs (rank r on GPU r), in order."""
    return sorted({gpu // gpus_per_node for gpu in gpus})


def route(graph: nx.DiGraph, src: str, dst: str) -> list[tuple[str, str]]:
    """The fewest-hop path from GPU `src` to GPU `dst`; GPUs never forward, so it is unique:
    same node -> through the NVSwitch; same rail and leaf -> through that leaf; otherwise
    GPU -> its rail's leaf -> spine -> the destination rail's leaf -> GPU. Cached on the graph.
    """
    cache = graph.graph.setdefault("route_cache", {})
    if (src, dst) not in cache:
        cache[(src, dst)] = _structural_route(graph, int(src[3:]), int(dst[3:]))
    return cache[(src, dst)]


def _structural_route(graph: nx.DiGraph, src: int, dst: int) -> list[tuple[str, str]]:
    """The unique fewest-hop route of the rail-optimised fabric (tests compare it with
    networkx's shortest path over the graph)."""
    if src == dst:
        return []
    per_node = graph.graph["gpus_per_node"]
    (src_node, src_rail), (dst_node, dst_rail) = divmod(src, per_node), divmod(dst, per_node)
    if src_node == dst_node:
        path = [gpu_name(src), nvswitch_name(src_node), gpu_name(dst)]
    else:
        src_leaf = leaf_name(src_node // NODES_PER_LEAF, src_rail)
        dst_leaf = leaf_name(dst_node // NODES_PER_LEAF, dst_rail)
        middle = [src_leaf] if src_leaf == dst_leaf else [src_leaf, SPINE, dst_leaf]
        path = [gpu_name(src), *middle, gpu_name(dst)]
    return list(zip(path[:-1], path[1:]))


def hop_route(graph: nx.DiGraph, src: int, dst: int,
              via: int | None = None) -> tuple[tuple[str, str], ...]:
    """Edges of a transfer from GPU `src` to GPU `dst`, relayed through GPU `via` if given
    (NCCL PXN: NVLink to the GPU that owns the NIC on the destination's rail, then its NIC)."""
    cache = graph.graph.setdefault("hop_cache", {})
    key = (src, dst, via)
    if key not in cache:
        if via is None or via in (src, dst):
            cache[key] = tuple(_structural_route(graph, src, dst))
        else:
            cache[key] = (tuple(_structural_route(graph, src, via))
                          + tuple(_structural_route(graph, via, dst)))
    return cache[key]


def route_latency_s(graph: nx.DiGraph, edges) -> float:
    """Sum of the per-edge latencies along a route."""
    return sum(graph.edges[edge]["latency_s"] for edge in edges)
