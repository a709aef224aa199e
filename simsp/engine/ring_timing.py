"""Whole-collective ring timing in closed form, and nccl-tests' bandwidth figures.

collective_time is the fast path for scale: it prices every ring step at its slowest hop without
simulating flows. tests/test_communicator.py shows it matches the stepwise simulation.
"""

import networkx as nx

from simsp.cluster.topology import gpu_name, route, route_latency_s
from simsp.engine.collectives import DEFAULT_ELEM_BYTES, element_count
from simsp.engine.ring_plan import ALL_REDUCE, COLLECTIVES, STEPS, chunk_counts
from simsp.hardware import LinkCalibration
from simsp.units import GB


def bus_factor(collective: str, n: int) -> float:
    """NCCL PERFORMANCE.md: busbw = algbw * 2(n-1)/n for all-reduce, * (n-1)/n for RS and AG."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}")
    return (2 if collective == ALL_REDUCE else 1) * (n - 1) / n


def algbw_GBps(nbytes: int, time_s: float) -> float:
    """NCCL PERFORMANCE.md: algbw = S / time, in GB/s (1e9 bytes/s)."""
    return nbytes / time_s / GB if time_s > 0 else 0.0


def busbw_GBps(collective: str, n: int, nbytes: int, time_s: float) -> float:
    """Bus bandwidth: algbw times the collective's bus factor, comparable to link speed."""
    return algbw_GBps(nbytes, time_s) * bus_factor(collective, n)


def ring_hops(graph: nx.DiGraph, gpus: list[int],
              calibration: LinkCalibration) -> list[tuple[float, float]]:
    """(latency_s, rate_Bps) of the hop from ring position i to i+1, for every i.

    A hop's rate is its route's bottleneck: min over its links of achieved capacity divided by
    the number of this ring's hops crossing that link (fair sharing among them).
    """
    n = len(gpus)
    routes = [route(graph, gpu_name(gpus[i]), gpu_name(gpus[(i + 1) % n])) for i in range(n)]
    load: dict[tuple[str, str], int] = {}
    for edges in routes:
        for edge in edges:
            load[edge] = load.get(edge, 0) + 1
    hops = []
    for edges in routes:
        rates = [_capacity_Bps(graph, edge, calibration) / load[edge] for edge in edges]
        latency_s = route_latency_s(graph, edges)
        latency_s += calibration.transfer_overhead_s if edges else 0.0
        hops.append((latency_s, min(rates, default=float("inf"))))
    return hops


def _capacity_Bps(graph: nx.DiGraph, edge: tuple[str, str], calibration: LinkCalibration) -> float:
    """Achieved capacity of one link: configured bandwidth times its kind's efficiency."""
    data = graph.edges[edge]
    return data["bandwidth_Bps"] * calibration.efficiency(data["kind"])


def collective_time(collective: str, graph: nx.DiGraph, gpus: list[int], nbytes: int,
                    calibration: LinkCalibration | None = None,
                    elem_bytes: int = DEFAULT_ELEM_BYTES) -> float:
    """Seconds for a ring collective alone on the links: each step lasts as long as its slowest
    hop's latency + chunk bytes / rate. For equal chunks on uniform hops this is REFERENCE.md §5's
    steps * (latency + S/n / B), e.g. all-reduce 2(n-1)/n * S/B plus 2(n-1) latencies.
    """
    calibration = calibration or LinkCalibration()
    n = len(gpus)
    chunk_bytes = [c * elem_bytes for c in chunk_counts(element_count(nbytes, elem_bytes), n)]
    hops = ring_hops(graph, gpus, calibration)
    total_s = 0.0
    for step in STEPS[collective](n):
        total_s += max(hops[s.src][0] + chunk_bytes[s.chunk] / hops[s.src][1] for s in step.sends)
    return total_s
