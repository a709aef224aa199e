"""An NCCL choice for a group of GPUs on simsp's topology, and what it does to a hop.

engine/collectives/nccl_tuning.py decides from a group's shape (ranks, nodes, link speeds); this module reads
that shape off the cluster graph and turns the choice into per-hop terms the ring timing uses in
closed form (engine/collectives/ring_timing.py) and step by step (engine/collectives/ring.py): a latency factor
by tier and the bytes a link carries per data byte.
"""

import networkx as nx

from simsp.engine.collectives.nccl_tuning import RING, NcclChoice, choose
from simsp.engine.collectives.ring_plan import ALL_REDUCE
from simsp.hardware.constants import LinkCalibration
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
                  calibration.nccl_proto)


def hop_latency_scale(graph: nx.DiGraph, edges, choice: NcclChoice) -> float:
    """The choice's latency factor for a hop: inter-node if its route crosses InfiniBand."""
    inter = any(graph.edges[e]["kind"] == "ib" for e in edges)
    return choice.inter_latency_scale if inter else choice.intra_latency_scale


def wire_bytes(nbytes: int, choice: NcclChoice) -> float:
    """Bytes a link carries for `nbytes` of data under `choice` (protocol and channel use as a
    fraction of ring/Simple's rate); exactly `nbytes` for ring/Simple on every channel."""
    fraction = choice.bandwidth_fraction
    return nbytes if fraction == 1.0 else nbytes / fraction
