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


class HopEnds:
    """The binding links of a graph's hops, each GPU's four named once (cached on the graph,
    as cluster/topology.py caches routes: hop_ends)."""

    def __init__(self, graph: nx.DiGraph):
        fabric = graph.graph.get("fabric")
        self.per_node = graph.graph["gpus_per_node"]
        self.per_leaf = NODES_PER_LEAF if fabric is None else fabric.nodes_per_leaf
        self.links: dict[int, tuple[Edge, Edge, Edge, Edge]] = {}  # GPU -> gpu_links

    def gpu_links(self, gpu: int) -> tuple[Edge, Edge, Edge, Edge]:
        """GPU `gpu`'s links that can bind: (NVLink up, NVLink down, NIC up, NIC down)."""
        links = self.links.get(gpu)
        if links is None:
            node, rail = divmod(gpu, self.per_node)
            name, switch = gpu_name(gpu), nvswitch_name(node)
            leaf = leaf_name(node // self.per_leaf, rail)
            links = self.links[gpu] = ((name, switch), (switch, name), (name, leaf), (leaf, name))
        return links

    def segment(self, src: int, dst: int) -> tuple[Edge, ...]:
        """The binding links of the direct route from GPU `src` to GPU `dst`, in route order:
        the sender's port up and the receiver's down on one node, else their NICs; none to
        itself."""
        if src == dst:
            return ()
        kind = 0 if src // self.per_node == dst // self.per_node else 2  # NVLink or NIC
        # each GPU's links named once (gpu_links), looked up here without a call per end
        links = self.links
        ups, downs = links.get(src) or self.gpu_links(src), links.get(dst) or self.gpu_links(dst)
        return ups[kind], downs[kind + 1]

    def hop(self, src: int, dst: int, via: int | None = None) -> tuple[Edge, ...]:
        """The links of hop_route(graph, src, dst, via) that can bind, in route order."""
        if via is None or via in (src, dst):
            return self.segment(src, dst)
        return self.segment(src, via) + self.segment(via, dst)


def hop_ends(graph: nx.DiGraph) -> HopEnds:
    """The graph's HopEnds, made once."""
    ends = graph.graph.get("hop_ends")
    if ends is None:
        ends = graph.graph["hop_ends"] = HopEnds(graph)
    return ends
