"""What `simsp validate` can compare: each metric, its dimension, and how simsp computes it.

Iteration metrics come from a whole `simsp run` iteration (simulate_iteration + metrics.collect.collect,
with the same shortcuts `simsp run` takes); layer metrics from `simsp layer`'s simulate_layer;
activation bytes from rank 0's ledger; bus bandwidth from the engine's ring timing over every
GPU of the scenario's cluster (NCCL PERFORMANCE.md's busbw).
"""

from dataclasses import dataclass
import functools
from typing import Callable

from simsp.cluster.topology import build_topology
from simsp.scenario.config import Scenario
from simsp.engine.collectives.ring_alone import alone_time
from simsp.engine.collectives.ring_timing import busbw_GBps
from simsp.hardware.constants import LinkCalibration
from simsp.metrics.collect import collect
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
from simsp.units import GB

# dimension -> {unit: value of one unit in SI (seconds, bytes, fraction, bytes/s)}
UNITS = {"time": {"s": 1.0, "ms": 1e-3, "us": 1e-6},
         "bytes": {"B": 1.0, "KiB": 2.0 ** 10, "MiB": 2.0 ** 20, "GiB": 2.0 ** 30, "KB": 1e3,
                   "MB": 1e6, "GB": 1e9},
         "fraction": {"%": 0.01, "ratio": 1.0},
         "bandwidth": {"GB/s": GB}}
BUSBW_ELEM_BYTES = 4  # nccl-tests' default datatype: float


@dataclass(frozen=True)
class Job:
    """Everything a metric needs: the scenario, and per metric its extra inputs."""

    scenario: Scenario
    baseline: Scenario | None = None  # activation_ratio
    collective: str | None = None  # busbw
    size_bytes: int | None = None  # busbw


@dataclass(frozen=True)
class Metric:
    """A comparable quantity: its dimension, a line of description, and simsp's value (SI)."""

    dimension: str
    description: str
    evaluate: Callable[[Job], float]


@functools.lru_cache(maxsize=32)
def run_metrics(sc: Scenario) -> dict:
    """`simsp run`'s metrics of one iteration (cached: several rows may share a run)."""
    shortcuts = Shortcuts.for_scale(sc)
    return collect(simulate_iteration(sc, shortcuts), shortcuts)


@functools.lru_cache(maxsize=64)
def layer_numbers(sc: Scenario) -> tuple[float, float, int]:
    """`simsp layer`'s (forward s, backward s, rank 0 activation bytes) of one layer (its
    simulation, with the reference it can compare against, imported when a row asks)."""
    from simsp.training.driver.layer_sim import simulate_layer
    result = simulate_layer(sc)
    return result.forward_time_s, result.backward_time_s, result.records[0].activation_bytes


def busbw_Bps(job: Job) -> float:
    """Bus bandwidth (bytes/s) of `job.collective` of `job.size_bytes` over every GPU."""
    cluster = job.scenario.cluster
    gpus = list(range(cluster.num_gpus))
    seconds = alone_time(job.collective, build_topology(cluster), gpus, job.size_bytes,
                              calibration=LinkCalibration.from_cluster(cluster),
                              elem_bytes=BUSBW_ELEM_BYTES)
    return busbw_GBps(job.collective, len(gpus), job.size_bytes, seconds) * GB


METRICS = {
    "iteration_time": Metric("time", "one training iteration (simsp run)",
                             lambda job: run_metrics(job.scenario)["iteration_time_s"]),
    "mfu": Metric("fraction", "model FLOPs utilisation (K22 §6.3)",
                  lambda job: run_metrics(job.scenario)["mfu"]),
    "hfu": Metric("fraction", "hardware FLOPs utilisation (K22 §6.3)",
                  lambda job: run_metrics(job.scenario)["hfu"]),
    "peak_memory": Metric("bytes", "largest per-rank memory peak of an iteration",
                          lambda job: max(r["peak_bytes"] for r in run_metrics(job.scenario)["ranks"])),
    "layer_forward_time": Metric("time", "one layer's forward pass (simsp layer)",
                                 lambda job: layer_numbers(job.scenario)[0]),
    "layer_backward_time": Metric("time", "one layer's backward pass (simsp layer)",
                                  lambda job: layer_numbers(job.scenario)[1]),
    "layer_activation_bytes": Metric("bytes", "one layer's activations kept for backward",
                                     lambda job: layer_numbers(job.scenario)[2]),
    "activation_ratio": Metric("fraction", "layer activations over the baseline's",
                               lambda job: layer_numbers(job.scenario)[2]
                               / layer_numbers(job.baseline)[2]),
    "busbw": Metric("bandwidth", "nccl-tests bus bandwidth over every GPU", busbw_Bps),
}
