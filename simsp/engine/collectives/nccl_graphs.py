"""NCCL's ring and tree graphs for one group, as its tuning model reads them (pure).

src/init.cc computes the ring graph (pattern RING, 1 to MAXCHANNELS/2 channels), then the tree
graph (pattern BALANCED_TREE, the ring's channel count as its minChannels and maxChannels) with
src/graph/search.cc ncclTopoCompute (ported in nccl_graph_search.py) on the node NCCL detects:
the group's GPUs there, each GPU's NVLinks at NCCL's per-link bandwidth (topo.h
SM80/SM90/SM100_NVLINK_BW), one NIC per GPU. src/graph/connect.cc ncclTopoPostset doubles the
graph's channels into the communicator's.
"""

from dataclasses import dataclass
from functools import lru_cache

from simsp.engine.collectives import nccl_graph_search as search
from simsp.engine.collectives import nccl_platform as plat
from simsp.engine.collectives.nccl_platform import DGX_A100, Platform

GRAPH_MAX_CHANNELS = search.MAX_CHANNELS // 2  # init.cc ringGraph->maxChannels = MAXCHANNELS/2


@dataclass(frozen=True)
class Graph:
    """NCCL's ring or tree graph for a group: channels and per-channel bandwidths (GB/s)."""

    channels: int  # graph channels (ncclTopoGraph.nChannels)
    bw_intra: float  # bwIntra: what tuning.cc takes on up to 2 nodes
    bw_inter: float  # bwInter: beyond 2 nodes

    @property
    def comm_channels(self) -> int:
        """The communicator's channels: connect.cc ncclTopoPostset doubles the graph's."""
        return min(2 * self.channels, 64)

    def bw(self, nodes: int) -> float:
        """tuning.cc: a channel's bandwidth, bwIntra on up to 2 nodes, else bwInter."""
        return self.bw_intra if nodes <= 2 else self.bw_inter


def search_topology(nodes: int, ranks_per_node: int, nvlink_GBps: float, ib_GBps: float,
                    compcap: str) -> search.Topology:
    """The node NCCL's search sees: the group's GPUs on it, a GPU's NVLinks x NCCL's per-link
    bandwidth (topo.h SMxx_NVLINK_BW), one NIC per GPU of `ib_GBps`."""
    links = nvlink_GBps / plat.NVLINK_LINK_GBPS[compcap]
    return search.Topology(max(1, ranks_per_node), nodes > 1, links * plat.NVLINK_BW[compcap],
                           ib_GBps, compcap)


@lru_cache(maxsize=256)
def nccl_graphs(nodes: int, ranks_per_node: int, nvlink_GBps: float, ib_GBps: float,
                platform: Platform = DGX_A100) -> tuple[Graph, Graph]:
    """(ring, tree) graphs as NCCL's search finds them (init.cc: the ring, then a balanced tree
    with the ring's channels as minChannels and maxChannels; nccl_graph_search.compute)."""
    topo = search_topology(nodes, ranks_per_node, nvlink_GBps, ib_GBps, platform.compcap)
    if topo.nvlink_bw <= 0:  # no NVLink: outside the ported search (PCIe rings)
        return _no_nvlink_graph(nodes, ranks_per_node, ib_GBps, platform)
    ring = search.compute(topo, search.RING)
    tree = search.compute(topo, search.BALANCED_TREE, ring.channels, ring.channels)
    return (Graph(ring.channels, ring.bw_intra, ring.bw_inter),
            Graph(tree.channels, tree.bw_intra, tree.bw_inter))


def _no_nvlink_graph(nodes: int, ranks_per_node: int, ib_GBps: float,
                     platform: Platform) -> tuple[Graph, Graph]:
    """A node without NVLink: one channel per rank at the last intra speed on one node, one
    per NIC at the first inter speed within the NIC and PCIe across nodes (simsp's earlier
    first-fitting-speed rule, kept for these)."""
    if nodes == 1:
        graph = Graph(1, plat.SPEED_INTRA[platform.compcap][-1],
                      plat.SPEED_INTRA[platform.compcap][-1])
    else:
        path = min(ib_GBps, plat.PCIE_X16_BW[platform.compcap])
        speed = next((s for s in plat.SPEED_INTER[platform.compcap] if s <= path),
                     plat.SPEED_INTER[platform.compcap][-1])
        graph = Graph(max(1, ranks_per_node), speed, speed)
    return graph, graph


def nccl_graph(nodes: int, ranks_per_node: int, nvlink_GBps: float, ib_GBps: float,
               platform: Platform = DGX_A100) -> Graph:
    """The ring graph (nccl_graphs)."""
    return nccl_graphs(nodes, ranks_per_node, nvlink_GBps, ib_GBps, platform)[0]
