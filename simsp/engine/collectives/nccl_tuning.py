"""NCCL's choice of algorithm, protocol, channels and threads for one collective (pure).

Everything here is NVIDIA/nccl v2.30.7 (makefiles/version.mk), read from its source:
- src/graph/tuning.cc ncclTopoTuneModel: per algorithm x protocol the base latency, the per-step
  hardware latency (NVLink / network), the bus bandwidth (channels x per-channel bandwidth, then
  the protocol's refinements: LL x0.5 capped at llMaxBw, LL128 x0.92 capped per channel, tree
  x0.92 capped per channel, LL tree /3.8, LL128 tree x120/128 or x7/9), and busbw -> algbw;
  ncclTopoGetAlgoTime: time = latency + bytes / bandwidth, with the tree correction factors and
  the ring plateau factor;
- src/enqueue.cc topoGetAlgoInfo: the cheapest (algorithm, protocol), then channels and threads
  reduced while bytes < channels x threads x threadThreshold;
- src/graph/search.cc ncclTopoCompute (ported in nccl_graph_search.py), src/init.cc: the ring
  graph and the tree graph (as many channels as the ring's), src/graph/connect.cc
  ncclTopoPostset: the communicator's channels (twice the graph's);
- src/graph/topo.h (SM80_NVLINK_BW 20 GB/s per NVLink), src/graph/topo.cc (PCIe Gen4 x16 =
  24 GB/s, NIC bandwidth = link speed / 8), src/include/device.h and comm.h (thread counts and
  thresholds).
The platform (GPU architecture and host CPU: nccl_platform.py) picks the per-architecture rows;
the default is DGX A100 (SM80, AMD EPYC 7742, one HDR NIC per GPU behind PCIe Gen4 x16).
simsp times the chosen collective on its own links (engine/collectives/ring_timing.py, docs/nccl.md); from
here it takes the choice, the base latency, each tier's per-step latency (NCCL's own: a step on
simsp's default links costs exactly it, engine/collectives/nccl_group.hop_step_latency_s) and
the bandwidth fraction relative to ring/Simple with every channel.
"""

from dataclasses import dataclass
from functools import lru_cache
import math

from simsp.engine.collectives import nccl_graph_search as search
from simsp.engine.collectives import nccl_platform as plat
from simsp.engine.collectives.nccl_graphs import Graph, nccl_graphs
from simsp.engine.collectives.nccl_platform import (AMPERE, BLACKWELL, DGX_A100, HOPPER,
                                                    Platform)

RING, TREE = "ring", "tree"
ALGORITHMS = (TREE, RING)  # NCCL_ALGO_TREE = 0, NCCL_ALGO_RING = 1 (NVLS...: SHARP_ALGORITHMS)
LL, LL128, SIMPLE = "LL", "LL128", "Simple"
PROTOCOLS = (LL, LL128, SIMPLE)  # NCCL_PROTO_LL, NCCL_PROTO_LL128, NCCL_PROTO_SIMPLE
ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER = "all_reduce", "reduce_scatter", "all_gather"
NVLINK, NET = "nvlink", "net"  # NCCL_HW_NVLINK, NCCL_HW_NET

# tuning.cc ncclTunerConstantsDefaults.baseLatencies (us), per algorithm: LL, LL128, Simple
BASE_LATENCY_US = {TREE: {LL: 6.8, LL128: 14.0, SIMPLE: 8.4},
                   RING: {LL: 6.6, LL128: 14.0, SIMPLE: 8.4}}
# tuning.cc hwLatencies (us per step), per hardware then algorithm: LL, LL128, Simple
HW_LATENCY_US = {NVLINK: {TREE: {LL: 0.6, LL128: 1.25, SIMPLE: 4.0},
                          RING: {LL: 0.6, LL128: 1.9, SIMPLE: 3.4}},
                 NET: {TREE: {LL: 5.0, LL128: 8.5, SIMPLE: 14.0},
                       RING: {LL: 2.7, LL128: 4.0, SIMPLE: 14.0}}}
# the per-platform tables (llMaxBws, per-channel caps, net overhead): nccl_platform.py
RING_PLATEAU = 1.4  # tuning.cc ncclTopoGetAlgoTime: multi-node ring Simple all-reduce, SM >= 80
# tuning.cc treeCorrectionFactor[protocol][log2(bytes / 64)], 64 B .. 256 MB
TREE_CORRECTION = {
    LL: (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
         1.0, 1.0, 1.0, 1.0),
    LL128: (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9,
            .9, 1.0, 1.0, 1.0),
    SIMPLE: (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8,
             .9, .9, .9)}
# device.h NCCL_LL_MAX_NTHREADS, NCCL_LL128_MAX_NTHREADS, NCCL_SIMPLE_MAX_NTHREADS (the ring
# graph is faster than PCI_BW), NCCL_MAX_NTHREADS (tree); comm.h thread thresholds (bytes per
# thread; LL's is multiplied by nRanks for rings, tuning.cc)
MAX_THREADS = {LL: 512, LL128: 640, SIMPLE: 512}
TREE_THREADS = 640
THREAD_THRESHOLD = {LL: 8, LL128: 8, SIMPLE: 64}
WARP_SIZE = 32
@dataclass(frozen=True)
class NcclChoice:
    """What NCCL would run for one collective, and how it changes simsp's ring/Simple timing."""

    algorithm: str  # RING or TREE
    protocol: str  # LL, LL128 or SIMPLE
    nchannels: int  # channels used (enqueue.cc), of max_channels
    max_channels: int
    nthreads: int  # threads per channel, before the Simple sync warps (enqueue.cc)
    base_latency_s: float  # once per call (tuning.cc baseLatencies)
    protocol_fraction: float  # busbw of (algorithm, protocol) / busbw of ring/Simple (NCCL)
    channel_fraction: float  # busbw on the channels used / on all of them
    estimated_time_s: float  # NCCL's own estimate (ncclTopoGetAlgoTime), which it minimises
    intra_step_s: float  # NCCL's own per-step latency inside a node (tuning.cc)
    inter_step_s: float  # and between nodes

    @property
    def bandwidth_fraction(self) -> float:
        """The link rate this choice achieves, as a fraction of ring/Simple on every channel."""
        return self.protocol_fraction * self.channel_fraction

    def label(self) -> str:
        """'ring/LL128', 'tree/Simple'."""
        return f"{self.algorithm}/{self.protocol}"


def _nsteps(collective: str, ranks: int) -> int:
    """tuning.cc: 2(n-1) steps for all-reduce, n-1 for reduce-scatter and all-gather."""
    return 2 * (ranks - 1) if collective == ALL_REDUCE else ranks - 1


def supported(collective: str, algorithm: str, protocol: str) -> bool:
    """tuning.cc: reduce-scatter and all-gather run as rings (PAT needs one GPU per node;
    NVLS/CollNet are weighed apart: sharp_choice); all-reduce as ring or tree; every protocol."""
    return algorithm == RING or collective == ALL_REDUCE


def bus_bandwidth(collective: str, algorithm: str, protocol: str, nodes: int,
                  graph: Graph, channel_share: float = 1.0,
                  platform: Platform = DGX_A100) -> float:
    """tuning.cc: busBw of (algorithm, protocol) in GB/s, before the conversion to algbw, on
    `channel_share` of the channels (busBw = channels x per-channel bandwidth; the per-channel
    caps scale with the channels, llMaxBw is a total)."""
    channels = graph.channels * channel_share
    bus = channels * graph.bw(nodes)
    ll_max, cap = platform.ll_max_bw(nodes), platform.per_channel_cap
    if algorithm == RING and protocol == LL:
        bus = min(ll_max, bus * 0.5)
    if algorithm == RING and protocol == LL128:
        bus = min(bus * 0.92, channels * cap(plat.PER_CH_MAX_RING_LL128_BW, nodes))
    if algorithm == TREE and collective == ALL_REDUCE:
        bus = min(bus * 0.92, channels * cap(plat.PER_CH_MAX_TREE_BW, nodes))
    if algorithm == TREE and protocol == LL:
        bus = min(bus / 3.8, ll_max)
    if algorithm == TREE and protocol == LL128:
        bus = min(bus * (7.0 / 9.0 if nodes == 1 else 120.0 / 128.0),
                  channels * cap(plat.PER_CH_MAX_TREE_LL128_BW, nodes))
    return bus


def algorithm_bandwidth(collective: str, algorithm: str, protocol: str, ranks: int, nodes: int,
                        graph: Graph, platform: Platform = DGX_A100) -> float:
    """tuning.cc: algbw = busBw x n / nsteps for rings, x 0.5 for trees (GB/s)."""
    bus = bus_bandwidth(collective, algorithm, protocol, nodes, graph, platform=platform)
    return bus * (ranks / _nsteps(collective, ranks) if algorithm == RING else 0.5)


def step_latencies_us(algorithm: str, protocol: str, ranks: int, nodes: int,
                      platform: Platform = DGX_A100) -> tuple:
    """tuning.cc: (intra-node, inter-node) latency of one step in us. Rings across nodes pay
    at least the network post overhead per intra step (x3 for Simple); with one rank per node
    the network steps take the tree's latency."""
    intra = HW_LATENCY_US[NVLINK][algorithm][protocol]
    inter = HW_LATENCY_US[NET][TREE if ranks == nodes else algorithm][protocol]
    if algorithm == RING and nodes > 1:
        intra = max(intra, platform.net_overhead_us * (3 if protocol == SIMPLE else 1))
    return intra, inter


def latency_us(collective: str, algorithm: str, protocol: str, ranks: int, nodes: int,
               platform: Platform = DGX_A100) -> float:
    """tuning.cc comm->latencies: base + ring steps (2(nodes-1) of them on the network for an
    all-reduce) or tree depth 2((ppn-1) intra + log2(nodes) inter)."""
    intra, inter = step_latencies_us(algorithm, protocol, ranks, nodes, platform)
    base = BASE_LATENCY_US[algorithm][protocol]
    if algorithm == RING:
        nsteps = _nsteps(collective, ranks)
        inter_steps = 0 if nodes == 1 else (2 if collective == ALL_REDUCE else 1) * (nodes - 1)
        return base + (nsteps - inter_steps) * intra + inter_steps * inter
    return base + 2 * ((ranks // nodes - 1) * intra + _log2i(nodes) * inter)


def _log2i(n: int) -> int:
    """utils.h log2i: floor(log2(n)) for n >= 1, else 0... (-1 for n = 0)."""
    return n.bit_length() - 1


def tree_correction(protocol: str, nbytes: int) -> float:
    """tuning.cc treeCorrectionFactor for this size (1 outside 64 B .. 256 MB)."""
    log_size = _log2i(nbytes >> 6)
    return TREE_CORRECTION[protocol][log_size] if 0 <= log_size < 23 else 1.0


def nccl_time_us(collective: str, algorithm: str, protocol: str, nbytes: int, ranks: int,
                 nodes: int, graph: Graph, platform: Platform = DGX_A100) -> float:
    """tuning.cc ncclTopoGetAlgoTime for one operation: latency + bytes / (1000 x algbw)."""
    bw = algorithm_bandwidth(collective, algorithm, protocol, ranks, nodes, graph, platform)
    lat = latency_us(collective, algorithm, protocol, ranks, nodes, platform)
    if algorithm == TREE and collective == ALL_REDUCE:
        bw *= tree_correction(protocol, nbytes)
    if (algorithm == RING and protocol == SIMPLE and nodes > 1 and collective == ALL_REDUCE
            and nbytes // (graph.comm_channels * ranks) >= 64):
        lat *= RING_PLATEAU
    return lat + nbytes / (1000 * bw)


def channels_and_threads(algorithm: str, protocol: str, nbytes: int, ranks: int,
                         graph: Graph) -> tuple[int, int]:
    """enqueue.cc topoGetAlgoInfo: fewer channels, then fewer threads (halved while a multiple
    of 128), while bytes < channels x threads x threshold."""
    nc = graph.comm_channels
    nt = MAX_THREADS[protocol]
    threshold = THREAD_THRESHOLD[protocol] * (ranks if algorithm == RING and protocol == LL
                                              else 1)
    while nbytes < nc * nt * threshold and nc >= 2:
        nc -= 1
    while nbytes < nc * nt * threshold and nt % 128 == 0:
        nt //= 2
    if algorithm == TREE:
        nt = TREE_THREADS  # "Tree now uses all threads always"
    return nc, nt


@lru_cache(maxsize=4096)
def choose(collective: str, nbytes: int, ranks: int, nodes: int, nvlink_GBps: float,
           ib_GBps: float, algorithm: str | None = None,
           protocol: str | None = None, platform: Platform = DGX_A100) -> NcclChoice:
    """NCCL's pick for `collective` of `nbytes` (the full message S, as nccl-tests' size) over
    `ranks` ranks on `nodes` nodes (evenly), with NCCL_ALGO / NCCL_PROTO forcing `algorithm` /
    `protocol` when given, tuned for `platform` (GPU architecture, CPU). Memoised: cheap to call for every collective of a run."""
    if ranks < 2:  # enqueue.cc updateCollCostTable: one rank costs nothing (ring/Simple)
        return NcclChoice(RING, SIMPLE, 1, 1, MAX_THREADS[SIMPLE], 0.0, 1.0, 1.0, 0.0, 0.0, 0.0)
    graphs = dict(zip((RING, TREE), nccl_graphs(nodes, max(1, ranks // nodes), nvlink_GBps,
                                                 ib_GBps, platform)))
    options = [(a, p) for a in ALGORITHMS for p in PROTOCOLS if supported(collective, a, p)
               and algorithm in (None, a) and protocol in (None, p)]
    if not options:
        raise ValueError(f"NCCL has no {algorithm} algorithm for {collective}")
    times = {(a, p): nccl_time_us(collective, a, p, max(nbytes, 0), ranks, nodes, graphs[a],
                                  platform) for a, p in options}
    best = min(options, key=lambda ap: times[ap])  # first minimum, NCCL's loop order
    return _describe(collective, best, nbytes, ranks, nodes, graphs, times[best], platform)


def _describe(collective: str, best: tuple[str, str], nbytes: int, ranks: int, nodes: int,
              graphs: dict, time_us: float, platform: Platform) -> NcclChoice:
    """The choice with its channels, threads, latency scales and bandwidth fractions: NCCL's
    busBw is channels x per-channel bandwidth (tuning.cc), so fewer channels carry
    proportionally less up to the protocol's total cap (llMaxBw); threads are sized to the data
    within a channel and change nothing. `graphs`: algorithm -> Graph; the communicator's
    channels are the ring's (init.cc: min of the tree's and the ring's, equal here)."""
    algorithm, protocol = best
    ring, graph = graphs[RING], graphs[algorithm]
    nc, nt = channels_and_threads(algorithm, protocol, nbytes, ranks, ring)
    intra, inter = step_latencies_us(algorithm, protocol, ranks, nodes, platform)
    reference_bus = bus_bandwidth(collective, RING, SIMPLE, nodes, ring, platform=platform)
    full_bus = bus_bandwidth(collective, algorithm, protocol, nodes, graph, platform=platform)
    used_bus = bus_bandwidth(collective, algorithm, protocol, nodes, graph,
                             nc / ring.comm_channels, platform)
    return NcclChoice(algorithm, protocol, nc, ring.comm_channels, nt,
                      BASE_LATENCY_US[algorithm][protocol] * 1e-6, full_bus / reference_bus,
                      used_bus / full_bus, time_us * 1e-6, intra * 1e-6, inter * 1e-6)


def p2p_channels(comm_channels: int) -> int:
    """The channels grouped sends and receives (an all-to-all) spread over: the communicator's
    rounded up to a power of two (src/graph/paths.cc ncclTopoComputeP2pChannels: p2pnChannels =
    pow2Up(min(nChannels, NCCL_MAX_P2P_NCHANNELS)))."""
    return 1 << max(comm_channels - 1, 0).bit_length()


# ------------------------------------------------------------------------------------------
# In-network reduction: NVLS, NVLS_TREE (NVLink SHARP in the NVSwitch), COLLNET_DIRECT,
# COLLNET_CHAIN (SHARP in the IB switches, through the CollNet plugin). NVIDIA/nccl commit
# 5067397c (2.30.7), src/graph/tuning.cc ncclTopoTuneModel: bandwidths lines 305-385,
# latencies 418-430, enable conditions 500-510; src/transport/nvls.cc (NCCL_NVLS_ENABLE).
# ------------------------------------------------------------------------------------------

COLLNET_DIRECT, COLLNET_CHAIN = "collnet_direct", "collnet_chain"  # NCCL_ALGO_COLLNET_* = 2, 3
NVLS, NVLS_TREE = "nvls", "nvls_tree"  # NCCL_ALGO_NVLS = 4, NCCL_ALGO_NVLS_TREE = 5
SHARP_ALGORITHMS = (COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE)
NVLS_EFFICIENCY = {AMPERE: 0.0, HOPPER: 0.85, BLACKWELL: 0.74}  # tuning.cc nvlsEfficiency
# tuning.cc hwLatencies (us), Simple only (LL and LL128 are 0: these algorithms run Simple);
# baseLatencies are 0 for all four
SHARP_HW_LATENCY_US = {NVLINK: {COLLNET_DIRECT: 3.7, COLLNET_CHAIN: 2.8, NVLS: 25.0,
                                NVLS_TREE: 25.0},
                       NET: {COLLNET_DIRECT: 31.0, COLLNET_CHAIN: 30.0, NVLS: 18.0,
                             NVLS_TREE: 20.9}}
# tuning.cc perChMaxNVLSTreeBws (GB/s), per compCapIndex, indexed by nNodes (1, 2, more)
PER_CH_MAX_NVLS_TREE_BW = {AMPERE: (24.0, 23.6, 17.8), HOPPER: (0.0, 57.7, 45.5),
                           BLACKWELL: (0.0, 96.0, 80.0)}
COLLNET_ARITY_US = 0.4  # tuning.cc: "0.4 us arity serialization latency" (CollNet Direct)
COLLNET_DIRECT_AG_RS_NET = 0.9  # tuning.cc: AG/RS busBw = ppn x min(bwIntra, bwInter x 0.9)
COLLNET_DIRECT_SM90 = 0.85  # tuning.cc: Collnet Direct all-reduce busBw x .85 on SM90+
# The CollNet plugin simsp models is NVIDIA's SHARP plugin, which implements iallgather and
# ireducescatter (Mellanox/nccl-rdma-sharp-plugins src/sharp_plugin.c ncclCollNetPlugin_v8..v11;
# SHARP_DISABLE_ALLGATHER / _REDUCE_SCATTER default 0)
SHARP_PLUGIN_GATHERS = True
# enqueue.cc updateCollCostTable: CollNet Direct and Chain only up to NCCL_MAX_DIRECT_ARITY + 1
# local ranks (device.h: 7 + 1); NVLS outside all-reduce only up to NCCL_MAX_NVLS_ARITY
MAX_COLLNET_LOCAL_RANKS = 8


@dataclass(frozen=True)
class SharpGraph:
    """NCCL's graph for one of the four algorithms: channels (NVLS: the heads, one per GPU
    pulling from the switch) and per-channel bandwidths inside and between nodes (GB/s)."""

    channels: int
    bw_intra: float
    bw_inter: float


def sharp_enabled(algorithm: str, nodes: int, nvls_support: bool, collnet_enable: bool,
                  nvswitch: bool) -> bool:
    """tuning.cc 500-510 and init.cc: NVLS needs the multicast support (nvls.cc
    NCCL_NVLS_ENABLE=2 default: on where the NVSwitch can, H100 and later); NVLS_TREE is off on
    one node; CollNet Direct/Chain and multi-node NVLS need NCCL_COLLNET_ENABLE (off by
    default, and only with a CollNet plugin); CollNet Direct needs an NVSwitch system."""
    if algorithm in (NVLS, NVLS_TREE) and not nvls_support:
        return False
    if algorithm == NVLS_TREE and nodes == 1:
        return False
    if not collnet_enable and (algorithm in (COLLNET_DIRECT, COLLNET_CHAIN)
                               or (algorithm == NVLS and nodes > 1)):
        return False
    return not (algorithm == COLLNET_DIRECT and not nvswitch)


def _nvls_channel_bw(collective: str, algorithm: str, nodes: int, ppn: float,
                     graph: SharpGraph, compcap: str) -> float:
    """tuning.cc 307-323: NVLS busBw per channel: bwIntra x nvlsEfficiency x (nc-1)/nc, x2
    for an all-reduce (two operations pipelined) else x(ppn-1)/ppn, capped by bwInter (x2 for
    NVLS_TREE on two nodes) and, for NVLS_TREE, perChMaxNVLSTreeBw."""
    intra = graph.bw_intra * NVLS_EFFICIENCY[compcap] * (graph.channels - 1) / graph.channels
    intra *= 2.0 if collective == ALL_REDUCE else (ppn - 1) / ppn
    inter = graph.bw_inter * (2 if nodes <= 2 and algorithm == NVLS_TREE else 1)
    cap = (PER_CH_MAX_NVLS_TREE_BW[compcap][min(nodes, 3) - 1] if algorithm == NVLS_TREE
           else math.inf)
    return min(intra, inter, cap)


def sharp_bus_bandwidth(collective: str, algorithm: str, ranks: int, nodes: int,
                        graph: SharpGraph, compcap: str) -> float:
    """tuning.cc 305-385: the algorithm bandwidth (GB/s, after the busBw -> algbw ratio) of
    one of the four algorithms with Simple; 0 where NCCL gives it none (NVLS with fewer than
    2 channels; NVLS_TREE and CollNet Chain outside all-reduce; reduce-scatter and all-gather
    across nodes where a node has more ranks than CollNet heads, `graph.channels`)."""
    ppn = ranks / nodes
    gathers = collective in (REDUCE_SCATTER, ALL_GATHER)
    if (gathers and (algorithm in (NVLS_TREE, COLLNET_CHAIN) or not _gathers_across(
            nodes, ppn, graph))) or (algorithm in (NVLS, NVLS_TREE) and graph.channels < 2):
        return 0.0
    if algorithm in (NVLS, NVLS_TREE):
        bus = graph.channels * _nvls_channel_bw(collective, algorithm, nodes, ppn, graph,
                                                compcap)
    elif algorithm == COLLNET_DIRECT and gathers:
        bus = ppn * min(graph.bw_intra, graph.bw_inter * COLLNET_DIRECT_AG_RS_NET)
    else:  # CollNet: bw = bwIntra (tuning.cc 306)
        bus = graph.channels * graph.bw_intra
        if algorithm == COLLNET_DIRECT:
            factor = ppn / graph.channels  # GPU/NIC ratio
            bus /= factor - (factor - 1) / 2
            bus *= COLLNET_DIRECT_SM90 if compcap in (HOPPER, BLACKWELL) else 1.0
    if gathers:  # rings only convert reduce-scatter/all-gather busBw
        return bus
    return bus * (ranks / _nsteps(collective, ranks) if algorithm in (NVLS, NVLS_TREE) else 0.5)


def _gathers_across(nodes: int, ppn: float, graph: SharpGraph) -> bool:
    """tuning.cc 351-372: NVLS and CollNet Direct reduce-scatter / all-gather across nodes need
    the CollNet plugin's ireducescatter / iallgather (the SHARP plugin has both:
    Mellanox/nccl-rdma-sharp-plugins src/sharp_plugin.c, unless SHARP_DISABLE_REDUCE_SCATTER /
    SHARP_DISABLE_ALLGATHER) and every node's ranks within the CollNet heads (1:1 GPU:NIC;
    transport/coll_net.cc: the NVLS graph's heads, else CollNet Direct's)."""
    return nodes == 1 or (SHARP_PLUGIN_GATHERS and ppn <= graph.channels)


def sharp_latency_us(algorithm: str, ranks: int, nodes: int) -> float:
    """tuning.cc 388-430: base 0 plus, with intra = hwLatencies[NVLINK] and inter =
    hwLatencies[NET] (the tree's, 14 us, with one rank per node): CollNet Direct
    2(min(1, ppn-1) intra + 0.4 (ppn-1)) + inter; CollNet Chain 2(ppn-1) intra + inter; NVLS
    intra (+ inter across nodes); NVLS_TREE intra + 2 log2(nodes) inter."""
    ppn = ranks // nodes
    intra = SHARP_HW_LATENCY_US[NVLINK][algorithm]
    inter = HW_LATENCY_US[NET][TREE][SIMPLE] if ppn == 1 else SHARP_HW_LATENCY_US[NET][algorithm]
    if algorithm == COLLNET_DIRECT:
        return 2 * (min(1, ppn - 1) * intra + (ppn - 1) * COLLNET_ARITY_US) + inter
    if algorithm == COLLNET_CHAIN:
        return 2 * (ppn - 1) * intra + inter
    if algorithm == NVLS:
        return intra + (inter if nodes > 1 else 0.0)
    return intra + 2 * _log2i(nodes) * inter


def sharp_time_us(collective: str, algorithm: str, nbytes: int, ranks: int, nodes: int,
                  graph: SharpGraph, compcap: str, x86: bool = True) -> float | None:
    """tuning.cc ncclTopoGetAlgoTime for one operation: latency + bytes / (1000 x algbw), with
    the tree correction on an NVLS_TREE all-reduce on Blackwell x86 hosts; None where the
    bandwidth is 0 (NCCL's time -1: never chosen)."""
    bw = sharp_bus_bandwidth(collective, algorithm, ranks, nodes, graph, compcap)
    if bw == 0.0:
        return None
    log_size = _log2i(nbytes >> 6)
    if (algorithm == NVLS_TREE and collective == ALL_REDUCE and compcap == BLACKWELL and x86
            and 0 <= log_size < 24):
        bw *= TREE_CORRECTION[SIMPLE][log_size]
    return sharp_latency_us(algorithm, ranks, nodes) + nbytes / (1000 * bw)


MAX_NVLS_ARITY = search.MAX_NVLS_ARITY  # device.h NCCL_MAX_NVLS_ARITY


@lru_cache(maxsize=256)
def nvls_graph(gpus: int, nvlinks: int, compcap: str) -> SharpGraph:
    """NCCL's NVLS graph on one NVSwitch node (search.cc ncclTopoCompute, pattern NVLS, ported
    in nccl_graph_search.py): one head per GPU, min(NCCL_MAX_NVLS_ARITY, gpus), forced."""
    topo = search.Topology(gpus, False, nvlinks * plat.NVLINK_BW[compcap], 0.0, compcap)
    found = search.compute(topo, search.NVLS)
    return SharpGraph(found.channels, found.bw_intra, found.bw_inter)


def sharp_choice(collective: str, nbytes: int, ranks: int, nodes: int, graphs: dict,
                 compcap: str, enabled: dict, other_us: float) -> str | None:
    """The in-network algorithm NCCL would pick over the ring/tree it would otherwise run
    (estimated `other_us`), or None: enqueue.cc topoGetAlgoInfo keeps the first minimum in
    algorithm order (tree, ring, CollNet Direct, CollNet Chain, NVLS, NVLS_TREE), so one of
    these wins only when strictly faster. `graphs` and `enabled` are keyed by algorithm
    (`enabled` from sharp_enabled)."""
    best, best_us = None, other_us
    for algorithm in SHARP_ALGORITHMS:
        if not enabled.get(algorithm) or algorithm not in graphs:
            continue
        time_us = sharp_time_us(collective, algorithm, nbytes, ranks, nodes, graphs[algorithm],
                                compcap)
        if time_us is not None and time_us < best_us:
            best, best_us = algorithm, time_us
    return best
