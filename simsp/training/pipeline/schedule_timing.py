"""A tiny pure-python timeline of a schedule with uniform step times, and its pipeline bubble.

Bubble definition (N21 §2.2.1): bubble time fraction = t_pb / t_id, the idle time a stage spends
per iteration over the ideal time t_id of its own compute; here (T_iteration - T_ideal) / T_ideal
with T_ideal = one stage's busy time = m*v*(f + b). Gives (p-1)/m for GPipe and 1F1B and
(p-1)/(v*m) for interleaved 1F1B with uniform per-chunk times and no p2p cost.
"""
from dataclasses import dataclass

from simsp.training.pipeline.schedule_check import dependency, execution_order, key_of, stage_of
from simsp.training.pipeline.schedule_step import FORWARD, Schedule, Step


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


def simulate_uniform(schedule: Schedule, p: int, v: int = 1, forward_time: float = 1.0,
                     backward_time: float = 2.0, p2p_time: float = 0.0) -> Timeline:
    """Run each stage's steps in order, each once its stage is free and its input has arrived."""
    free = [0.0] * p
    end: dict = {}
    spans: list[list[Span]] = [[] for _ in range(p)]
    for stage, step in execution_order(schedule, p, v):
        start = max(free[stage], _input_ready(step, stage, p, v, end, p2p_time))
        finish = start + (forward_time if step.kind == FORWARD else backward_time)
        end[key_of(step, stage, p)] = finish
        free[stage] = finish
        spans[stage].append(Span(step, start, finish))
    return Timeline(tuple(tuple(s) for s in spans))


def bubble_fraction(result: Timeline) -> float:
    """(T_iteration - T_ideal) / T_ideal, T_ideal the busiest stage's compute (N21 §2.2.1)."""
    ideal = max(result.busy_time(stage) for stage in range(len(result.spans)))
    return (result.iteration_time - ideal) / ideal


def _input_ready(step: Step, stage: int, p: int, v: int, end: dict, p2p_time: float) -> float:
    """When the step's input is here: its dependency's end, plus p2p_time if it crossed stages."""
    need = dependency(step, stage, p, v)
    if need is None:
        return 0.0
    hop = p2p_time if stage_of(need[2], p) != stage else 0.0
    return end[need] + hop
