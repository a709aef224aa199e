"""The forward model of a calibration: simsp's own timing of the measured collective.

For link parameters (the [cluster] fields below) the predicted time of each measured size is
simsp.engine.collectives.ring_alone.alone_time (the collective alone on its links, as meta mode times it)
over simsp.cluster.topology.build_topology of the measured layout, so simulating with the fitted
fragment reproduces the fitted times exactly. The closed form (engine/collectives/ring_timing.py
collective_time: an upper bound where a ring's channels share a port, docs/shortcuts.md) is the
cheap approximation the fit starts from.
"""

from dataclasses import replace
from functools import lru_cache

import numpy as np

from simsp.calibrate.layout import Measurement
from simsp.cluster.topology import build_topology
from simsp.scenario.config import Cluster
from simsp.calibrate.nccl_log import ALL_TO_ALL
from simsp.engine.collectives.all_to_all import time_all_to_all
from simsp.engine.collectives.ring_alone import alone_time
from simsp.engine.collectives.ring_timing import algbw_GBps, busbw_GBps, collective_time
from simsp.hardware.constants import LinkCalibration

# The link calibration fields of [cluster] (simsp.hardware.constants.LinkCalibration.from_cluster and the
# per-hop latencies build_topology puts on the edges).
LINK_FIELDS = ("nvlink_efficiency", "nvlink_latency_us", "ib_efficiency", "ib_latency_us",
               "transfer_overhead_us")
BANDWIDTH_FIELDS = ("nvlink_bandwidth_GBps", "ib_bandwidth_GBps")


def link_values(cluster: Cluster) -> dict[str, float]:
    """{field: value} of the link calibration fields of a cluster."""
    return {name: getattr(cluster, name) for name in LINK_FIELDS}


def measured_cluster(base: Cluster, m: Measurement, links: dict[str, float]) -> Cluster:
    """The base cluster cut to the run's nodes (a node as big as base's, or the run's ranks per
    node if larger) with the given link fields."""
    per_node = max(base.gpus_per_node, m.ranks_per_node)
    return replace(base, nodes=m.nodes, gpus_per_node=per_node, **links)


def ring_gpus(cluster: Cluster, m: Measurement) -> list[int]:
    """Global GPU indices of the ranks in rank order: the first ranks_per_node GPUs of each node
    (mpirun's by-node fill, as the Rank lines list them)."""
    return [node * cluster.gpus_per_node + local for node in range(m.nodes)
            for local in range(m.ranks_per_node)]


def predicted_times_s(base: Cluster, m: Measurement, links: dict[str, float],
                      exact: bool = True) -> np.ndarray:
    """Engine time of every observation of `m` (shape (len(m.sizes_bytes),)), in seconds: the
    collective alone on its links, or (exact False) its closed form, which runs no simulation.
    Kept per (cluster, run, link values, model): a fit and its report ask for the same ones."""
    return np.array(_times_s(base, m, tuple(sorted(links.items())), exact))  # (observations,)


@lru_cache(maxsize=256)
def _times_s(base: Cluster, m: Measurement, links: tuple, exact: bool) -> tuple[float, ...]:
    """predicted_times_s with hashable arguments (links as sorted (field, value) pairs)."""
    cluster = measured_cluster(base, m, dict(links))
    graph = build_topology(cluster)
    calibration = LinkCalibration.from_cluster(cluster)
    gpus = ring_gpus(cluster, m)
    if m.collective == ALL_TO_ALL:  # every pair at once over the links (engine/collectives/all_to_all.py)
        by_size = {size: time_all_to_all(graph, gpus, size, calibration)[1]
                   for size in sorted(set(m.sizes_bytes))}
    else:
        timing = alone_time if exact else collective_time
        by_size = {size: timing(m.collective, graph, gpus, size, calibration=calibration,
                                elem_bytes=m.elem_bytes)
                   for size in sorted(set(m.sizes_bytes))}
    return tuple(by_size[size] for size in m.sizes_bytes)


def busbw_of(m: Measurement, size_bytes: int, time_s: float) -> float:
    """nccl-tests' bus bandwidth (GB/s) of one observation (all-to-all: algbw·(n-1)/n,
    nccl-tests src/alltoall.cu)."""
    if m.collective == ALL_TO_ALL:
        return algbw_GBps(size_bytes, time_s) * (m.ranks - 1) / m.ranks
    return busbw_GBps(m.collective, m.ranks, size_bytes, time_s)
