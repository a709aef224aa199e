"""A p2p ring attention call worked out for its whole CP group in max-plus arithmetic
(docs/context-parallel.md, "A ring pass in arithmetic").

Where the group's sends are alone on their links (lone_ring.py: each delivered bytes / lone
rate + latency after its second side posts) and every rank's ring steps run under one timeout
(step_clock.py: a step ends at its start plus its kernels' seconds added in order), nothing
outside the group moves a step's end or a delivery, and inside it every time follows from the
ranks' entry times alone: a wait ends at the later of the two deliveries waited on (or at once),
a rank posts when it gets there, a send starts at the later of its two posts (ring.py). So once
the last rank of the group has entered the call, every rank's posts, step ends, deliveries and
waits follow by the very float operations the event run makes (max, the same additions in the
same order, the delay LoneRing.send schedules), and each rank sleeps once, to its end: c + 1
events per call for the group instead of 2·c² (c = cp). No rank's end comes before the last
entry: its last step waits on sends whose posts chain back, one ring hop per step, to every
rank's entry.
"""

from functools import cache
from heapq import heappush

from simpy.events import NORMAL

from simsp.model.replay import delay_to
from simsp.training.context_parallel.ring import exchange_bytes


class RingPass:
    """One CP ring's arithmetic pass per phase: the ranks entered so far, then every rank's
    (end, time waited, receive buffers allocated) once the last has entered."""

    def __init__(self, ring):
        self.ring = ring  # ring.py CpRing: the group's GPUs, K/V bytes, lone sends, timeline
        self.entered = {}  # phase -> {cp rank: (entry s, ((kernel s, ...) per step))}
        self.sides = {}  # phase -> {cp rank: (end s, waited s, ((time s, buffer key), ...))}
        self.ready = {}  # phase -> the event the early ranks wait on

    def side(self, phase: str, rank: int, seconds: list):
        """Rank `rank`'s side of the call (`seconds[step]`: its step's kernel seconds, charged
        already): wait for the group, take its worked-out side, sleep to its end."""
        ring, env = self.ring, self.ring.env
        entered = self.entered.setdefault(phase, {})
        entered[rank] = (env.now, seconds)
        if len(entered) < ring.cp:
            ready = self.ready.get(phase) or self.ready.setdefault(phase, env.event())
            yield ready
        else:
            self.sides[phase] = (forward_pass if phase == "forward" else backward_pass)(
                ring, [entered[r] for r in range(ring.cp)])
            if phase in self.ready:
                self.ready[phase].succeed()
        end_s, waited_s, buffers = self.sides[phase][rank]
        for time_s, key in buffers:
            ring._buffer(rank, key, ring.kv_bytes, True, time_s)
        ring.timeline.waited[(phase, rank)] = waited_s
        yield from _sleep_until(env, end_s)


def forward_pass(ring, entries: list) -> list:
    """Every rank's forward (ring.py CpRing.forward): step i waits for step i−1's send and
    receive, posts step i's (a receive buffer allocated) but at the last step, computes.
    entries[r] = (entry s, per step (kernel s, ...)) -> per rank (end, waited, buffers)."""
    c, compute = ring.cp, ring.timeline.compute
    clock = [entry for entry, _ in entries]  # (c,) each rank's time
    waited = [0.0] * c
    buffers = [[] for _ in range(c)]  # per rank: (time s, key) of each receive buffer
    delivered = None  # (c,) delivery of cp rank r's send of the previous step
    for step in range(c):
        if delivered is not None:
            for r in range(c):
                start = clock[r]
                clock[r] = max(start, delivered[r], delivered[r - 1])  # sent, received
                waited[r] += clock[r] - start
        if step < c - 1:
            for r in range(c):
                buffers[r].append((clock[r], f"cp_kv_{step + 1}"))
            delivered = _sends(ring, "forward", step, clock, 1)
        _compute(compute, "forward", step, clock, entries)
    return [(clock[r], waited[r], tuple(buffers[r])) for r in range(c)]


def backward_pass(ring, entries: list) -> list:
    """Every rank's backward (CpRing.backward): step i posts (to r − 1, from r + 1), computes,
    then waits for both deliveries."""
    c, compute = ring.cp, ring.timeline.compute
    clock = [entry for entry, _ in entries]  # (c,) each rank's time
    waited = [0.0] * c
    for step in range(c):
        delivered = _sends(ring, "backward", step, clock, -1)  # (c,) by sending cp rank
        _compute(compute, "backward", step, clock, entries)
        for r in range(c):
            start = clock[r]
            clock[r] = max(start, delivered[r], delivered[(r + 1) % c])  # sent, received
            waited[r] += clock[r] - start
    return [(clock[r], waited[r], ()) for r in range(c)]


def _compute(compute: dict, phase: str, step: int, clock: list, entries: list) -> None:
    """Each rank's step compute from its clock: kernel seconds added in order (step_clock)."""
    for r, (_, seconds) in enumerate(entries):
        start = end = clock[r]
        for kernel_s in seconds[step]:
            end += kernel_s
        compute[(phase, r, step)] = (start, end)
        clock[r] = end


def _sends(ring, phase: str, step: int, posts: list, to: int) -> list:
    """Each cp rank's send of `step` to rank + to, started at the later of its two posts
    (posts: (c,) post times), delivered as LoneRing.send delivers it: (c,) delivery times."""
    c, gpus, lone = ring.cp, ring.gpus, ring.lone
    nbytes = exchange_bytes(phase, step, c, ring.kv_bytes)
    delivered = [0.0] * c
    labels = _labels(phase, step, c, to)
    for src in range(c):
        dst = (src + to) % c
        delivered[src] = lone.delivered_at(gpus[src], gpus[dst], nbytes,
                                           max(posts[src], posts[dst]), labels[src])
    return delivered


@cache
def _labels(phase: str, step: int, c: int, to: int) -> tuple:
    """Each cp rank's send label at `step`, as ring.py CpRing._side names it."""
    return tuple(f"cp {phase} step {step} {src}->{(src + to) % c}" for src in range(c))


def _sleep_until(env, end_s: float):
    """Wait until exactly end_s: one timeout where a delay lands on it (model/replay.py
    delay_to), else an event put on simpy's queue at that time (Environment.schedule's
    entry, with the time given instead of now + delay)."""
    delay = delay_to(env.now, end_s)
    if delay is not None:
        yield env.timeout(delay)
        return
    wake = env.event()
    wake._ok, wake._value = True, None
    heappush(env._queue, (end_s, NORMAL, next(env._eid), wake))
    yield wake
