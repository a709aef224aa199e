"""A ring run as its piece: only the positions one simulated rank per orbit sends, on the shared links.

Where a layout's symmetry group H (shortcuts/rail_symmetry.py) maps a ring group onto itself
(rail shifts inside a node, node shifts inside a stage), the full simulation is H-invariant: the
image h(f) of every flow moves at f's rate at every moment (the max-min fair allocation is
unique, hence symmetric). One hop per H-orbit of the ring's hops (those a simulated rank sends,
in every NCCL channel) then stands for every other: its flow crosses the links that stand for
its images' (shortcuts/quotient.py), and the chunk a position waits for from its predecessor
arrives when the executed hop whose image that predecessor's hop is delivers its own, at the
same step (engine/collectives/ring.py _Ring.rank_loop, which this mirrors: send, wait for the
incoming chunk, wait for one's own delivery; phases one after another, NCCL's base latency
first). docs/shortcuts.md, "Rings as their pieces".
"""

from dataclasses import dataclass

import simpy

from simsp.engine.collectives.nccl_group import nccl_choice, wire_bytes
from simsp.engine.collectives.nccl_tuning import RING
from simsp.engine.collectives.ring import channel_step_latency_s, element_count
from simsp.engine.collectives.ring_plan import (ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER,
                                                channel_rings, chunk_counts, slice_counts)
from simsp.engine.network import Network

Position = tuple[int, int]  # (NCCL channel, ring position in that channel's order)
FIRST_HOP = {REDUCE_SCATTER: 1, ALL_GATHER: 0}  # ring_plan._phase: chunk c leaves rank c + hop


@dataclass(frozen=True)
class RingPiece:
    """The positions of a ring that run (one per orbit of its hops) and, per position, the
    executed position whose delivery stands for its predecessor's (the same step)."""

    executed: tuple[Position, ...]
    waits_on: tuple[int, ...]  # [i]: index in `executed` of position i's predecessor's image


@dataclass(frozen=True)
class PiecePlan:
    """What a piece's collective sends, worked out once per collective, group and size: NCCL's
    base latency and, per phase, per executed position its hop, its bytes per step and its
    channel's step latency."""

    base_s: float
    phases: tuple  # [phase][i] ((src, dst, via), (wire bytes per step), step latency, label)
    waits_on: tuple[int, ...]


def piece_plan(network: Network, collective: str, gpus: list[int], nbytes: int,
               elem_bytes: int, piece: RingPiece) -> PiecePlan:
    """The plan of one collective on a ring run as `piece` (ring.py's sizes and latencies:
    position p sends chunk p - step - first hop, channel c its slice of it)."""
    choice = nccl_choice(collective, network.graph, list(gpus), nbytes, network.calibration,
                         RING)
    channels = channel_rings(list(gpus), network.graph.graph["gpus_per_node"])
    n, k = len(gpus), len(channels)
    counts = chunk_counts(element_count(nbytes, elem_bytes), n)  # elements per chunk (member)
    latency = [channel_step_latency_s(network, gpus, ch, choice) for ch in channels]  # [channel]
    phases = []
    for phase in ((REDUCE_SCATTER, ALL_GATHER) if collective == ALL_REDUCE else (collective,)):
        positions = []
        for c, p in piece.executed:
            order = channels[c].order
            sizes = slice_counts(counts, k, c)  # elements channel c carries per chunk (member)
            sends = tuple(wire_bytes(sizes[order[(p - step - FIRST_HOP[phase]) % n]]
                                     * elem_bytes, choice) for step in range(n - 1))
            hop = (gpus[order[p]], gpus[order[(p + 1) % n]], channels[c].via[p])
            positions.append((hop, sends, latency[c], f"{collective} ch{c}"))
        phases.append(tuple(positions))
    return PiecePlan(choice.base_latency_s, tuple(phases), piece.waits_on)


def piece_run(env: simpy.Environment, network: Network, plan: PiecePlan):
    """Base latency, then the collective's phases over the piece's positions (a phase ends
    when every executed position has its last chunk): a process body; returns the end time."""
    if plan.base_s > 0:
        yield env.timeout(plan.base_s)
    waiters = [[] for _ in plan.waits_on]  # [i] positions whose predecessor i stands for
    for i, source in enumerate(plan.waits_on):
        waiters[source].append(i)
    for positions in plan.phases:
        steps = len(positions[0][1])
        inboxes = [[env.event() for _ in positions] for _ in range(steps)]  # [step][i]
        yield env.all_of([env.process(_position(env, network, position,
                                                [box[i] for box in inboxes],
                                                [[box[w] for w in waiters[i]] for box in inboxes]))
                          for i, position in enumerate(positions)])
    return env.now


def _position(env: simpy.Environment, network: Network, position: tuple,
              inbox: list[simpy.Event], posts: list[list[simpy.Event]]):
    """One executed position's steps: send its chunk, post every position it stands for as
    predecessor on delivery, wait for its own inbox, then for its own delivery."""
    (src, dst, via), sends, latency_s, label = position
    for step, nbytes in enumerate(sends):
        delivered = network.transfer(src, dst, nbytes, f"{label} step {step}", via,
                                     latency_s=latency_s, ring_step=True)
        delivered.callbacks.append(lambda _e, boxes=posts[step]: [b.succeed() for b in boxes])
        yield inbox[step]
        yield delivered
