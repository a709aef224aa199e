"""A ring step's kernels under one timeout: the same charges and the same end time as running
them one by one, with a fraction of the events (docs/context-parallel.md, "One timeout per
ring step").

A ring step's compute (its block attention's GEMMs or fused-kernel parts, then TE's
bookkeeping kernels, training/context_parallel/attention.py) holds the rank's compute stream
for kernel after kernel with nothing in between: no allocation, no wait, no other process
touching the stream. Where the stream runs every kernel at full rate (no SM contention,
engine/sm_share.py) and no compute span is traced, the step's end is the sum of its kernel
times added in order to its start, so one timeout landing exactly there (model/replay.py
delay_to) ends the step at the very float the kernel-by-kernel run ends it; every counter
(FLOPs, busy seconds, kernel log, CUDA-graph charges) is charged by Rank.compute and Rank.hold
themselves, in the same order: only holding the stream (Rank._occupy) is deferred.
"""

from functools import reduce
from operator import add

from simsp.model.replay import delay_to


def one_timeout(r) -> bool:
    """Whether r's ring steps may run under one timeout: full-rate stream, no compute spans."""
    return r.sm_share is None and (r.trace is None or "compute" in getattr(r.trace, "skip", ()))


def charged_apart(r) -> bool:
    """Whether r's ring steps may be charged apart from holding the stream (call_seconds):
    one_timeout(r), and no kernel log or CUDA graphs, which note when each kernel runs."""
    return one_timeout(r) and r.kernel_log is None and r.graphs is None


def run_step(r, kernels, memo: dict | None = None, key=None):
    """Run `kernels(r)` (a generator function charging a step's kernels on r) on r's compute
    stream: under one timeout where one_timeout(r), else as is. `memo` (a dict kept by the
    caller) holds, under `key` (everything the step's kernels depend on), what the step
    charged the first time, replayed after (not with a kernel log or CUDA graphs)."""
    if not one_timeout(r):
        yield from kernels(r)
        return
    if r.kernel_log is not None or r.graphs is not None:
        memo = None
    charges = None if memo is None else memo.get(key)
    if charges is None:
        charges = _charge(r, kernels)
        if memo is not None:  # kept with its busy seconds per kind (_recharge)
            memo[key] = charges = charges + (_by_kind(charges[1]),)
    else:
        _recharge(r, charges)
    if not charges[1]:  # no kernel: nothing to wait for, as the kernel-by-kernel run
        return
    end_s = r.env.now
    for _kind, seconds in charges[1]:
        end_s += seconds
    delay = delay_to(r.env.now, end_s)
    if delay is not None:
        yield r.env.timeout(delay)
        return
    for _kind, seconds in charges[1]:  # no single delay lands there: one timeout per kernel
        yield r.env.timeout(seconds)


def call_seconds(r, step_kernels, steps: int, memo: dict, key) -> "CallCharges":
    """Charge a whole ring call's steps (`step_kernels(r, step)` for step 0..steps−1) as
    run_step does where one_timeout(r), one after the other, without holding the stream;
    recorded once in `memo` under `key` and replayed after as one bundle (each counter's
    additions in the same order, so the same floats): the call's CallCharges (ring_pass.py
    adds its kernel seconds to each step's start)."""
    charges = memo.get(key)
    if charges is None:
        charges = memo[key] = CallCharges([_charge(r, lambda rank, s=step: step_kernels(rank, s))
                                           for step in range(steps)])
    else:
        charges.recharge(r)
    return charges


class CallCharges:
    """What a ring call's steps charged, per counter in order, and their kernel seconds."""

    __slots__ = ("flops", "busy", "seconds")

    def __init__(self, steps: list):
        flops, busy = {}, {}  # phase -> FLOPs added per step; kind -> seconds per kernel
        for added, held, _ in steps:
            for phase, value in added.items():
                flops.setdefault(phase, []).append(value)
            for kind, seconds in held:
                busy.setdefault(kind, []).append(seconds)
        self.flops = tuple((phase, tuple(v)) for phase, v in flops.items())
        self.busy = tuple((kind, tuple(v)) for kind, v in busy.items())
        self.seconds = tuple(step[2] for step in steps)  # per step (kernel s, ...) in order

    def recharge(self, r) -> None:
        """Charge r's counters as the recorded steps did, one by one (_recharge per step): per
        counter the same values added in the same order (reduce: left to right)."""
        counts = r.flops
        for phase, values in self.flops:
            counts[phase] = reduce(add, values, counts[phase])
        busy = r.busy_s
        for kind, values in self.busy:
            busy[kind] = reduce(add, values, busy.get(kind, 0.0))


def _charge(r, kernels) -> tuple:
    """Charge `kernels(r)` as Rank.compute and Rank.hold do, holding nothing: ({phase: FLOPs
    added}, ((kind, seconds), ...) in kernel order, (seconds, ...) in kernel order)."""
    held = []  # (kind, seconds) of each kernel, in order

    def occupy(name: str, kind: str, duration: float):  # Rank._occupy, holding nothing yet
        held.append((kind, duration))
        return
        yield

    flops = dict(r.flops)
    r._occupy = occupy  # the instance's, for these kernels only: nothing runs in between
    try:
        for _ in kernels(r):
            raise AssertionError("a ring step's kernel waited on an event")
    finally:
        del r._occupy
    added = {phase: r.flops[phase] - flops.get(phase, 0) for phase in r.flops}
    return added, tuple(held), tuple(seconds for _kind, seconds in held)


def _recharge(r, charges: tuple) -> None:
    """Charge r's counters as the recorded step did (charges: _charge's and _by_kind's): FLOPs
    per phase, then each kind's busy seconds added in kernel order (reduce: left to right, so
    the float sums are the same; the kinds are separate counters)."""
    for phase, flops in charges[0].items():
        r.flops[phase] += flops
    busy = r.busy_s
    for kind, values in charges[3]:
        busy[kind] = reduce(add, values, busy.get(kind, 0.0))


def _by_kind(held: tuple) -> tuple:
    """((kind, (seconds, ...) in kernel order), ...) of ((kind, seconds), ...), the kinds in
    the order they first come."""
    kinds = {}  # kind -> [seconds, ...]
    for kind, seconds in held:
        kinds.setdefault(kind, []).append(seconds)
    return tuple((kind, tuple(values)) for kind, values in kinds.items())
