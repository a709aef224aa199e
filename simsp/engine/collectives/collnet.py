"""In-network reduction across nodes: NCCL's CollNet (IB SHARP, under --use-sharp) and NVLS_TREE
(NVLink SHARP in each node, NCCL's tree between: on by default, NCCL_NVLS_ENABLE=2 needs no
CollNet), picked by NCCL's own estimate and timed in closed form over simsp's links
(docs/nccl.md, "Across nodes").

NCCL's estimates (engine/collectives/nccl_tuning.py, "In-network reduction") need each
algorithm's graph. NVIDIA/nccl commit 5067397c (2.30.7): src/init.cc builds the CollNet Chain
graph with the ring graph's channels and the CollNet Direct and NVLS graphs (NVLS_TREE shares
NVLS's) with one head per NIC (src/graph/search.cc ncclTopoSearchRecNet: "NVLS search only
tries to find NIC:GPU combinations to compute the heads"); the NVLS and CollNet Chain graphs are
searched as search.cc ncclTopoCompute does (nccl_graph_search.py, on the compute capability's
speedArrayInter; src/graph/topo.cc: NIC bandwidth = link speed / 8, PCIe width x per-lane rate
/ 80), CollNet Direct's takes the first of those speeds within the GPU's path to its NIC.
simsp has one NIC per GPU (rails), so a node of p GPUs has p heads.

simsp times the pick, as it times one-node NVLS (engine/collectives/nvls.py), in closed form:
NCCL's latency (nccl_tuning.sharp_latency_us) plus the slower of the node's NVLink part and
its NIC part, each its bytes per GPU per direction over the tier's achieved rate (the two
run pipelined, chunk by chunk: src/device/all_reduce.h runs CollNet and NVLS_TREE as
concurrent intra-node and network warps). Bytes per GPU per direction, S the message, p GPUs
per node (the switch reduces, so a rank's share crosses its NIC once each way):
- CollNet Direct: NVLink 2 (p-1)/p S (scatter to the p heads, gather back); NIC S/p.
- CollNet Chain: NVLink 2 (p-1)/p S (each channel's chain of the p GPUs passes partial sums
  up p-1 hops to its NIC and the result down p-1 hops; the chains' heads spread over the p
  NICs, so each GPU carries (p-1)/p of the channels' hops each way); NIC S/p.
- NVLS (multi-node, over CollNet): NVLink S (1 + 1/p) at nvlsEfficiency, as one node's NVLS;
  NIC S/p.
- NVLS_TREE: NVLink as NVLS; the heads' slices S/p over a double binary tree of nodes
  (NCCL's tree, src/graph/trees.cc): S/p each way on 2 nodes (each sends its slice, receives
  the other's), 2 S/p beyond (a node is inner in one tree: two children up, two down).
Reduce-scatter and all-gather (the distributed optimizer's) run as NVLS or CollNet Direct
across nodes (tuning.cc: not NVLS_TREE nor Chain), through the SHARP plugin's
ireducescatter / iallgather, with at most one rank per CollNet head; per GPU per direction:
- CollNet Direct: NVLink (p-1)/p S (to and from the p heads: src/device/reduce_scatter.h
  and all_gather.h, RunWorkColl<..., NCCL_ALGO_COLLNET_DIRECT>); NIC S/p (its rail's S/p up,
  S/n down for a reduce-scatter; the reverse for an all-gather).
- NVLS: NVLink S at nvlsEfficiency (a reduce-scatter's multimem ld_reduce reads every slice
  of this GPU once; an all-gather's multicast store writes every slice to it once); NIC S/p.
It loads no link (as a tree or NVLS all-reduce: engine/timed_collectives.py), so beside other
traffic on the same NICs it is as fast as alone.
"""

from functools import lru_cache

from simsp.engine.collectives import nccl_graph_search as search
from simsp.engine.collectives import nccl_tuning as tuning
from simsp.engine.collectives.nccl_graphs import search_topology
from simsp.engine.collectives.nccl_platform import COMPCAP_BY_NVLINK, inter_node_speed
from simsp.engine.collectives.nvls import NVLS_EFFICIENCY
from simsp.units import GB

MULTI_NODE = (tuning.COLLNET_DIRECT, tuning.COLLNET_CHAIN, tuning.NVLS, tuning.NVLS_TREE)


def compcap_of(nvlink_generation: int) -> str:
    """NCCL's compute-capability row of a GPU by its NVLink generation (3: Ampere)."""
    return COMPCAP_BY_NVLINK.get(nvlink_generation, tuning.AMPERE)


@lru_cache(maxsize=256)
def multinode_graphs(ppn: int, nodes: int, nvlink_GBps: float, ib_GBps: float,
                     compcap: str) -> dict:
    """algorithm -> SharpGraph across nodes on the platform's search (nccl_graph_search, as
    init.cc runs it): CollNet Chain a tree (pattern TREE, collNet) with the ring graph's
    channels as its minChannels and maxChannels, NVLS and NVLS_TREE the NVLS heads' graph;
    CollNet Direct one head per NIC at the first inter-node speed within the NIC and its PCIe
    path (its search, ncclTopoSearchTryCollnetDirect, not ported). Memoised (do not mutate)."""
    topo = search_topology(nodes, ppn, nvlink_GBps, ib_GBps, compcap)
    ring = search.compute(topo, search.RING)
    chain = search.compute(topo, search.TREE, ring.channels, ring.channels)
    nvls = search.compute(topo, search.NVLS)
    speed = inter_node_speed(compcap, ib_GBps)
    return {tuning.COLLNET_DIRECT: tuning.SharpGraph(min(tuning.MAX_NVLS_ARITY, ppn), speed, speed),
            tuning.NVLS: _sharp(nvls), tuning.NVLS_TREE: _sharp(nvls),
            tuning.COLLNET_CHAIN: _sharp(chain)}


def _sharp(graph: search.SearchGraph) -> tuning.SharpGraph:
    """The searched graph as tuning.cc reads it: channels, bwIntra, bwInter."""
    return tuning.SharpGraph(graph.channels, graph.bw_intra, graph.bw_inter)


def tier_bytes(algorithm: str, nbytes: int, ppn: int, nodes: int,
               collective: str = tuning.ALL_REDUCE) -> tuple[float, float]:
    """(NVLink, NIC) bytes per GPU per direction of a collective of `nbytes` (the full S;
    module doc); a reduce-scatter or all-gather moves one half of the all-reduce's."""
    if collective != tuning.ALL_REDUCE:
        nvlink = nbytes if algorithm == tuning.NVLS else (ppn - 1) / ppn * nbytes
        return nvlink, nbytes / ppn
    nic = nbytes / ppn * (2 if algorithm == tuning.NVLS_TREE and nodes > 2 else 1)
    if algorithm in (tuning.COLLNET_DIRECT, tuning.COLLNET_CHAIN):
        return 2 * (ppn - 1) / ppn * nbytes, nic
    return nbytes * (1 + 1 / ppn), nic


def sharp_all_reduce_time(algorithm: str, nbytes: int, ranks: int, nodes: int, nvlink_GBps: float,
                          ib_GBps: float, calibration, nvlink_generation: int,
                          collective: str = tuning.ALL_REDUCE) -> float:
    """Seconds of a multi-node `collective` (an all-reduce unless told) run as `algorithm`:
    NCCL's latency plus the slower tier (module doc); NVLS's NVLink part at nvlsEfficiency."""
    ppn = ranks // nodes
    intra_bytes, nic_bytes = tier_bytes(algorithm, nbytes, ppn, nodes, collective)
    intra_rate = nvlink_GBps * GB * calibration.nvlink_efficiency
    if algorithm in (tuning.NVLS, tuning.NVLS_TREE):
        intra_rate *= NVLS_EFFICIENCY[nvlink_generation]
    nic_rate = ib_GBps * GB * calibration.ib_efficiency
    latency_s = tuning.sharp_latency_us(algorithm, ranks, nodes) * 1e-6
    return latency_s + max(intra_bytes / intra_rate if ppn > 1 else 0.0, nic_bytes / nic_rate)


def sharp_pick(nbytes: int, ranks: int, nodes: int, nvlink_GBps: float, ib_GBps: float,
               calibration, other_estimate_us: float,
               collective: str = tuning.ALL_REDUCE) -> str | None:
    """The in-network algorithm NCCL would run this multi-node `collective` as, or None (its
    ring or tree, estimated `other_estimate_us`, stays): NCCL_ALGO / NCCL_PROTO leaving the
    choice open (these run Simple), each algorithm enabled as tuning.cc and enqueue.cc say
    (NVLS_TREE on an NVSwitch-3+ system; CollNet and multi-node NVLS only with the
    calibration's NCCL_COLLNET_ENABLE over a SHARP fabric, `sharp_collnet`; CollNet up to 8
    ranks a node, NVLS reduce-scatter / all-gather up to 32), and NCCL's estimates compared
    (nccl_tuning.sharp_choice: strictly faster than the ring or tree)."""
    if (nodes < 2 or ranks % nodes or calibration.nccl_algo is not None
            or calibration.nccl_proto not in (None, tuning.SIMPLE)):
        return None
    generation = calibration.nvls_nvlink_generation
    compcap, ppn = compcap_of(generation), ranks // nodes
    enabled = {a: tuning.sharp_enabled(a, nodes, generation in NVLS_EFFICIENCY,
                                       calibration.sharp_collnet, True)
               and _fits(a, collective, ppn) for a in MULTI_NODE}
    graphs = multinode_graphs(ppn, nodes, nvlink_GBps, ib_GBps, compcap)
    return tuning.sharp_choice(collective, nbytes, ranks, nodes, graphs, compcap, enabled,
                               other_estimate_us)


def _fits(algorithm: str, collective: str, ppn: int) -> bool:
    """enqueue.cc updateCollCostTable: CollNet Direct / Chain need at most 8 local ranks;
    NVLS outside all-reduce at most NCCL_MAX_NVLS_ARITY."""
    if algorithm in (tuning.COLLNET_DIRECT, tuning.COLLNET_CHAIN):
        return ppn <= tuning.MAX_COLLNET_LOCAL_RANKS
    return not (algorithm == tuning.NVLS and collective != tuning.ALL_REDUCE
                and ppn > tuning.MAX_NVLS_ARITY)


def sharp_in_group(gpus: tuple[int, ...], nbytes: int, gpus_per_node: int, nvlink_GBps: float,
                   ib_GBps: float, calibration, other_estimate_us: float,
                   collective: str = tuning.ALL_REDUCE) -> tuple | None:
    """(algorithm, seconds, bytes each GPU sends) of this collective where NCCL would run it
    in the network across nodes (sharp_pick), else None."""
    nodes, ranks = len({gpu // gpus_per_node for gpu in gpus}), len(gpus)
    algorithm = sharp_pick(nbytes, ranks, nodes, nvlink_GBps, ib_GBps, calibration,
                           other_estimate_us, collective)
    if algorithm is None:
        return None
    seconds = sharp_all_reduce_time(algorithm, nbytes, ranks, nodes, nvlink_GBps, ib_GBps,
                                    calibration, calibration.nvls_nvlink_generation, collective)
    sent = tier_bytes(algorithm, nbytes, ranks // nodes, nodes, collective)
    return algorithm, seconds, round(sum(sent))
