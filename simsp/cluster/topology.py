"""Cluster topology as a networkx DiGraph: DGX nodes on a rail-optimised leaf/spine(/core) fat tree.

Inside a node every GPU has one NVLink edge to and from the node's NVSwitch fabric (modelled as
one switch vertex). Between nodes GPU j of every node owns one NIC cabled to the leaf switch
of rail j in its scalable unit (rail-optimised, as in the DGX SuperPOD); leaves meet at a spine
(one vertex), or, where the system's fabric needs a core tier, at their pod's spine and the pods'
spines at the core (hardware/fabric.py, docs/hardware.md#fabric). A leaf's uplink carries its
downlinks / the fabric's oversubscription, a pod spine's to the core its leaves' uplinks / the
core's. Edges carry `bandwidth_Bps` (bytes/s, per direction), `latency_s` and `kind` ("nvlink" |
"ib").
"""

from collections.abc import Iterable, Iterator
import functools

import networkx as nx

from simsp.hardware.constants import NODES_PER_LEAF
from simsp.hardware.fabric import Fabric
from simsp.hardware.cluster_hardware import fabric_of
from simsp.scenario.config import Cluster
from simsp.units import GB

SPINE = "spine"
CORE = "core"


def gpu_name(index: int) -> str:
    """Vertex name of the GPU with global index `index`: 'gpu0', 'gpu1', ..."""
    return f"gpu{index}"


def nvswitch_name(node: int) -> str:
    """Vertex name of the NVSwitch fabric of DGX node `node`."""
    return f"node{node}/nvswitch"


def leaf_name(leaf_group: int, rail: int) -> str:
    """Vertex name of the leaf switch of `rail` in scalable unit `leaf_group`."""
    return f"leaf{leaf_group}/rail{rail}"


def above_leaves(edge: tuple[str, str]) -> bool:
    """A link above the leaves: a leaf's uplink or a pod spine's to the core (every such link
    has a spine at one end)."""
    return any(end == SPINE or end.endswith("/" + SPINE) for end in edge)


def spine_name(pod: int | None) -> str:
    """Vertex name of the spine: the one spine of a two-tier fabric, else pod `pod`'s."""
    return SPINE if pod is None else f"pod{pod}/{SPINE}"


Link = tuple[str, str, dict]  # (u, v, the edge's attributes): one direction of a link


def _link(a: str, b: str, bandwidth_Bps: float, latency_s: float, kind: str) -> list[Link]:
    """A full-duplex link: one directed edge each way with the same speed and latency."""
    return [(a, b, {"bandwidth_Bps": bandwidth_Bps, "latency_s": latency_s, "kind": kind}),
            (b, a, {"bandwidth_Bps": bandwidth_Bps, "latency_s": latency_s, "kind": kind})]


def _both_ways(pairs: Iterable[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    """Each link's two directed edges, (a, b) then (b, a)."""
    for a, b in pairs:
        yield a, b
        yield b, a


def _add_nodes(graph: nx.DiGraph, cluster: Cluster, nodes: list[int]) -> None:
    """The DGX nodes: each one's NVSwitch fabric and its GPUs, each GPU linked to the fabric.
    Every GPU's links come in one add_edges_from (a call per edge: 0.25 CPU s at 16,384 GPUs),
    in the order the graph lists them: node by node, GPU by GPU."""
    per_node = cluster.gpus_per_node
    graph.add_nodes_from(
        vertex for node in nodes for vertex in
        [(nvswitch_name(node), {"kind": "switch"})]
        + [(gpu_name(node * per_node + local), {"kind": "gpu", "node": node, "local": local})
           for local in range(per_node)])
    # cluster.nvlink_latency_us is per hop *through* the switch: half on each GPU<->switch edge.
    graph.add_edges_from(_both_ways((gpu_name(node * per_node + local), nvswitch_name(node))
                                    for node in nodes for local in range(per_node)),
                         bandwidth_Bps=cluster.nvlink_bandwidth_GBps * GB,
                         latency_s=cluster.nvlink_latency_us * 1e-6 / 2, kind="nvlink")


def _add_fabric(graph: nx.DiGraph, cluster: Cluster, nodes: list[int], fabric: Fabric) -> None:
    """Rail-optimised leaves (one per rail per scalable unit) under the spine (or their pod's
    spine, the pods' spines under the core)."""
    ib_Bps = cluster.ib_bandwidth_GBps * GB
    ib_s = cluster.ib_latency_us * 1e-6
    per_leaf, per_node = fabric.nodes_per_leaf, cluster.gpus_per_node
    graph.add_edges_from(_both_ways((gpu_name(node * per_node + rail),
                                     leaf_name(node // per_leaf, rail))
                                    for node in nodes for rail in range(per_node)),
                         bandwidth_Bps=ib_Bps, latency_s=ib_s, kind="ib")
    # leaf -> its scalable unit, in the order the GPUs' links first reach it
    leaves = {leaf_name(node // per_leaf, rail): node // per_leaf
              for node in nodes for rail in range(per_node)}
    graph.add_edges_from(_uplinks(cluster, leaves, fabric, ib_Bps, ib_s))


def _uplinks(cluster: Cluster, leaves: dict[str, int], fabric: Fabric, ib_Bps: float,
             ib_s: float) -> Iterator[Link]:
    """The leaves' uplinks to the spine (or their pod's) and the pod spines' to the core."""
    per_leaf = fabric.nodes_per_leaf
    # A leaf's bundle of uplinks carries all its downlinks (every node of its scalable unit in
    # the whole cluster, built or not) over the oversubscription (1: full bisection).
    pods: dict[int, float] = {}  # pod -> its spine's uplink to the core, bytes/s
    for leaf, unit in leaves.items():
        count = min(per_leaf, cluster.nodes - unit * per_leaf)
        pod = fabric.pod_of(unit, cluster.nodes)
        yield from _link(leaf, spine_name(pod), count * ib_Bps / fabric.oversubscription, ib_s,
                         "ib")
        if pod is not None:
            pods[pod] = _pod_uplink_Bps(cluster, fabric, pod, ib_Bps)
    for pod, uplink_Bps in pods.items():
        yield from _link(spine_name(pod), CORE, uplink_Bps, ib_s, "ib")


def _pod_uplink_Bps(cluster: Cluster, fabric: Fabric, pod: int, ib_Bps: float) -> float:
    """A pod spine's bundle to the core: every leaf uplink of the pod's units over the core
    ratio (1: non-blocking, as the SuperPOD RA's spine has as many ports up as down)."""
    first = pod * fabric.units_per_pod * fabric.nodes_per_leaf
    last = min(cluster.nodes, first + fabric.units_per_pod * fabric.nodes_per_leaf)
    leaf_uplinks_Bps = (last - first) * cluster.gpus_per_node * ib_Bps / fabric.oversubscription
    return leaf_uplinks_Bps / fabric.core_oversubscription


def build_topology(cluster: Cluster, nodes: Iterable[int] | None = None,
                   fabric: Fabric | None = None) -> nx.DiGraph:
    """The cluster's DGX nodes of `cluster.gpus_per_node` GPUs each: all of them, or only
    `nodes` (those hosting ranks), with the leaves and spines they need, on `fabric` (default:
    the cluster's, hardware/cluster_hardware.py fabric_of)."""
    fabric = fabric_of(cluster) if fabric is None else fabric
    built = sorted(set(range(cluster.nodes) if nodes is None else nodes))
    if built and not 0 <= built[0] <= built[-1] < cluster.nodes:
        raise ValueError(f"nodes {built[0]}..{built[-1]} outside the cluster's {cluster.nodes}")
    graph = nx.DiGraph(num_gpus=cluster.num_gpus, gpus_per_node=cluster.gpus_per_node,
                       nodes=cluster.nodes, route_cache={}, fabric=fabric)
    _add_nodes(graph, cluster, built)
    _add_fabric(graph, cluster, built, fabric)
    return graph


@functools.lru_cache(maxsize=4096)
def placement(gpus: tuple[int, ...], gpus_per_node: int, nodes: int,
              fabric: Fabric | None = None) -> tuple:
    """A group's place on the fabric up to moving it by whole nodes: per member its GPU in its
    node, its node and scalable unit relative to the first member's, and how many nodes its
    unit has (its spine uplink's width, _add_fabric); in a three-tier fabric also its pod
    relative to the first member's. Groups of one placement have the same routes up to
    renaming (they depend only on same node, same unit, same pod and rails: _structural_route)
    over links of the same speeds and latencies, so traffic runs alike. `fabric` None: the
    default fabric's 20 nodes per leaf (NODES_PER_LEAF)."""
    node0 = gpus[0] // gpus_per_node
    per_leaf = NODES_PER_LEAF if fabric is None else fabric.nodes_per_leaf
    three_tier = fabric is not None and fabric.three_tier(nodes)

    def member(gpu: int) -> tuple:
        node = gpu // gpus_per_node
        unit = node // per_leaf
        place = (gpu % gpus_per_node, node - node0, unit - node0 // per_leaf,
                 min(per_leaf, nodes - unit * per_leaf))
        if three_tier:
            return place + (fabric.pod_of(unit, nodes) - fabric.pod_of(node0 // per_leaf, nodes),)
        return place

    return tuple(map(member, gpus))


def nodes_hosting(gpus: Iterable[int], gpus_per_node: int) -> list[int]:
    """The DGX nodes that hold these GPUs (rank r on GPU r), in order."""
    return sorted({gpu // gpus_per_node for gpu in gpus})


def route(graph: nx.DiGraph, src: str, dst: str) -> list[tuple[str, str]]:
    """The fewest-hop path from GPU `src` to GPU `dst`; GPUs never forward, so it is unique:
    same node -> through the NVSwitch; same rail and leaf -> through that leaf; otherwise
    GPU -> its rail's leaf -> spine -> the destination rail's leaf -> GPU, or, between pods of
    a three-tier fabric, leaf -> pod spine -> core -> pod spine -> leaf. Cached on the graph.
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
        path = [gpu_name(src), *_fabric_path(graph, src_node, src_rail, dst_node, dst_rail),
                gpu_name(dst)]
    return list(zip(path[:-1], path[1:]))


def _fabric_path(graph: nx.DiGraph, src_node: int, src_rail: int, dst_node: int,
                 dst_rail: int) -> list[str]:
    """The switches between two nodes' NICs: their leaf, or leaf, spine(s) (and core), leaf."""
    fabric, nodes = graph.graph.get("fabric"), graph.graph["nodes"]
    per_leaf = NODES_PER_LEAF if fabric is None else fabric.nodes_per_leaf
    src_unit, dst_unit = src_node // per_leaf, dst_node // per_leaf
    src_leaf, dst_leaf = leaf_name(src_unit, src_rail), leaf_name(dst_unit, dst_rail)
    if src_leaf == dst_leaf:
        return [src_leaf]
    src_pod, dst_pod = ((None, None) if fabric is None else
                        (fabric.pod_of(src_unit, nodes), fabric.pod_of(dst_unit, nodes)))
    if src_pod == dst_pod:
        return [src_leaf, spine_name(src_pod), dst_leaf]
    return [src_leaf, spine_name(src_pod), CORE, spine_name(dst_pod), dst_leaf]


def route_tier(graph: nx.DiGraph, src: int, dst: int, via: int | None = None) -> str:
    """A transfer's latency class (relayed through GPU `via` if given, as hop_route): the
    highest tier it climbs to ("self", "nvlink", "leaf", "spine" or "core")."""
    names = [v for _, v in hop_route(graph, src, dst, via)]
    for tier in (CORE, SPINE):
        if any(name == tier or name.endswith("/" + tier) for name in names):
            return tier
    if any(name.startswith("leaf") for name in names):
        return "leaf"
    return "nvlink" if names else "self"


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
