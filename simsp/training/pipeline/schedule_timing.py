"""A tiny pure-python timeline of a schedule with uniform step times, and its pipeline bubble.

Bubble definition (N21 §2.2.1): bubble time fraction = t_pb / t_id, the idle time a stage spends
per iteration over the ideal time t_id of its own compute; here (T_iteration - T_ideal) / T_ideal
with T_ideal = one stage's busy time = m*v*(f + b). Gives (p-1)/m for GPipe and 1F1B and
(p-1)/(v*m) for interleaved 1F1B with uniform per-chunk times and no p2p cost.

The zero-bubble paper (Qi et al., arXiv:2401.10241 §2) counts a stage's bubble as its idle time
between its own first and last step (`stage_idle`): a schedule whose stages start and end at
different times (ZB-H2's parallelogram) is bubble-free; `pipeline_bubble` is the largest.
"""
from dataclasses import dataclass

from simsp.training.pipeline.schedule_check import dependency, execution_order, key_of
from simsp.training.pipeline.schedule_step import (
    BACKWARD, FORWARD, ROUND_ROBIN, Schedule, Step, stage_of)


@dataclass(frozen=True)
class Span:
    """One executed step on one stage, with start and end times in seconds."""

    step: Step
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """Per stage, the spans of its steps in schedule order."""

    spans: tuple[tuple[Span, ...], ...]

    @property
    def iteration_time(self) -> float:
        """Time from the first start (0) to the last end on any stage."""
        return max((s.end for stage in self.spans for s in stage), default=0.0)

    def busy_time(self, stage: int) -> float:
        """Total compute time of one stage."""
        return sum(s.end - s.start for s in self.spans[stage])

    def stage_idle(self, stage: int) -> float:
        """Idle time of one stage between the start of its first step and the end of its last."""
        steps = self.spans[stage]
        return steps[-1].end - min(s.start for s in steps) - self.busy_time(stage)


def simulate_uniform(schedule: Schedule, p: int, v: int = 1, forward_time: float = 1.0,
                     backward_time: float = 2.0, p2p_time: float = 0.0,
                     weight_time: float = 0.0, placement: str = ROUND_ROBIN) -> Timeline:
    """Run each stage's steps in order, each once its stage is free and its input has arrived
    (a W step takes weight_time; backward_time is then the input-gradient step alone)."""
    free = [0.0] * p
    end: dict = {}
    spans: list[list[Span]] = [[] for _ in range(p)]
    took = {FORWARD: forward_time, BACKWARD: backward_time}
    for stage, step in execution_order(schedule, p, v, placement):
        start = max(free[stage], _input_ready(step, stage, p, v, end, p2p_time, placement))
        finish = start + took.get(step.kind, weight_time)
        end[key_of(step, stage, p, placement)] = finish
        free[stage] = finish
        spans[stage].append(Span(step, start, finish))
    return Timeline(tuple(tuple(s) for s in spans))


def bubble_fraction(result: Timeline) -> float:
    """(T_iteration - T_ideal) / T_ideal, T_ideal the busiest stage's compute (N21 §2.2.1)."""
    ideal = max(result.busy_time(stage) for stage in range(len(result.spans)))
    return (result.iteration_time - ideal) / ideal


def pipeline_bubble(result: Timeline) -> float:
    """The largest stage idle time between a stage's first and last step (arXiv:2401.10241 §2)."""
    return max(result.stage_idle(stage) for stage in range(len(result.spans)))


def _input_ready(step: Step, stage: int, p: int, v: int, end: dict, p2p_time: float,
                 placement: str) -> float:
    """When the step's input is here: its dependency's end, plus p2p_time if it crossed stages."""
    need = dependency(step, stage, p, v, placement)
    if need is None:
        return 0.0
    hop = p2p_time if stage_of(need[2], p, placement) != stage else 0.0
    return end[need] + hop
