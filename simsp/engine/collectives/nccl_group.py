"""An NCCL choice for a group of GPUs on simsp's topology, and what it does to a hop.

engine/collectives/nccl_tuning.py decides from a group's shape (ranks, nodes, link speeds); this module reads
that shape off the cluster graph and turns the choice into per-hop terms the ring timing uses in
closed form (engine/collectives/ring_timing.py) and step by step (engine/collectives/ring.py): a hop's step
latency (NCCL's own per tier, scaled by calibrated link latencies), a ring's pipelined step
latency, and the bytes a link carries per data byte (docs/nccl.md).
"""

import networkx as nx

from simsp.cluster.topology import hop_route
from simsp.engine.collectives.nccl_platform import platform_of
from simsp.engine.collectives.nccl_tuning import RING, NcclChoice, choose
from simsp.engine.collectives.ring_plan import ALL_REDUCE, Channel
from simsp.hardware.constants import LinkCalibration
from simsp.scenario.config import Cluster
from simsp.units import GB


def link_speeds_GBps(graph: nx.DiGraph) -> tuple[float, float]:
    """(NVLink per GPU, InfiniBand per NIC) bandwidth in GB/s per direction, as configured."""
    if "link_GBps" not in graph.graph:
        speeds = {}
        for _u, _v, data in graph.edges(data=True):
            speeds.setdefault(data["kind"], data["bandwidth_Bps"] / GB)
            if len(speeds) == 2:
                break
        graph.graph["link_GBps"] = (speeds.get("nvlink", 0.0), speeds.get("ib", 0.0))
    return graph.graph["link_GBps"]


def nccl_choice(collective: str, graph: nx.DiGraph, gpus: list[int], nbytes: int,
                calibration: LinkCalibration | None = None,
                algorithm: str | None = None) -> NcclChoice:
    """What NCCL runs for this collective on this group (engine/nccl_tuning.choose), forced by
    the calibration's nccl_algo / nccl_proto (NCCL_ALGO / NCCL_PROTO) or by `algorithm`; a
    forced tree applies to all-reduce only (NCCL_ALGO="allreduce:tree")."""
    calibration = calibration or LinkCalibration()
    forced = algorithm or calibration.nccl_algo
    if collective != ALL_REDUCE:
        forced = RING
    nodes = len({gpu // graph.graph["gpus_per_node"] for gpu in gpus})
    nvlink, ib = link_speeds_GBps(graph)
    return choose(collective, nbytes, len(gpus), nodes, nvlink, ib, forced,
                  calibration.nccl_proto, platform_of(*calibration.nccl_platform))


def hop_step_latency_s(graph: nx.DiGraph, edges, choice: NcclChoice,
                       overhead_s: float = 0.0) -> float:
    """One step's latency over this hop under `choice`: NCCL's own per-step latency of its tier
    (tuning.cc; inter-node if the route crosses InfiniBand) times the hop's latency as the
    network sees it (its links' + the transfer overhead) over the same route's on the default
    links. On the default links a step costs exactly NCCL's; calibrated latencies scale it."""
    inter = any(graph.edges[e]["kind"] == "ib" for e in edges)
    step_s = choice.inter_step_s if inter else choice.intra_step_s
    default_s = sum(DEFAULT_EDGE_LATENCY_S[graph.edges[e]["kind"]] for e in edges)
    configured_s = sum(graph.edges[e]["latency_s"] for e in edges) + overhead_s
    return step_s * configured_s / default_s if default_s > 0 else configured_s


# the default links' latency per edge (scenario/table/cluster.py defaults): half of
# nvlink_latency_us on each GPU-NVSwitch edge (cluster/topology.py), ib_latency_us per IB link
DEFAULT_EDGE_LATENCY_S = {"nvlink": Cluster.nvlink_latency_us * 1e-6 / 2,
                          "ib": Cluster.ib_latency_us * 1e-6}


def ring_hop_latencies(graph: nx.DiGraph, gpus: list[int], channel: Channel, choice: NcclChoice,
                       overhead_s: float = 0.0) -> list[float]:
    """[position] the step latency of the hop from ring position p to p+1 (hop_step_latency_s)."""
    n = len(channel.order)
    return [hop_step_latency_s(graph, hop_route(graph, gpus[channel.order[p]],
                                                gpus[channel.order[(p + 1) % n]],
                                                channel.via[p]), choice, overhead_s)
            for p in range(n)]


def pipelined_step_latency_s(hop_latencies: list[float]) -> float:
    """The latency of every step of a ring whose hops have `hop_latencies`, as NCCL's model
    charges a ring (tuning.cc: base + (nsteps - 2(nodes-1)) intra + 2(nodes-1) inter steps for
    an all-reduce, n-1 steps with nodes-1 crossings per phase): a chunk moves over n-1 of the
    ring's n hops each phase, paying each hop's latency once as it travels, and skips the
    slowest (a node crossing when there is one); spread evenly over the phase's n-1 steps."""
    n = len(hop_latencies)
    if n < 2:
        return 0.0
    return (sum(hop_latencies) - max(hop_latencies)) / (n - 1)


def wire_bytes(nbytes: int, choice: NcclChoice) -> float:
    """Bytes a link carries for `nbytes` of data under `choice` (protocol and channel use as a
    fraction of ring/Simple's rate); exactly `nbytes` for ring/Simple on every channel."""
    fraction = choice.bandwidth_fraction
    return nbytes if fraction == 1.0 else nbytes / fraction
