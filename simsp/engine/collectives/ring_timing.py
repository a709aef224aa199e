"""Whole-collective ring timing in closed form, and nccl-tests' bandwidth figures.

collective_time is the fast path for scale: it prices every step of every channel's ring at its
slowest hop without simulating flows, in O(n log n) for an n-member ring. tests/test_communicator.py
shows it matches the stepwise simulation.
Every collective runs as NCCL would pick it (engine/collectives/nccl_tuning.py, docs/nccl.md): every step
of a ring pays the ring's pipelined step latency (NCCL's own per-hop latencies, each paid once
as a chunk travels: nccl_group.pipelined_step_latency_s), its protocol scales the bytes a link
carries per data byte, its base latency is paid once per call, and an all-reduce NCCL runs as a
tree is timed by tree_time.
"""

import networkx as nx
import numpy as np

from simsp.cluster.topology import hop_route
from simsp.engine.collectives.ring import (DEFAULT_ELEM_BYTES, ChannelStats, CollectiveStats,
                                      element_count)
from simsp.engine.collectives.nccl_group import (nccl_choice, pipelined_step_latency_s,
                                                ring_hop_latencies)
from simsp.engine.collectives.nccl_tuning import RING, TREE, NcclChoice, tree_correction
from simsp.engine.collectives.ring_plan import (ALL_GATHER, ALL_REDUCE, COLLECTIVES, REDUCE_SCATTER, Channel,
                                    channel_bytes, channel_rings, chunk_counts, members_by_node,
                                    position_bytes_sent, slice_counts)
from simsp.hardware.constants import LinkCalibration
from simsp.units import GB


def bus_factor(collective: str, n: int) -> float:
    """NVIDIA/nccl-tests doc/PERFORMANCE.md: busbw = algbw * 2(n-1)/n for all-reduce,
    * (n-1)/n for RS and AG."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}")
    return (2 if collective == ALL_REDUCE else 1) * (n - 1) / n


def algbw_GBps(nbytes: int, time_s: float) -> float:
    """NVIDIA/nccl-tests doc/PERFORMANCE.md: algbw = S / time, in GB/s (1e9 bytes/s)."""
    return nbytes / time_s / GB if time_s > 0 else 0.0


def busbw_GBps(collective: str, n: int, nbytes: int, time_s: float) -> float:
    """Bus bandwidth: algbw times the collective's bus factor, comparable to link speed."""
    return algbw_GBps(nbytes, time_s) * bus_factor(collective, n)


def channel_hops(graph: nx.DiGraph, gpus: list[int], channels: list[Channel],
                 calibration: LinkCalibration,
                 choice: NcclChoice | None = None) -> list[list[tuple[float, float]]]:
    """(latency_s, rate_Bps) of the hop from ring position i to i+1 of every channel.

    A hop's rate is its route's bottleneck: min over its links of achieved capacity divided by
    the number of hops of all channels crossing that link (fair sharing among them); its
    latency the route's link latencies + the transfer overhead. With an NCCL `choice`, the rate
    is scaled by the choice's bandwidth fraction (per data byte) and every hop of a channel
    takes the ring's pipelined step latency (nccl_group.pipelined_step_latency_s over NCCL's
    per-hop step latencies, docs/nccl.md).
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
            rate_Bps = min((share[e] for e in edges), default=float("inf"))
            hops[edges] = (latency_s, rate_Bps)
    if choice is None:
        return [[hops[edges] for edges in channel] for channel in routes]
    steps = [pipelined_step_latency_s(ring_hop_latencies(graph, gpus, ch, choice, overhead_s))
             for ch in channels]
    return [[(step_s, hops[edges][1] * choice.bandwidth_fraction) for edges in channel]
            for step_s, channel in zip(steps, routes)]


def _capacity_Bps(graph: nx.DiGraph, edge: tuple[str, str], calibration: LinkCalibration) -> float:
    """Achieved capacity of one link: configured bandwidth times its kind's efficiency."""
    data = graph.edges[edge]
    return data["bandwidth_Bps"] * calibration.efficiency(data["kind"])


def collective_time(collective: str, graph: nx.DiGraph, gpus: list[int], nbytes: int,
                    calibration: LinkCalibration | None = None,
                    elem_bytes: int = DEFAULT_ELEM_BYTES) -> float:
    """Seconds for a collective alone on the links, run as NCCL picks it: a tree all-reduce
    (tree_time), or a ring whose channels run concurrently, each step of a channel lasting as
    long as the ring's pipelined step latency + its slowest hop's chunk bytes / rate, after
    NCCL's base latency. For equal chunks on uniform hops this is steps * (latency + S/n / B)
    (docs/MODEL.md#collectives), e.g. all-reduce 2(n-1)/n * S/B plus 2(n-1) latencies.
    """
    choice = nccl_choice(collective, graph, gpus, nbytes, calibration)
    if choice.algorithm == TREE:
        return tree_time(graph, gpus, nbytes, calibration, choice)
    return choice.base_latency_s + max(sum(times) for times in step_times(
        collective, graph, gpus, nbytes, calibration, elem_bytes))


def tree_time(graph: nx.DiGraph, gpus: list[int], nbytes: int,
              calibration: LinkCalibration | None, choice: NcclChoice) -> float:
    """NCCL's tree all-reduce in closed form (tuning.cc's model over simsp's links): the base
    latency, 2((ppn-1) intra + floor(log2 nodes) inter) steps at the tree's step latencies on
    the ring's hops (nccl_group.hop_step_latency_s, the slowest of each tier), and S at half the
    ring/Simple bus rate of the group's links times the tree's bandwidth fraction and NCCL's
    tree correction factor for this size."""
    calibration = calibration or LinkCalibration()
    channels = channel_rings(list(gpus), graph.graph["gpus_per_node"])
    hops = channel_hops(graph, list(gpus), channels, calibration)
    bus_Bps = sum(min(rate for _lat, rate in channel) for channel in hops)
    steps = ring_hop_latencies(graph, list(gpus), channels[0], choice,
                               calibration.transfer_overhead_s)
    intra_s, inter_s = _tier_latencies(graph, list(gpus), channels[0], steps)
    by_node = members_by_node(list(gpus), graph.graph["gpus_per_node"])
    per_node, nodes = len(by_node[0]), len(by_node)
    latency_s = choice.base_latency_s + 2 * (
        (per_node - 1) * intra_s + (nodes.bit_length() - 1) * inter_s)
    rate_Bps = 0.5 * bus_Bps * choice.bandwidth_fraction * tree_correction(choice.protocol,
                                                                           nbytes)
    return latency_s + nbytes / rate_Bps


def _tier_latencies(graph: nx.DiGraph, gpus: list[int], channel: Channel,
                    latencies: list[float]) -> tuple[float, float]:
    """(slowest intra-node, slowest inter-node) of one ring channel's hop `latencies`."""
    intra, inter = 0.0, 0.0
    n = len(channel.order)
    for p, latency_s in enumerate(latencies):
        src, dst = gpus[channel.order[p]], gpus[channel.order[(p + 1) % n]]
        if src // graph.graph["gpus_per_node"] == dst // graph.graph["gpus_per_node"]:
            intra = max(intra, latency_s)
        else:
            inter = max(inter, latency_s)
    return intra, inter


def step_times(collective: str, graph: nx.DiGraph, gpus: list[int], nbytes: int,
               calibration: LinkCalibration | None = None,
               elem_bytes: int = DEFAULT_ELEM_BYTES) -> list[list[float]]:
    """Closed-form duration of every step of every channel of the ring: [channel][step]
    seconds, at the protocol NCCL would run this ring with (the base latency not included)."""
    calibration = calibration or LinkCalibration()
    n = len(gpus)
    counts = chunk_counts(element_count(nbytes, elem_bytes), n)
    channels = channel_rings(list(gpus), graph.graph["gpus_per_node"])
    choice = nccl_choice(collective, graph, gpus, nbytes, calibration, RING)
    all_hops = channel_hops(graph, list(gpus), channels, calibration, choice)
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
    """What the stepwise ring would report (bytes exact, times from step_times after the base
    latency), starting at 0."""
    n = len(gpus)
    counts = chunk_counts(element_count(nbytes, elem_bytes), n)
    channels = channel_rings(list(gpus), graph.graph["gpus_per_node"])
    choice = nccl_choice(collective, graph, gpus, nbytes, calibration, RING)
    times = step_times(collective, graph, gpus, nbytes, calibration, elem_bytes)
    sent, received = channel_bytes(collective, counts, elem_bytes, channels)
    per_channel = []
    for channel, channel_times in zip(channels, times):
        sizes = [s * elem_bytes for s in slice_counts(counts, len(channels), channel.index)]
        per_channel.append(ChannelStats(
            channel.index, tuple(gpus[m] for m in channel.order), channel.via, channel.rail,
            sum(sizes), tuple(position_bytes_sent(collective, sizes, channel.order)), 0.0,
            choice.base_latency_s + sum(channel_times)))
    steps = (2 if collective == ALL_REDUCE else 1) * (n - 1)
    return CollectiveStats(collective, tuple(gpus), nbytes, steps, tuple(sent), tuple(received),
                           0.0, max(c.end_s for c in per_channel), tuple(per_channel),
                           RING, choice.protocol, choice.nchannels)
