"""One ring collective's plan, read alike by the stepwise rings and by the closed form.

A plan fixes everything but the time: the NCCL channels (engine/ring_plan.py channel_rings), the
elements of every member's chunk, the steps, and what a protocol adds on top of the links: a
latency per step and the fraction of link bandwidth it achieves (NVIDIA/nccl
src/graph/tuning.cc: per-protocol base and per-hop latencies and bandwidth factors; 0 and 1
for the plain links). engine/collectives.py moves its hops as flows step by step;
engine/ring_timing.py prices the same hops in closed form, so the two cannot drift apart.
"""

from dataclasses import dataclass

import networkx as nx

from simsp.cluster.topology import hop_route
from simsp.engine.ring_plan import (ALL_REDUCE, COLLECTIVES, Channel, channel_rings,
                                    chunk_counts, slice_counts)


@dataclass(frozen=True)
class CollectivePlan:
    """A ring collective over `gpus`: channels, chunk elements, per-step protocol costs."""

    collective: str
    gpus: tuple[int, ...]
    nbytes: int
    elem_bytes: int
    counts: tuple[int, ...]  # elements of every member's chunk (numpy.array_split sizes)
    channels: tuple[Channel, ...]
    step_latency_s: float = 0.0  # added to every step of every channel (protocol latency)
    bandwidth_fraction: float = 1.0  # of each link's achieved capacity the protocol uses

    @property
    def steps(self) -> int:
        """Ring steps: 2(n−1) for an all-reduce, n−1 for a reduce-scatter or all-gather."""
        return (2 if self.collective == ALL_REDUCE else 1) * (len(self.gpus) - 1)

    def slice_counts(self, channel: Channel) -> list[int]:
        """Elements `channel` carries of every member's chunk (member order)."""
        return slice_counts(list(self.counts), len(self.channels), channel.index)

    def ring_chunk_bytes(self, channel: Channel) -> list[int]:
        """Bytes of every chunk slice of `channel`, in its ring order."""
        sizes = self.slice_counts(channel)
        return [sizes[m] * self.elem_bytes for m in channel.order]

    def wire_bytes(self, nbytes: int) -> int:
        """Bytes a hop puts on the links for `nbytes` of payload under the protocol (e.g. NCCL
        LL sends a 4-byte flag with every 4 bytes of data: fraction 0.5)."""
        return nbytes if self.bandwidth_fraction == 1.0 else round(nbytes / self.bandwidth_fraction)

    def hop_routes(self, graph: nx.DiGraph) -> list[list[tuple]]:
        """[channel][position] edges of the hop from ring position i to i+1 (PXN relays
        included)."""
        gpus = self.gpus
        return [[hop_route(graph, gpus[ch.order[i]], gpus[ch.order[(i + 1) % len(ch.order)]],
                           ch.via[i]) for i in range(len(ch.order))] for ch in self.channels]


def plan_collective(collective: str, gpus, nbytes: int, gpus_per_node: int, elem_bytes: int,
                    step_latency_s: float = 0.0,
                    bandwidth_fraction: float = 1.0) -> CollectivePlan:
    """The plan of a ring `collective` of an S = `nbytes` message over `gpus` (ring order)."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}")
    if nbytes < 0 or elem_bytes < 1 or nbytes % elem_bytes:
        raise ValueError(f"{nbytes} bytes is not a whole number of {elem_bytes}-byte elements")
    if not 0.0 < bandwidth_fraction <= 1.0 or step_latency_s < 0.0:
        raise ValueError("bandwidth fraction must be in (0, 1], step latency non-negative")
    gpus = tuple(gpus)
    counts = tuple(chunk_counts(nbytes // elem_bytes, len(gpus)))
    channels = tuple(channel_rings(list(gpus), gpus_per_node))
    return CollectivePlan(collective, gpus, nbytes, elem_bytes, counts, channels,
                          step_latency_s, bandwidth_fraction)
