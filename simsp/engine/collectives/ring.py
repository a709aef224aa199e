"""Ring collectives executed step by step over a Network, as simpy process bodies.

Each rank of the ring runs its own loop: at every step it sends one chunk to its successor over
the network, waits for the chunk from its predecessor, and adds it (reduce-scatter) or stores it
(all-gather). Time emerges from the transfers. Numeric mode moves and adds real numpy chunks;
meta mode (buffers None) moves sizes only. Use as `results, stats = yield from ring_...(...)`.
A collective runs as NCCL's channels (ring_plan.channel_rings): concurrent rings, channel c
carrying slice c of every chunk, so rank i still ends with its whole contiguous chunk i.
"""

from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import simpy

from simsp.engine.collectives.nccl_group import (nccl_choice, pipelined_step_latency_s,
                                                ring_hop_latencies, wire_bytes)
from simsp.engine.collectives.nccl_tuning import RING, NcclChoice
from simsp.engine.network import Network
from simsp.engine.collectives.ring_plan import (ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, Channel, RingStep,
                                    all_gather_steps, channel_rings, chunk_counts, chunk_offsets,
                                    reduce_scatter_steps, slice_counts)

DEFAULT_ELEM_BYTES = 2  # fp16/bf16 training dtype (docs/MODEL.md#accounting-rules)


@dataclass(frozen=True)
class ChannelStats:
    """What one channel (ring) of a collective did: its ring, rail, bytes and span."""

    index: int
    gpus: tuple[int, ...]  # in ring order
    via: tuple[int | None, ...]  # per ring position: the relaying GPU (PXN) or None
    rail: int | None  # NIC index its node-crossing hops use; None inside one node
    nbytes: int  # bytes of the message this channel carries
    bytes_sent: tuple[int, ...]  # per ring position
    start_s: float
    end_s: float

    @property
    def time_s(self) -> float:
        """Seconds from the channel's first send to its last delivery."""
        return self.end_s - self.start_s

    def followed_by(self, other: "ChannelStats") -> "ChannelStats":
        """This channel's phase then `other`'s on the same ring."""
        return ChannelStats(self.index, self.gpus, self.via, self.rail, self.nbytes,
                            tuple(a + b for a, b in zip(self.bytes_sent, other.bytes_sent)),
                            self.start_s, other.end_s)


@dataclass(frozen=True)
class CollectiveStats:
    """What one collective did: steps, bytes per ring position, and when it ran."""

    collective: str
    gpus: tuple[int, ...]
    nbytes: int  # S: the full (reduced or gathered) message size
    steps: int
    bytes_sent: tuple[int, ...]  # per ring position
    bytes_received: tuple[int, ...]  # per ring position
    start_s: float
    end_s: float
    channels: tuple[ChannelStats, ...] = ()  # one per NCCL channel (empty: not recorded)
    algorithm: str = "ring"  # NCCL's algorithm and protocol (engine/collectives/nccl_tuning.py)
    protocol: str = ""
    nchannels: int = 0  # NCCL channels (CTAs) used; 0: not recorded

    @property
    def time_s(self) -> float:
        """Seconds from the first send to the last delivery."""
        return self.end_s - self.start_s

    def followed_by(self, other: "CollectiveStats", collective: str) -> "CollectiveStats":
        """Stats of this collective then `other` on the same ring, as one `collective`."""
        return CollectiveStats(
            collective, self.gpus, self.nbytes, self.steps + other.steps,
            tuple(a + b for a, b in zip(self.bytes_sent, other.bytes_sent)),
            tuple(a + b for a, b in zip(self.bytes_received, other.bytes_received)),
            self.start_s, other.end_s,
            tuple(a.followed_by(b) for a, b in zip(self.channels, other.channels)),
            self.algorithm, self.protocol, self.nchannels)


def element_count(nbytes: int, elem_bytes: int) -> int:
    """Elements in an `nbytes` message of `elem_bytes`-byte elements (must divide exactly)."""
    if nbytes < 0 or elem_bytes < 1 or nbytes % elem_bytes:
        raise ValueError(f"{nbytes} bytes is not a whole number of {elem_bytes}-byte elements")
    return nbytes // elem_bytes


def _is_meta(arrays: list | None) -> bool:
    """True when no rank has data (meta mode); mixing data and None is an error."""
    if arrays is None or all(a is None for a in arrays):
        return True
    if any(a is None for a in arrays):
        raise ValueError("either every rank passes a buffer (numeric) or none does (meta)")
    return False


def _split(buffer: np.ndarray, counts: list[int]) -> list[np.ndarray]:
    """A private copy of `buffer`, flattened and cut into chunks of `counts` elements."""
    flat = np.array(buffer, copy=True).reshape(-1)  # (count,)
    if flat.size != sum(counts):
        raise ValueError(f"buffer has {flat.size} elements, the message has {sum(counts)}")
    return [flat[o:o + c] for o, c in zip(chunk_offsets(counts), counts)]  # n x (counts[c],)


def ring_reduce_scatter(env: simpy.Environment, network: Network, gpus: list[int],
                        buffers: list[np.ndarray] | None, nbytes: int,
                        elem_bytes: int = DEFAULT_ELEM_BYTES, label: str = REDUCE_SCATTER,
                        nccl: tuple[NcclChoice, bool] | None = None):
    """Ring reduce-scatter of an S = `nbytes` message: rank i ends with chunk i of the sum.
    `nccl`: (the NCCL ring choice to run with, whether to pay its base latency) when this is a
    phase of a larger collective; default: this collective's own choice.

    Returns (results, stats): results[i] is a 1-D array (numeric) or None (meta).
    """
    n = len(gpus)
    counts = chunk_counts(element_count(nbytes, elem_bytes), n)
    holdings = None if _is_meta(buffers) else [_split(b, counts) for b in buffers]
    nccl = nccl or (_ring_choice(network, gpus, REDUCE_SCATTER, nbytes), True)
    stats = yield from _run_channels(env, network, gpus, reduce_scatter_steps(n), holdings,
                                     counts, elem_bytes, REDUCE_SCATTER, label, nccl)
    results = [None] * n if holdings is None else [holdings[i][i] for i in range(n)]
    return results, stats


def ring_all_gather(env: simpy.Environment, network: Network, gpus: list[int],
                    chunks: list[np.ndarray] | None, nbytes: int,
                    elem_bytes: int = DEFAULT_ELEM_BYTES, label: str = ALL_GATHER,
                    nccl: tuple[NcclChoice, bool] | None = None):
    """Ring all-gather: rank i contributes chunk i; every rank ends with the S = `nbytes` whole.
    `nccl` as for ring_reduce_scatter.

    Returns (results, stats): results[i] is the 1-D concatenation (numeric) or None (meta).
    """
    n = len(gpus)
    counts = chunk_counts(element_count(nbytes, elem_bytes), n)
    holdings = None if _is_meta(chunks) else _own_chunks(chunks, counts)
    nccl = nccl or (_ring_choice(network, gpus, ALL_GATHER, nbytes), True)
    stats = yield from _run_channels(env, network, gpus, all_gather_steps(n), holdings,
                                     counts, elem_bytes, ALL_GATHER, label, nccl)
    results = [None] * n if holdings is None else [np.concatenate(h) for h in holdings]
    return results, stats


def ring_all_reduce(env: simpy.Environment, network: Network, gpus: list[int],
                    buffers: list[np.ndarray] | None, nbytes: int,
                    elem_bytes: int = DEFAULT_ELEM_BYTES, label: str = ALL_REDUCE):
    """Ring all-reduce = reduce-scatter then all-gather (docs/MODEL.md#collectives), at the
    protocol NCCL runs an all-reduce ring with (one base latency). Results keep shape."""
    choice = _ring_choice(network, gpus, ALL_REDUCE, nbytes)
    reduced, first = yield from ring_reduce_scatter(env, network, gpus, buffers, nbytes,
                                                    elem_bytes, f"{label}/{REDUCE_SCATTER}",
                                                    (choice, True))
    gathered, second = yield from ring_all_gather(env, network, gpus, reduced, nbytes,
                                                  elem_bytes, f"{label}/{ALL_GATHER}",
                                                  (choice, False))
    if not _is_meta(buffers):
        gathered = [g.reshape(np.shape(b)) for g, b in zip(gathered, buffers)]
    return gathered, first.followed_by(second, ALL_REDUCE)


RING_COLLECTIVES = {ALL_REDUCE: ring_all_reduce, REDUCE_SCATTER: ring_reduce_scatter,
                    ALL_GATHER: ring_all_gather}


def _ring_choice(network: Network, gpus: list[int], collective: str, nbytes: int) -> NcclChoice:
    """NCCL's protocol and channels for this collective run as a ring."""
    return nccl_choice(collective, network.graph, list(gpus), nbytes, network.calibration, RING)


def _own_chunks(chunks: list[np.ndarray], counts: list[int]) -> list[list[np.ndarray | None]]:
    """All-gather start: rank r holds only its own chunk r, checked against the chunk sizes."""
    holdings = []
    for rank, chunk in enumerate(chunks):
        flat = np.asarray(chunk).reshape(-1)  # (counts[rank],)
        if flat.size != counts[rank]:
            raise ValueError(f"rank {rank} contributes {flat.size} elements, "
                             f"its chunk has {counts[rank]}")
        holdings.append([flat if c == rank else None for c in range(len(counts))])
    return holdings


def _run_channels(env: simpy.Environment, network: Network, gpus: list[int],
                  steps: list[RingStep], holdings: list | None, counts: list[int],
                  elem_bytes: int, collective: str, label: str,
                  nccl: tuple[NcclChoice, bool]):
    """Run every channel's ring concurrently (holdings[member][chunk] updated in place, numeric
    mode), after NCCL's base latency if `nccl` says to pay it; return the collective's stats
    when all finish."""
    choice, pay_base = nccl
    channels = channel_rings(list(gpus), network.graph.graph["gpus_per_node"])
    rings = [_channel_ring(env, network, list(gpus), ch, len(channels), steps, holdings, counts,
                           elem_bytes, label, choice) for ch in channels]
    start_s = env.now
    if pay_base and choice.base_latency_s > 0:
        yield env.timeout(choice.base_latency_s)
    ends = [env.all_of([env.process(ring.rank_loop(p)) for p in range(len(gpus))])
            for ring in rings]
    finished = {}
    for ring, end in zip(rings, ends):
        end.callbacks.append(lambda _e, ring=ring: finished.setdefault(ring.channel.index,
                                                                        env.now))
    yield env.all_of(ends)
    if holdings is not None:
        _gather_slices(rings, holdings)
    stats = _collective_stats(collective, gpus, rings, len(steps), start_s, env.now, finished)
    return replace(stats, protocol=choice.protocol, nchannels=choice.nchannels)


def _channel_ring(env, network, gpus, channel: Channel, k: int, steps, holdings, counts,
                  elem_bytes, label, choice: NcclChoice) -> "_Ring":
    """The ring of one channel: slice `channel.index` of every chunk, in the channel's order."""
    order = channel.order
    sizes = slice_counts(counts, k, channel.index)  # elements per chunk (member index)
    starts = [sum(chunk_counts(c, k)[:channel.index]) for c in counts]
    chunk_bytes = [sizes[m] * elem_bytes for m in order]  # per ring chunk
    mine = None
    if holdings is not None:
        mine = [[_piece(holdings[m][j], starts[j], sizes[j]) for j in order] for m in order]
    name = label if k == 1 else f"{label} ch{channel.index}"
    return _Ring(env, network, [gpus[m] for m in order], list(channel.via), steps, mine,
                 chunk_bytes, name, channel, choice)


def _piece(chunk, start: int, size: int):
    """Elements [start, start + size) of a held chunk (None: not held)."""
    return None if chunk is None else chunk[start:start + size]  # (size,)


def _gather_slices(rings: list["_Ring"], holdings: list) -> None:
    """Write every channel's final slices back as whole chunks (concatenated in channel order)."""
    order = rings[0].channel.order
    n = len(order)
    for member in range(n):
        for chunk in range(n):
            pieces = [r.holdings[r.position[member]][r.position[chunk]] for r in rings]
            held = all(p is not None for p in pieces)
            holdings[member][chunk] = (pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
                                       ) if held else None


def _collective_stats(collective, gpus, rings, steps, start_s, end_s, finished):
    """Bytes per member summed over channels, and one ChannelStats per channel."""
    n = len(gpus)
    sent, received = [0] * n, [0] * n
    channels = []
    for ring in rings:
        for p, member in enumerate(ring.channel.order):
            sent[member] += ring.sent[p]
            received[member] += ring.received[p]
        channels.append(ChannelStats(ring.channel.index, tuple(ring.gpus), ring.channel.via,
                                     ring.channel.rail, sum(ring.chunk_bytes), tuple(ring.sent),
                                     start_s, finished[ring.channel.index]))
    return CollectiveStats(collective, tuple(gpus), sum(r.nbytes_total for r in rings), steps,
                           tuple(sent), tuple(received), start_s, end_s, tuple(channels))


class _Ring:
    """The shared state of one ring phase: the plan, each rank's chunks, inboxes, byte counts."""

    def __init__(self, env, network, gpus, via, steps, holdings, chunk_bytes, label, channel,
                 choice: NcclChoice):
        self.env, self.network, self.gpus, self.steps = env, network, gpus, steps
        self.choice = choice
        self.step_latency_s = channel_step_latency_s(
            network, gpus, replace(channel, order=tuple(range(len(gpus)))), choice)
        self.via = via  # [rank] -> relaying GPU of its outgoing hop (PXN) or None
        self.holdings = holdings  # [rank][chunk] -> (counts[chunk],) array, or None in meta mode
        self.chunk_bytes = chunk_bytes
        self.nbytes_total = sum(chunk_bytes)
        self.label = label
        self.step_labels = [f"{label} step {index}" for index in range(len(steps))]  # made
        # once per ring, not once per rank and step
        self.channel = channel
        self.position = {member: p for p, member in enumerate(channel.order)}
        n = len(gpus)
        self.inboxes = [[env.event() for _ in range(n)] for _ in steps]  # [step][rank]
        self.sent, self.received = [0] * n, [0] * n

    def rank_loop(self, rank: int):
        """One rank's side of the ring: send, wait for the incoming chunk, add or store it."""
        for index, step in enumerate(self.steps):
            delivered = self._send(index, step, rank)
            incoming = yield self.inboxes[index][rank]
            yield delivered
            self._receive(step, rank, incoming)

    def _send(self, index: int, step: RingStep, rank: int) -> simpy.Event:
        """Put this rank's chunk for `step` on the wire; its inbox fills on delivery."""
        out = step.send_of(rank)
        payload = None if self.holdings is None else self.holdings[rank][out.chunk]
        delivered = self.network.transfer(self.gpus[rank], self.gpus[out.dst],
                                          wire_bytes(self.chunk_bytes[out.chunk], self.choice),
                                          self.step_labels[index], self.via[rank],
                                          latency_s=self.step_latency_s,
                                          ring_step=True)
        delivered.callbacks.append(partial(_post, self.inboxes[index][out.dst], payload))
        self.sent[rank] += self.chunk_bytes[out.chunk]
        return delivered

    def _receive(self, step: RingStep, rank: int, incoming) -> None:
        """Add (reduce-scatter) or store (all-gather) the chunk that arrived."""
        chunk = step.receive_of(rank).chunk
        self.received[rank] += self.chunk_bytes[chunk]
        if self.holdings is not None:
            mine = self.holdings[rank][chunk]
            self.holdings[rank][chunk] = mine + incoming if step.reduce else incoming


def channel_step_latency_s(network: Network, gpus: list[int], channel: Channel,
                           choice: NcclChoice) -> float:
    """The latency every step of `channel` pays (NCCL's pipelined ring latency over its hops,
    nccl_group.pipelined_step_latency_s); a pure function of the network's links, worked out
    once per ring, channel and choice (the full simulation runs the same rings thousands of
    times)."""
    key = (tuple(gpus), channel.order, channel.via, choice)
    latency = network.step_latencies.get(key)
    if latency is None:
        latency = network.step_latencies[key] = pipelined_step_latency_s(ring_hop_latencies(
            network.graph, gpus, channel, choice, network.calibration.transfer_overhead_s))
    return latency


def _post(inbox: simpy.Event, payload, _delivered: simpy.Event) -> None:
    """Hand a delivered chunk to the receiving rank."""
    inbox.succeed(payload)
