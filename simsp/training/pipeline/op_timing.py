"""A unit-time list scheduler for op schedules (op_step.py): each rank runs its ops in order, an
op starting once its rank is free and every task's input is there; its outputs are there when
the op ends (an F&B pair is one op of its own duration, as DualPipe sends both results after
`_forward_backward_compute_chunk`, deepseek-ai/DualPipe dualpipe/dualpipe.py).

Dependencies (Qi et al., arXiv:2401.10241 §2): F of a micro-batch's stage s waits for its F at
stage s-1; B or BW at stage s for the B or BW at s+1 (the last stage for its own F); W for its
B. No communication time: the settings of the published closed forms (DeepSeek-V3 report,
arXiv:2412.19437 Table 2; ZB paper Table 1).
"""
from dataclasses import dataclass

from simsp.errors import SimulationError
from simsp.training.pipeline.op_step import (FORWARD, FULL_BACKWARD, GRADIENT_KINDS,
                                             INPUT_GRAD, WEIGHT_GRAD, Op, OpSchedule, Task)

Key = tuple[str, int, int]  # ("F" | "G" (input gradient) | "W", micro_batch, route position)


@dataclass(frozen=True)
class Durations:
    """Seconds (or units) of F, B (input gradient), W; `pair` of an F&B pair (default F+B+W:
    no gain from overlap). BW, a full backward, takes B + W."""

    forward: float = 1.0
    input_grad: float = 1.0
    weight_grad: float = 1.0
    pair: float | None = None

    def of(self, op: Op) -> float:
        """How long `op` keeps its rank busy."""
        if op.is_pair:
            return self.forward + self.input_grad + self.weight_grad if self.pair is None \
                else self.pair
        return {FORWARD: self.forward, INPUT_GRAD: self.input_grad,
                WEIGHT_GRAD: self.weight_grad,
                FULL_BACKWARD: self.input_grad + self.weight_grad}[op.tasks[0].kind]


@dataclass(frozen=True)
class OpSpan:
    """One op run on one rank from `start` to `end`."""

    op: Op
    start: float
    end: float
    ready: float  # when the last input of the op arrived (0 if it needs none)


@dataclass(frozen=True)
class OpTimeline:
    """Per rank, the spans of its ops in order."""

    spans: tuple[tuple[OpSpan, ...], ...]

    @property
    def iteration_time(self) -> float:
        """From 0 to the last end on any rank."""
        return max((s.end for rank in self.spans for s in rank), default=0.0)

    def busy_time(self, rank: int) -> float:
        """Time the rank computes."""
        return sum(s.end - s.start for s in self.spans[rank])

    def bubble(self, rank: int) -> float:
        """Idle time of the rank within the iteration: iteration time - busy time."""
        return self.iteration_time - self.busy_time(rank)


def simulate_ops(schedule: OpSchedule, durations: Durations = Durations()) -> OpTimeline:
    """Run every rank's ops in order as soon as they can start; SimulationError on deadlock."""
    cursor, free = [0] * schedule.ranks, [0.0] * schedule.ranks
    ends: dict[Key, float] = {}
    spans: list[list[OpSpan]] = [[] for _ in range(schedule.ranks)]
    remaining = sum(len(ops) for ops in schedule.ops)
    while remaining:
        progressed = False
        for rank, ops in enumerate(schedule.ops):
            while cursor[rank] < len(ops):
                op = ops[cursor[rank]]
                ready = _inputs_ready(schedule, op, rank, ends)
                if ready is None:
                    break
                start = max(free[rank], ready)
                free[rank] = start + durations.of(op)
                for task in op.tasks:
                    ends.update({key: free[rank] for key in outputs(schedule, task, rank)})
                spans[rank].append(OpSpan(op, start, free[rank], ready))
                cursor[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise SimulationError(f"{schedule.name} deadlocks: " + _stuck(schedule, cursor))
    return OpTimeline(tuple(tuple(s) for s in spans))


def needs(schedule: OpSchedule, task: Task, rank: int) -> Key | None:
    """The output the task waits for (None: the first stage's forward)."""
    s = schedule.position(task, rank)
    last = len(schedule.routes[task.micro_batch]) - 1
    if task.kind == FORWARD:
        return (FORWARD, task.micro_batch, s - 1) if s else None
    if task.kind == WEIGHT_GRAD:
        return "B", task.micro_batch, s
    return (FORWARD, task.micro_batch, s) if s == last else ("G", task.micro_batch, s + 1)


def outputs(schedule: OpSchedule, task: Task, rank: int) -> list[Key]:
    """What finishing the task makes available: F its activation, B the input gradient (and the
    B W needs), BW both gradients, W nothing others wait for."""
    s = schedule.position(task, rank)
    if task.kind == FORWARD:
        return [(FORWARD, task.micro_batch, s)]
    if task.kind in GRADIENT_KINDS:
        return [("G", task.micro_batch, s), ("B", task.micro_batch, s)]
    return [(WEIGHT_GRAD, task.micro_batch, s)]


def _inputs_ready(schedule: OpSchedule, op: Op, rank: int, ends: dict) -> float | None:
    """When every task of the op has its input, or None if one is not produced yet."""
    ready = 0.0
    for task in op.tasks:
        need = needs(schedule, task, rank)
        if need is not None:
            if need not in ends:
                return None
            ready = max(ready, ends[need])
    return ready


def _stuck(schedule: OpSchedule, cursor: list[int]) -> str:
    """Each stuck rank, the op it is blocked at and what that op waits for."""
    words = []
    for rank, ops in enumerate(schedule.ops):
        if cursor[rank] < len(ops):
            op = ops[cursor[rank]]
            wants = [needs(schedule, t, rank) for t in op.tasks]
            words.append(f"rank {rank} at op {cursor[rank]} ({op}) waits for {wants}")
    return "; ".join(words)


def peak_activations(schedule: OpSchedule) -> list[int]:
    """Per rank, the peak count of stage activations held: F +1, B or BW -1 (W's inputs are not
    counted, as the ZB paper's and DeepSeek-V3's tables count); a pair's F counts first."""
    peaks = []
    for ops in schedule.ops:
        held = peak = 0
        for task in (t for op in ops for t in op.tasks):
            held += 1 if task.kind == FORWARD else -1 if task.kind in GRADIENT_KINDS else 0
            peak = max(peak, held)
        peaks.append(peak)
    return peaks
