"""Whole-collective ring timing in closed form, and nccl-tests' bandwidth figures.

collective_time is the fast path for scale: it prices every step of every channel's ring at its
slowest hop without simulating flows, in O(n log n) for an n-member ring. tests/test_communicator.py shows it matches the stepwise simulation.
"""

import networkx as nx
import numpy as np

from simsp.cluster.topology import hop_route, route_latency_s
from simsp.engine.collectives import (DEFAULT_ELEM_BYTES, ChannelStats, CollectiveStats,
                                      element_count)
from simsp.engine.ring_plan import (ALL_GATHER, ALL_REDUCE, COLLECTIVES, REDUCE_SCATTER, Channel,
                                    channel_bytes, channel_rings, chunk_counts,
                                    position_bytes_sent, slice_counts)
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


def channel_hops(graph: nx.DiGraph, gpus: list[int], channels: list[Channel],
                 calibration: LinkCalibration) -> list[list[tuple[float, float]]]:
    """(latency_s, rate_Bps) of the hop from ring position i to i+1 of every channel.

    A hop's rate is its route's bottleneck: min over its links of achieved capacity divided by
    the number of hops of all channels crossing that link (fair sharing among them).
    """
    routes = [[hop_route(graph, gpus[ch.order[i]], gpus[ch.order[(i + 1) % len(ch.order)]],
                         ch.via[i]) for i in range(len(ch.order))] for ch in channels]
    load: dict[tuple[str, str], int] = {}
    for edges in (e for channel in routes for e in channel):
        for edge in edges:
            load[edge] = load.get(edge, 0) + 1
    share = {edge: _capacity_Bps(graph, edge, calibration) / count for edge, count in load.items()}
    delay = {edge: graph.edges[edge]["latency_s"] for edge in load}
    overhead_s = calibration.transfer_overhead_s
    hops = {}  # route -> (latency_s, rate_Bps)
    for edges in (e for channel in routes for e in channel):
        if edges not in hops:
            latency_s = sum(delay[e] for e in edges) + (overhead_s if edges else 0.0)
            hops[edges] = (latency_s, min((share[e] for e in edges), default=float("inf")))
    return [[hops[edges] for edges in channel] for channel in routes]


def _capacity_Bps(graph: nx.DiGraph, edge: tuple[str, str], calibration: LinkCalibration) -> float:
    """Achieved capacity of one link: configured bandwidth times its kind's efficiency."""
    data = graph.edges[edge]
    return data["bandwidth_Bps"] * calibration.efficiency(data["kind"])


def collective_time(collective: str, graph: nx.DiGraph, gpus: list[int], nbytes: int,
                    calibration: LinkCalibration | None = None,
                    elem_bytes: int = DEFAULT_ELEM_BYTES) -> float:
    """Seconds for a ring collective alone on the links: its channels run concurrently, each
    step of a channel lasting as long as its slowest hop's latency + chunk bytes / rate. For
    equal chunks on uniform hops this is steps * (latency + S/n / B) (docs/MODEL.md#collectives),
    e.g.
    all-reduce 2(n-1)/n * S/B plus 2(n-1) latencies.
    """
    return max(sum(times) for times in step_times(collective, graph, gpus, nbytes, calibration,
                                                  elem_bytes))


def step_times(collective: str, graph: nx.DiGraph, gpus: list[int], nbytes: int,
               calibration: LinkCalibration | None = None,
               elem_bytes: int = DEFAULT_ELEM_BYTES) -> list[list[float]]:
    """Closed-form duration of every step of every channel: [channel][step] seconds."""
    calibration = calibration or LinkCalibration()
    n = len(gpus)
    counts = chunk_counts(element_count(nbytes, elem_bytes), n)
    channels = channel_rings(list(gpus), graph.graph["gpus_per_node"])
    all_hops = channel_hops(graph, list(gpus), channels, calibration)
    phases = {ALL_REDUCE: (1, 0), REDUCE_SCATTER: (1,), ALL_GATHER: (0,)}[collective]
    times = []
    for channel, hops in zip(channels, all_hops):
        sizes = slice_counts(counts, len(channels), channel.index)
        chunk_bytes = [sizes[m] * elem_bytes for m in channel.order]
        times.append([t for first_hop in phases
                      for t in phase_step_times(hops, chunk_bytes, first_hop)])
    return times


def phase_step_times(hops: list[tuple[float, float]], chunk_bytes: list[int],
                     first_hop: int) -> list[float]:
    """The n-1 step times of one ring phase: at step s position p sends chunk
    (p - s - first_hop) mod n (ring_plan._phase); a step lasts its slowest hop's
    latency + bytes / rate. Hops and chunk sizes fall in a few classes, so the classes meeting
    at each step come from cyclic correlations of their indicator vectors (numpy FFT): O(n log n)
    per pair of classes instead of O(n^2), the same floats as the direct maximum."""
    n = len(hops)
    if n < 2:
        return []
    hop_classes = _classes(hops)
    byte_classes = _classes(chunk_bytes)
    best = np.full(n, -np.inf)  # (n,): step time by shift d = s + first_hop (mod n)
    for (latency_s, rate_Bps), positions in hop_classes.items():
        for size, chunks in byte_classes.items():
            meets = _cyclic_meets(positions, chunks, n)  # (n,) bool by shift
            best = np.where(meets, np.maximum(best, latency_s + size / rate_Bps), best)
    return [float(best[(s + first_hop) % n]) for s in range(n - 1)]


def _classes(values: list) -> dict:
    """Indices of every distinct value, by value (in first-appearance order)."""
    classes: dict = {}
    for index, value in enumerate(values):
        classes.setdefault(value, []).append(index)
    return classes


def _cyclic_meets(positions: list[int], chunks: list[int], n: int) -> np.ndarray:
    """For every shift d: does some position p in `positions` send a chunk (p - d) mod n in
    `chunks`? Cyclic cross-correlation of the two indicator vectors."""
    if len(positions) * len(chunks) <= 4 * n:
        meets = np.zeros(n, dtype=bool)  # (n,)
        for p in positions:
            meets[(p - np.asarray(chunks)) % n] = True
        return meets
    a, b = np.zeros(n), np.zeros(n)  # (n,) indicators
    a[positions], b[chunks] = 1.0, 1.0
    corr = np.fft.irfft(np.fft.rfft(a) * np.conj(np.fft.rfft(b)), n)  # (n,)
    return corr > 0.5


def closed_form_stats(collective: str, graph: nx.DiGraph, gpus: list[int], nbytes: int,
                      calibration: LinkCalibration | None = None,
                      elem_bytes: int = DEFAULT_ELEM_BYTES) -> CollectiveStats:
    """What the stepwise ring would report (bytes exact, times from step_times), starting at 0."""
    n = len(gpus)
    counts = chunk_counts(element_count(nbytes, elem_bytes), n)
    channels = channel_rings(list(gpus), graph.graph["gpus_per_node"])
    times = step_times(collective, graph, gpus, nbytes, calibration, elem_bytes)
    sent, received = channel_bytes(collective, counts, elem_bytes, channels)
    per_channel = []
    for channel, channel_times in zip(channels, times):
        sizes = [s * elem_bytes for s in slice_counts(counts, len(channels), channel.index)]
        per_channel.append(ChannelStats(
            channel.index, tuple(gpus[m] for m in channel.order), channel.via, channel.rail,
            sum(sizes), tuple(position_bytes_sent(collective, sizes, channel.order)), 0.0,
            sum(channel_times)))
    steps = (2 if collective == ALL_REDUCE else 1) * (n - 1)
    return CollectiveStats(collective, tuple(gpus), nbytes, steps, tuple(sent), tuple(received),
                           0.0, max(c.end_s for c in per_channel), tuple(per_channel))
