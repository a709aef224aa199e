"""The links of a hop that can bind, in closed form: a GPU's own four links, not its whole route.

Where the check runs no link above the leaves binds (shortcuts/traffic.py can_bind), and every
route of the rail-optimised fabric (cluster/topology.py _structural_route) has only its first
and last link below them: GPU -> NVSwitch -> GPU inside a node, GPU -> leaf (-> spine (-> core
-> spine) -> leaf) -> GPU between nodes, every middle link with a spine at one end. So a hop's
binding links are the sender's NVLink port or NIC up and the receiver's down (twice over with a
PXN relay: sender to relay, relay to receiver), named as the graph names them, without building
the route. tests/test_route_ends.py takes the filtered hop_route as its oracle.
"""

import networkx as nx

from simsp.cluster.topology import gpu_name, leaf_name, nvswitch_name
from simsp.hardware.constants import NODES_PER_LEAF

Edge = tuple[str, str]


def gpu_links(graph: nx.DiGraph, gpu: int) -> tuple[Edge, Edge, Edge, Edge]:
    """GPU `gpu`'s links that can bind: (NVLink up, NVLink down, NIC up, NIC down), each made
    once per graph (cached on it, as cluster/topology.py caches routes)."""
    cache = graph.graph.setdefault("gpu_links", {})
    links = cache.get(gpu)
    if links is None:
        per_node = graph.graph["gpus_per_node"]
        fabric = graph.graph.get("fabric")
        per_leaf = NODES_PER_LEAF if fabric is None else fabric.nodes_per_leaf
        node, rail = divmod(gpu, per_node)
        name, switch, leaf = gpu_name(gpu), nvswitch_name(node), leaf_name(node // per_leaf, rail)
        links = cache[gpu] = ((name, switch), (switch, name), (name, leaf), (leaf, name))
    return links


def segment_ends(graph: nx.DiGraph, src: int, dst: int) -> tuple[Edge, ...]:
    """The binding links of the direct route from GPU `src` to GPU `dst`, in route order: the
    sender's port up and the receiver's down on one node, else their NICs; none to itself."""
    if src == dst:
        return ()
    per_node = graph.graph["gpus_per_node"]
    kind = 0 if src // per_node == dst // per_node else 2  # NVLink or NIC
    return gpu_links(graph, src)[kind], gpu_links(graph, dst)[kind + 1]


def binding_links(graph: nx.DiGraph, src: int, dst: int,
                  via: int | None = None) -> tuple[Edge, ...]:
    """The links of hop_route(graph, src, dst, via) that can bind, in route order."""
    if via is None or via in (src, dst):
        return segment_ends(graph, src, dst)
    return segment_ends(graph, src, via) + segment_ends(graph, via, dst)
