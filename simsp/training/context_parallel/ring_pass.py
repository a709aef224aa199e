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

The arithmetic runs over the group at once (numpy vectors over the c ranks, one per step): the
same IEEE maxima, additions and divisions per element as the per-rank loop, so the same floats
(a step's kernels added one column at a time, zero-padded: x + 0.0 == x).
"""

from functools import cache
from heapq import heappush
from itertools import repeat

import numpy as np
from simpy.events import NORMAL

from simsp.model.replay import delay_to
from simsp.training.context_parallel.lone_ring import LoneRing
from simsp.training.context_parallel.ring import exchange_bytes

_add, _maximum = np.add, np.maximum  # the ufuncs of the pass's hot loop



class RingPass:
    """One CP ring's arithmetic pass per phase: the ranks entered so far, then every rank's
    (end, time waited, receive buffers' post times) once the last has entered."""

    def __init__(self, ring, steps: bool = True):
        self.ring = ring  # ring.py CpRing: the group's GPUs, K/V bytes, lone sends, timeline
        # whether each step's (start, end) goes into the ring's timeline (the training loop
        # reads only the ranks' waits and ends: attention.py)
        self.steps = steps
        self.entered = {}  # phase -> {cp rank: (entry s, its call's step_clock.CallCharges)}
        self.sides = {}  # phase -> per cp rank (end s, waited s, (post s of cp_kv_1.., ...))
        self.ready = {}  # phase -> the event the early ranks wait on

    def side(self, phase: str, rank: int, charges):
        """Rank `rank`'s side of the call (`charges`: its call's step_clock.CallCharges,
        charged already): wait for the group, take its worked-out side, sleep to its end;
        a leader's GroupCharges: the whole group's call at once (group_side)."""
        if isinstance(charges, GroupCharges):
            yield from self.group_side(phase, charges)
            return
        ring, env = self.ring, self.ring.env
        entered = self.entered.setdefault(phase, {})
        entered[rank] = (env.now, charges)
        if len(entered) < ring.cp:
            ready = self.ready.get(phase) or self.ready.setdefault(phase, env.event())
            yield ready
        else:
            self.sides[phase] = (forward_pass if phase == "forward" else backward_pass)(
                ring, [entered[r] for r in range(ring.cp)], self.steps)
            if phase in self.ready:
                self.ready[phase].succeed()
        end_s, waited_s, posts = self.sides[phase][rank]
        ledger = ring.ledgers.get(rank)
        if ledger is not None and ring.kv_bytes and posts:  # cp_kv_1.. at their posts
            ledger.alloc_each(ring.kv_keys()[1:], ring.kv_bytes, "communication", "cp_ring",
                              posts)
        ring.timeline.waited[(phase, rank)] = waited_s
        yield from _sleep_until(env, end_s)


    def group_side(self, phase: str, group):
        """A CP leader's call for its whole group (context_parallel/shadows.py): every rank's
        entry its slice's clock, the leader's side taken, every slice's clock set to its
        rank's end."""
        ring, clocks = self.ring, group.slices.clocks
        entries = list(zip(clocks.now.tolist(), group.charges))
        if group.kernels is None:
            group.kernels = _kernels(ring, entries)
        ends, waited, posts = (forward_pass if phase == "forward" else backward_pass)(
            ring, entries, self.steps, group.kernels, arrays=True)  # (c,), (c,), (steps, c)
        ledger = ring.ledgers.get(0)
        if ledger is not None and ring.kv_bytes and len(posts):  # cp_kv_1.. at their posts
            ledger.alloc_each(ring.kv_keys()[1:], ring.kv_bytes, "communication", "cp_ring",
                              posts[:, 0].tolist())
        ring.timeline.waited[(phase, 0)] = float(waited[0])
        yield from _sleep_until(ring.env, float(ends[0]), clocks, ends)


class GroupCharges:
    """Every rank's CallCharges of one kind of call, the leader's first, and the run's slices;
    how many calls took them after the first (their FLOPs owed: shadows.py settle) and their
    kernels per step (_kernels), found once."""

    __slots__ = ("charges", "slices", "calls", "kernels")

    def __init__(self, charges: list, slices):
        self.charges, self.slices, self.calls, self.kernels = charges, slices, 0, None


def forward_pass(ring, entries: list, steps: bool = True, kernels=None, arrays: bool = False):
    """Every rank's forward (ring.py CpRing.forward): step i waits for step i−1's send and
    receive, posts step i's (a receive buffer allocated) but at the last step, computes.
    entries[r] = (entry s, CallCharges) -> per rank (end, waited, post times of steps 0..c−2)
    (`arrays`: as (c,), (c,) and (c − 1, c) arrays); `steps`: each step's (start, end)
    recorded in the ring's timeline; `kernels`: _kernels' found already."""
    c, compute = ring.cp, ring.timeline.compute if steps else None
    kernels = kernels or _kernels(ring, entries)  # per step, rows of (c,) kernel seconds
    kind = _kind(ring, "forward", 1)
    previous = _neighbour(c, -1)  # (c,) cp rank r − 1 of each r
    waited_at = np.empty((c, c))  # (steps, c) each rank's clock after its wait (0: its entry)
    waited_at[0] = [entry for entry, _ in entries]
    ends = np.empty((c, c))  # (steps, c) each rank's step compute end
    starts, delivered = np.empty((c - 1, c)), np.empty((c - 1, c))  # (sends, c) each send's
    lands = kind.lands(waited_at[0].min())
    send, step_compute, maximum = _send, _compute, np.maximum
    end, arrived = None, None  # (c,) the previous step's compute end and deliveries
    for step, clock, step_end, step_kernels in zip(range(c), waited_at, ends, kernels):
        if step:  # clock: (c,) a row of waited_at
            maximum(end, arrived, out=clock)  # sent
            maximum(clock, arrived[previous], out=clock)  # received
        if step < c - 1:
            arrived = delivered[step]  # (c,) by sending cp rank
            send(kind, step, clock, starts[step], arrived, lands)
        step_compute(compute, "forward", step, clock, step_kernels, step_end)
        end = step_end
    _record(ring, kind, starts, delivered)
    waited = _summed(waited_at[1:] - ends[:-1], c)  # (c,)
    posts = waited_at[:-1]  # (c − 1, c)
    if arrays:
        return ends[-1], waited, posts
    return list(zip(ends[-1].tolist(), waited.tolist(), posts.T.tolist()))


def backward_pass(ring, entries: list, steps: bool = True, kernels=None, arrays: bool = False):
    """Every rank's backward (CpRing.backward): step i posts (to r − 1, from r + 1), computes,
    then waits for both deliveries (as forward_pass; no receive buffer posted apart)."""
    c, compute = ring.cp, ring.timeline.compute if steps else None
    kernels = kernels or _kernels(ring, entries)  # per step, rows of (c,)
    kind = _kind(ring, "backward", -1)
    following = _neighbour(c, 1)  # (c,) cp rank r + 1 of each r
    clock = np.array([entry for entry, _ in entries], dtype=np.float64)  # (c,) each rank's time
    waited_at = np.empty((c, c))  # (steps, c) each rank's clock after its step's wait
    ends = np.empty((c, c))  # (steps, c) each rank's step compute end
    starts, delivered = np.empty((c, c)), np.empty((c, c))  # (steps, c) each send's
    lands = kind.lands(clock.min())
    send, step_compute, maximum = _send, _compute, np.maximum
    for step, start, arrived, end, waited_row, step_kernels in zip(
            range(c), starts, delivered, ends, waited_at, kernels):  # (c,) rows of each
        send(kind, step, clock, start, arrived, lands)
        step_compute(compute, "backward", step, clock, step_kernels, end)
        clock = waited_row
        maximum(end, arrived, out=clock)  # sent
        maximum(clock, arrived[following], out=clock)  # received
    _record(ring, kind, starts, delivered)
    waited = _summed(waited_at - ends, c)  # (c,)
    if arrays:
        return clock, waited, np.empty((0, c))
    return list(zip(clock.tolist(), waited.tolist(), repeat(())))


def _summed(waits, c: int):
    """(c,) each rank's waits (steps, c) added in step order from 0 (np.add.accumulate down
    the rows: in turn, no pairwise sums; a wait is never negative, so 0 + w == w); none:
    zeros."""
    if not len(waits):
        return np.zeros(c)
    return np.add.accumulate(waits, axis=0)[-1]


def _kernels(ring, entries: list) -> tuple:
    """Per step, every rank's kernel seconds in order as rows ((c,) each: one kernel of every
    rank; the first, then the rest; () for none), zero-padded to the step's most (cached per group on its LoneRing by the ranks'
    CallCharges: a rank's call charges the same kernels each time its shapes recur)."""
    charges = tuple(call for _, call in entries)
    cache = ring.lone.pass_kernels
    key = tuple(map(id, charges))
    found = cache.get(key)
    if found is None:  # the value keeps the CallCharges alive, so their ids stay theirs
        steps = []
        for step in range(ring.cp):
            width = max(len(call.seconds[step]) for call in charges)
            matrix = np.zeros((width, len(charges)))  # (kernels, c)
            for r, call in enumerate(charges):
                matrix[:len(call.seconds[step]), r] = call.seconds[step]
            steps.append((matrix[0], tuple(matrix[1:])) if width else ())  # (c,), ((c,), ..)
        found = cache[key] = (charges, tuple(steps))
    return found[1]


def _compute(compute: dict, phase: str, step: int, clock, kernels, end):
    """Each rank's step compute from its clock, its kernels ((c,) rows: _kernels) added one
    after the other in place (step_clock's additions in turn; a padded 0.0 leaves x as is):
    the step ends written into `end` (c,), recorded in `compute` (the ring's timeline) unless
    None."""
    if kernels:
        first, rest = kernels
        _add(clock, first, out=end)
        for column in rest:  # (c,) one kernel of every rank
            end += column
    else:
        end[:] = clock
    if compute is not None:
        compute.update(zip(_compute_keys(phase, step, len(clock)),
                           zip(clock.tolist(), end.tolist())))


class _Kind:
    """One kind of ring call's sends (a phase of one group), found once: each cp rank's to
    rank + to, their (c,) lone rates' drain seconds per step (LoneRing.drain_s: the division
    LoneRing.end_time makes), latencies, counts and the call's records' fixed fields."""

    __slots__ = ("srcs", "dsts", "other", "drained", "latency_s", "nbytes", "total", "bound",
                 "records")

    def __init__(self, ring, phase: str, to: int):
        c = ring.cp
        self.srcs, self.dsts, rate_Bps, self.latency_s = ring.lone.pair_arrays(ring.gpus, to)
        self.other = _neighbour(c, to)  # (c,) each send's receiving cp rank
        sends = c - 1 if phase == "forward" else c
        self.nbytes = [exchange_bytes(phase, step, c, ring.kv_bytes) for step in range(sends)]
        self.drained = [LoneRing.drain_s(nbytes, rate_Bps) for nbytes in self.nbytes]  # (c,)
        self.total = sum(exchange_bytes(phase, step, c, ring.kv_bytes) for step in range(c))
        # the longest send, drained plus latency (lands)
        self.bound = max((float(d.max()) for d in self.drained), default=0.0) + \
            float(self.latency_s.max())
        self.records = (self.srcs * sends, self.dsts * sends, tuple(
            nbytes for nbytes in self.nbytes for _ in range(c)), tuple(
            label for step in range(sends) for label in _labels(phase, step, c, to)))

    def lands(self, earliest_s: float) -> bool:
        """Whether every send starting at or after earliest_s is delivered at its end with no
        nudge: end = (start + drained) + latency <= 2·start there (the margin covers the two
        roundings), so end − start is exact (Sterbenz) and start + (end − start) == end."""
        return self.bound <= earliest_s * (1 - 2.0 ** -45)


def _kind(ring, phase: str, to: int) -> _Kind:
    """The ring's _Kind of `phase`, found once per group (cached on its LoneRing)."""
    kinds = ring.lone.kinds
    key = (ring.gpus, phase, ring.kv_bytes)
    found = kinds.get(key)
    if found is None:
        found = kinds[key] = _Kind(ring, phase, to)
    return found


def _send(kind: _Kind, step: int, posts, start, delivered, lands: bool) -> None:
    """Each cp rank's send of `step` to rank + to, started at the later of its two posts
    (posts: (c,) post times) into `start` (c,), delivered as LoneRing.send delivers it into
    `delivered` (c,): (start + drained) + latency, or where `lands` has not proved it,
    start + _delays(start, that)."""
    _maximum(posts, posts[kind.other], out=start)  # posts[src], posts[src + to]
    _add(start, kind.drained[step], out=delivered)
    delivered += kind.latency_s  # (c,) LoneRing.end_time
    if not lands and not (start + (delivered - start) == delivered).all():
        delivered[:] = start + _delays(start, delivered)


def _record(ring, kind: _Kind, starts, delivered) -> None:
    """The call's sends recorded as their deliveries would be (LoneRing.delivered_at), one
    block in step order ((sends, c) arrays), and counted on the network, each GPU's bytes of
    every step at once (whole numbers: the same sums), in the order the per-send counts first
    touch them."""
    network = ring.lone.network
    network.trace.add_transfers(*kind.records[:3], starts, delivered, kind.records[3])
    sent, received, nbytes = network.bytes_sent, network.bytes_received, kind.total
    for src, dst in zip(kind.srcs, kind.dsts):
        sent[src] += nbytes
        received[dst] += nbytes


def _delays(now, target):
    """(c,) model/replay.py delay_to per element (its four nudges by an ulp, in the same
    order), or target − now where it finds none, as LoneRing.delivered_at schedules."""
    delay = target - now  # (c,)
    landed = now + delay  # (c,)
    if (landed == target).all():  # the first try lands everywhere
        return delay
    done = np.zeros(len(now), dtype=bool)  # (c,)
    for _ in range(4):
        low, high = landed < target, landed > target  # (c,) each
        done |= ~(low | high)
        delay = np.where(~done & low, np.nextafter(delay, np.inf),
                         np.where(~done & high, np.nextafter(delay, -np.inf), delay))
        landed = now + delay
    return np.where(done, delay, target - now)


@cache
def _neighbour(c: int, to: int) -> np.ndarray:
    """(c,) the cp rank r + to of every cp rank r (an index array)."""
    return (np.arange(c) + to) % c


@cache
def _compute_keys(phase: str, step: int, c: int) -> tuple:
    """The timeline's compute keys (phase, cp rank, step) of every rank at `step`."""
    return tuple((phase, r, step) for r in range(c))


@cache
def _labels(phase: str, step: int, c: int, to: int) -> tuple:
    """Each cp rank's send label at `step`, as ring.py CpRing._side names it."""
    return tuple(f"cp {phase} step {step} {src}->{(src + to) % c}" for src in range(c))


def _sleep_until(env, end_s: float, clocks=None, ends=None):
    """Wait until exactly end_s: one timeout where a delay lands on it (model/replay.py
    delay_to), else an event put on simpy's queue at that time (Environment.schedule's
    entry, with the time given instead of now + delay); with slice clocks (engine/
    slice_clocks.py) the wake-up's vector is `ends` (c,)."""
    delay = delay_to(env.now, end_s)
    if delay is not None:
        timeout = env.timeout(delay)
        if clocks is not None:
            clocks.at(timeout, ends)
        yield timeout
        return
    wake = env.event()
    wake._ok, wake._value = True, None
    if clocks is not None:
        clocks.at(wake, ends)
    heappush(env._queue, (end_s, NORMAL, next(env._eid), wake))
    yield wake
