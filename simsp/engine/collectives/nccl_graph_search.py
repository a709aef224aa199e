"""NCCL's graph search (src/graph/search.cc ncclTopoCompute) on simsp's topologies (pure).

NVIDIA/nccl v2.30.7 (commit 5067397c). ncclTopoCompute looks for `channels` copies of a
pattern (ring, balanced tree, tree, NVLS heads) at a per-channel speed, walking the speed array
down (pass 1: sameChannels on and off, Hopper's simpler tree, wider path types, crossNic), keeping
the better graph by ncclTopoCompareGraphs; then ncclTopoDupChannels, then pass 2 raises the
speed (rings), bwInter (NVLS) or bwIntra (trees) while the search still finds as many channels.
This module ports that control flow step by step. The recursion itself (ncclTopoSearchRec) is
replaced by the channel count it reaches on simsp's topologies, `_found`: N GPUs on one
NVSwitch (topo.cc fuses the switches into one NVS node, each GPU linked to it both ways at
NVLinks x SMxx_NVLINK_BW), one NIC per GPU on the PCIe switch it shares with that GPU (path
PIX), every GPU's other NICs reached through the host (PHB/SYS) or, GPU to NIC only, through the
NIC's own GPU over NVLink (paths.cc: PXN). followPath subtracts a channel's speed from every
link it crosses, so a channel fits while each link keeps the speed; the counts below are those
subtractions worked out per pattern (module docs of `_found_*`).
Not ported, as they cannot change the result here: the global and per-search timeouts (the
depth-first search reaches its count on its first branch; `_found_intra` says where it could
not do better in time), nHops ties (a later graph of equal bandwidth has as many hops or more),
the AMD/SYS exception to sameChannels (no SYS path inside a node), NCCL_GRAPH_FILE, the split-
NVLink rule (one NVLink domain), and the 'simple order' fallback (the speed loop always ends
with a graph on these topologies).
"""

from dataclasses import dataclass, replace
import math

from simsp.engine.collectives import nccl_platform as plat

RING, BALANCED_TREE, TREE, NVLS = "ring", "balanced_tree", "tree", "nvls"  # NCCL_TOPO_PATTERN_*
MAX_CHANNELS = 64  # device.h MAXCHANNELS
MAX_NVLS_ARITY = 32  # device.h NCCL_MAX_NVLS_ARITY
LOC_BW = 5000.0  # topo.h LOC_BW: one GPU alone (search.cc ncclTopoSearchInit)
CROSS_NIC = 2  # search.cc NCCL_PARAM(CrossNic, "CROSS_NIC", 2)
DUP_MIN_BW, DUP_SM90_BW, DUP_SM90_CHANNELS = 25.0, 50.0, 4  # search.cc ncclTopoDupChannels


@dataclass(frozen=True)
class Topology:
    """What the search sees of one node: the communicator's GPUs there, whether the
    communicator spans nodes (system->inter), a GPU's NVLink total and its NIC's bandwidth in
    NCCL's units (GB/s), and the compute capability."""

    gpus: int  # GPUs of the communicator on the node (system->nodes[GPU].count)
    inter: bool  # the communicator spans nodes: search from the NICs
    nvlink_bw: float  # a GPU's DEV<->NVS link: NVLinks x SMxx_NVLINK_BW (topo.cc)
    nic_bw: float  # the NIC (net.bw: link speed / 8, topo.cc)
    compcap: str  # AMPERE, HOPPER or BLACKWELL

    @property
    def pcie_bw(self) -> float:
        """The GPU's and NIC's PCIe x16 link (topo.cc: width x per-lane rate / 80)."""
        return plat.PCIE_X16_BW[self.compcap]

    @property
    def max_bw(self) -> float:
        """search.cc ncclTopoSearchInit system->maxBw: the best path from a GPU to a GPU (one
        node) or to a NIC (PIX: min of PCIe and NIC); LOC_BW for one GPU alone."""
        if not self.inter:
            return LOC_BW if self.gpus == 1 else self.nvlink_bw
        return min(self.pcie_bw, self.nic_bw)

    @property
    def total_bw(self) -> float:
        """search.cc getTotalBw: a GPU's NVLink total or its PCIe link, the larger."""
        return LOC_BW if not self.inter and self.gpus == 1 else max(self.pcie_bw, self.nvlink_bw)


@dataclass(frozen=True)
class SearchGraph:
    """An ncclTopoGraph as the search leaves it."""

    pattern: str
    channels: int  # nChannels
    bw_intra: float  # bwIntra (GB/s a channel)
    bw_inter: float  # bwInter
    cross_nic: int = 0  # crossNic of the search that found it
    wide: bool = False  # found with the path types widened (typeInter past PIX)
    min_channels: int = 1
    max_channels: int = MAX_CHANNELS // 2


def _fits(bw: float, speed: float) -> int:
    """How many channels of `speed` a link of `bw` carries: followPath subtracts the speed
    while the link keeps it, rounding to 1e-3 GB/s (search.cc SUB_ROUND)."""
    return int(round(bw * 1000)) // int(round(speed * 1000)) if speed > 0 else 0


def _per_nic(topo: Topology, bw_inter: float) -> int:
    """Channels one NIC starts: net.bw checked against (int) bwInter (ncclTopoSearchRecNet
    `const int bw`), the PCIe links against the speed itself (followPath)."""
    whole = int(bw_inter)
    by_nic = int(topo.nic_bw) // whole if whole > 0 else MAX_CHANNELS
    return min(by_nic, _fits(topo.nic_bw, bw_inter), _fits(topo.pcie_bw, bw_inter))


def _rotated(limit: int, gpus: int, cap: int) -> int:
    """The most channels, up to `cap`, whose first GPUs rotate with their NICs: a GPU sends on
    NVLink in every channel but those it ends (one in `gpus`), at most `limit` times."""
    return max((k for k in range(cap + 1) if k - k // gpus <= limit), default=0)


def _found_intra(topo: Topology, graph: SearchGraph) -> int:
    """Channels the recursion finds inside one node (system->inter == 0). Rings and chains:
    each channel takes bwIntra from every GPU's link to the NVSwitch and back (a chain's last
    GPU sends nothing, but the search replays the first channel's order on every later one,
    FORCED_ORDER_REPLAY, so the same GPUs send each time; balancing the chains' ends would need
    backtracking over most channels, beyond NCCL_SEARCH_TIMEOUT). NVLS: `_found_nvls`."""
    if topo.gpus == 1:
        return min(graph.max_channels, _fits(LOC_BW, graph.bw_intra))
    if graph.pattern == NVLS:
        return _found_nvls(topo, graph, topo.gpus)
    return min(graph.max_channels, _fits(topo.nvlink_bw, graph.bw_intra))


def _found_nvls(topo: Topology, graph: SearchGraph, heads: int) -> int:
    """ncclTopoSearchTryNvls: channel c (head GPU c, one per NIC across nodes) takes bwIntra
    on every GPU's link to and from the NVSwitch, twice on the head's; the search stops at the
    first head that does not fit."""
    load = [0] * topo.gpus  # [gpu] milli-GB/s taken on its NVS link (each direction alike)
    limit, speed = int(round(topo.nvlink_bw * 1000)), int(round(graph.bw_intra * 1000))
    for head in range(min(graph.max_channels, heads)):
        need = [load[g] + speed * (2 if g == head else 1) for g in range(topo.gpus)]
        if max(need) > limit:
            return head
        load = need
    return min(graph.max_channels, heads)


def _found_inter(topo: Topology, graph: SearchGraph) -> int:
    """Channels the recursion finds from the NICs (system->inter), each NIC starting
    `_per_nic` of them, channel c on NIC c (ncclTopoSearchRecNet: nets[(nChannels + i) %
    netCount]), entering at the NIC's own GPU:
    - ring, crossNic 0: back to the same NIC (rails), from the last GPU through the NIC's GPU
      over NVLink (PXN, so only once typeInter reaches PATH_PXN): every GPU sends once on
      NVLink per channel;
    - ring, crossNic 2: back to the last GPU's own NIC (odd channels return to the previous
      channel's first NIC): the last GPU sends over PCIe, and each GPU ends 1/gpus of them;
    - tree (Hopper's simpler tree, CollNet Chain): up and down the first GPU's NIC, then a
      chain of the others (NVLink sends but the last GPU's);
    - balanced tree: half the up traffic from the second GPU, which reaches the NIC by PXN but
      must also be reachable back (FollowPath checks revPath for trees), so only with typeInter
      past PXN (PHB; Ampere: maxTypeInter SYS; Hopper and later stop at the PXN paths' type);
    - NVLS heads: `_found_nvls`, one head per NIC.
    Sends at speed bwIntra, the PXN hop of bwInter (bwInter / 2 for a balanced tree)."""
    gpus, nics = topo.gpus, _per_nic(topo, graph.bw_inter) * topo.gpus
    limit = _fits(topo.nvlink_bw, graph.bw_intra)
    pattern = TREE if gpus == 1 and graph.pattern != RING else graph.pattern
    if pattern == NVLS:
        return _found_nvls(topo, graph, topo.gpus) if nics >= topo.gpus else 0
    cap = min(graph.max_channels, nics)
    if gpus == 1:  # no NVLink hop
        return cap
    if pattern == RING and graph.cross_nic != CROSS_NIC:
        return min(cap, limit) if graph.wide else 0
    if pattern in (RING, TREE):
        return _rotated(limit, gpus, cap)
    if not (graph.wide and topo.compcap == plat.AMPERE):
        return 0  # balanced tree
    pxn = graph.bw_inter / 2  # the second GPU's half, through the first GPU's NVLink
    return max((k for k in range(cap + 1)
                if (k - k // gpus) * graph.bw_intra + math.ceil(k / gpus) * pxn
                <= topo.nvlink_bw + 1e-9), default=0)


def _found(topo: Topology, graph: SearchGraph) -> int:
    """ncclTopoSearchRec's channel count for `graph`'s pattern and speeds on `topo`."""
    return _found_inter(topo, graph) if topo.inter else _found_intra(topo, graph)


def _better(topo: Topology, graph: SearchGraph, ref: SearchGraph) -> bool:
    """search.cc ncclTopoCompareGraphs: enough channels, then (NVLS) more heads or more
    bwInter in all, else more bwIntra in all (nHops ties: module doc)."""
    if graph.channels < graph.min_channels:
        return False
    if graph.pattern == NVLS:
        return (ref.channels < graph.channels <= topo.gpus
                or graph.channels * graph.bw_inter > ref.channels * ref.bw_inter)
    return graph.channels * graph.bw_intra > ref.channels * ref.bw_intra


def _search(topo: Topology, tmp: SearchGraph, best: SearchGraph) -> tuple[SearchGraph, bool]:
    """One ncclTopoSearchRec: (the graph kept, whether it is perfect: maxChannels reached,
    time = -1)."""
    found = replace(tmp, channels=_found(topo, tmp))
    if found.channels and _better(topo, found, best):
        return found, found.channels == found.max_channels
    return best, False


def _speeds(topo: Topology) -> tuple:
    """search.cc: speedArrayIntra/Inter by compute capability (nccl_platform.py)."""
    return (plat.SPEED_INTER if topo.inter else plat.SPEED_INTRA)[topo.compcap]


def _tries(topo: Topology, pattern: str):
    """Pass 1's searches at one speed, in search.cc's order (each with sameChannels on, then
    off: one evaluation, as the second finds at least the first's): crossNic 0 then 2 (rings
    and balanced trees with more than one NIC), path types from the narrowest to the widest
    (the typeIntra/typeInter loops: they only matter from the NICs), and on SM90+ the simpler
    tree after a balanced one. Inside a node crossNic and the path types change nothing (no
    NIC in the pattern, every GPU pair NVL), so only the first try is evaluated there."""
    cross = (0, CROSS_NIC) if pattern in (RING, BALANCED_TREE) and topo.inter else (0,)
    for cross_nic in cross:
        for wide in (False, True) if topo.inter else (False,):
            yield pattern, cross_nic, wide
            if topo.compcap != plat.AMPERE and pattern == BALANCED_TREE:
                yield TREE, cross_nic, wide


def _pass_one(topo: Topology, graph: SearchGraph) -> SearchGraph:
    """search.cc ncclTopoCompute pass 1: from the first speed within maxBw (and, with
    minChannels, within totalBw, x ndevs/(ndevs-1) for patterns that need not close back to
    their NIC), each speed's tries, down the speed array while nothing is found or the next
    speed is above .49 of the best's bwInter; stop at a perfect graph or at nChannels x bwInter
    >= totalBw."""
    speeds, total = _speeds(topo), topo.total_bw
    room = total * topo.gpus / (topo.gpus - 1) if topo.gpus > 1 and graph.pattern != RING else total
    index = 0
    while ((speeds[index] > topo.max_bw or speeds[index] * graph.min_channels > room)
           and index < len(speeds) - 1):
        index += 1
    best = replace(graph, channels=0, bw_intra=0.0, bw_inter=0.0)
    while True:
        for pattern, cross_nic, wide in _tries(topo, graph.pattern):
            tmp = replace(graph, pattern=pattern, cross_nic=cross_nic, wide=wide,
                          bw_intra=speeds[index], bw_inter=speeds[index])
            best, perfect = _search(topo, tmp, best)
            if perfect or best.channels * best.bw_inter >= total:
                return best
        if index < len(speeds) - 1 and (best.channels == 0
                                        or speeds[index + 1] / best.bw_inter > .49):
            index += 1
            continue
        return best


def dup_channels(graph: SearchGraph, compcap: str) -> SearchGraph:
    """search.cc ncclTopoDupChannels: twice the channels (up to maxChannels) at the speeds
    divided alike, from bwIntra 25; not NVLS; above SM80 not below 50 with more than 4."""
    if (graph.channels == 0 or graph.pattern == NVLS or graph.bw_intra < DUP_MIN_BW
            or (compcap != plat.AMPERE and graph.bw_intra < DUP_SM90_BW
                and graph.channels > DUP_SM90_CHANNELS)):
        return graph
    doubled = min(2 * graph.channels, graph.max_channels)
    factor = math.ceil(doubled / graph.channels)
    return replace(graph, channels=doubled, bw_intra=graph.bw_intra / factor,
                   bw_inter=graph.bw_inter / factor)


def _pass_two(topo: Topology, graph: SearchGraph) -> SearchGraph:
    """search.cc pass 2, from the duplicated graph: with minChannels its channels, raise the
    speed one step at a time: both speeds for rings, bwInter for NVLS (at its channels) while
    below twice bwIntra, bwIntra for the others (and NVLS past that) while below twice
    bwInter; each raise kept only if the search finds it (no timeout: module doc)."""
    speeds = _speeds(topo)
    index = 0
    while speeds[index] > graph.bw_inter and index < len(speeds) - 1:
        index += 1
    tmp = replace(graph, bw_intra=speeds[index], bw_inter=speeds[index],
                  min_channels=graph.channels)
    while index > 0:
        if graph.pattern == RING:
            index -= 1
            tmp = replace(tmp, bw_intra=speeds[index], bw_inter=speeds[index])
        elif (graph.pattern == NVLS and tmp.bw_inter == graph.bw_inter
              and tmp.bw_inter < tmp.bw_intra * 2):
            index -= 1
            tmp = replace(tmp, min_channels=graph.channels, max_channels=graph.channels,
                          bw_inter=speeds[index])
        elif tmp.bw_intra == graph.bw_intra and tmp.bw_intra < tmp.bw_inter * 2:
            index -= 1
            tmp = replace(tmp, bw_intra=speeds[index])
        else:
            break
        graph, _ = _search(topo, tmp, graph)
    return graph


def compute(topo: Topology, pattern: str, min_channels: int = 1,
            max_channels: int = MAX_CHANNELS // 2) -> SearchGraph:
    """search.cc ncclTopoCompute for `pattern` on `topo`: pass 1, ncclTopoDupChannels, pass 2.
    NVLS: maxChannels min(NCCL_MAX_NVLS_ARITY, GPUs), forced as minChannels on one node."""
    if pattern == NVLS:
        max_channels = min(MAX_NVLS_ARITY, topo.gpus)
        if not topo.inter:
            min_channels = max_channels
    graph = SearchGraph(pattern, 0, 0.0, 0.0, min_channels=min_channels,
                        max_channels=max_channels)
    found = _pass_one(topo, graph)
    return _pass_two(topo, dup_channels(found, topo.compcap))
