"""Validate a schedule before anything runs: completeness, then dependency-driven deadlock-freedom.

Dependencies (N21 §2.2): F of (micro-batch, virtual stage k) needs F of virtual stage k-1;
B of virtual stage k needs B of k+1; B of the last virtual stage needs its own F. A split
backward's W needs its own B, on the same stage (Qi et al., arXiv:2401.10241 §2).
Chunk c of stage r is virtual stage c*p + r under Megatron's round-robin placement, r or
2p-1-r under the V placement (training/pipeline/schedule_step.py).
"""
from collections import Counter

from simsp.errors import SimulationError
from simsp.training.pipeline.schedule_step import (
    BACKWARD, FORWARD, ROUND_ROBIN, WEIGHT, Schedule, Step, route_ends, stage_of)

Key = tuple[str, int, int]  # (kind, micro_batch, virtual_stage)
KINDS = (FORWARD, BACKWARD, WEIGHT)
NAMES = {FORWARD: "forward", BACKWARD: "backward", WEIGHT: "weight gradient"}


def check_schedule(schedule: Schedule, p: int, m: int, v: int = 1,
                   placement: str = ROUND_ROBIN) -> None:
    """Raise SimulationError, naming stage and step, unless complete and deadlock-free."""
    if len(schedule) != p:
        raise SimulationError(f"schedule has {len(schedule)} stages, expected p={p}")
    for stage, steps in enumerate(schedule):
        _check_stage(stage, steps, m, v)
    execution_order(schedule, p, v, placement)


def execution_order(schedule: Schedule, p: int, v: int = 1,
                    placement: str = ROUND_ROBIN) -> list[tuple[int, Step]]:
    """A deterministic global order obeying every dependency.

    Dependency-driven execution that always runs the lowest stage able to progress.
    """
    done: set[Key] = set()
    cursor = [0] * p
    order: list[tuple[int, Step]] = []
    total = sum(len(steps) for steps in schedule)
    while len(order) < total:
        stage = _first_ready_stage(schedule, cursor, done, p, v, placement)
        if stage is None:
            raise SimulationError(_deadlock_message(schedule, cursor, p, v, placement))
        step = schedule[stage][cursor[stage]]
        done.add(key_of(step, stage, p, placement))
        order.append((stage, step))
        cursor[stage] += 1
    return order


def key_of(step: Step, stage: int, p: int, placement: str = ROUND_ROBIN) -> Key:
    """The global identity of a step: its kind, micro-batch and virtual stage."""
    return step.kind, step.micro_batch, step.virtual_stage(stage, p, placement)


def dependency(step: Step, stage: int, p: int, v: int,
               placement: str = ROUND_ROBIN) -> Key | None:
    """The one step that must finish before `step` can start (None for the first forward)."""
    k = step.virtual_stage(stage, p, placement)
    if step.kind == WEIGHT:
        return BACKWARD, step.micro_batch, k
    first, last = route_ends(k, p, v, placement)
    if step.kind == FORWARD:
        return None if first else (FORWARD, step.micro_batch, k - 1)
    if last:
        return FORWARD, step.micro_batch, k
    return BACKWARD, step.micro_batch, k + 1


def _first_ready_stage(schedule: Schedule, cursor: list[int], done: set[Key], p: int,
                       v: int, placement: str) -> int | None:
    """The lowest stage whose next step has its dependency done, or None if every stage is stuck."""
    for stage, steps in enumerate(schedule):
        if cursor[stage] < len(steps):
            need = dependency(steps[cursor[stage]], stage, p, v, placement)
            if need is None or need in done:
                return stage
    return None


def _deadlock_message(schedule: Schedule, cursor: list[int], p: int, v: int,
                      placement: str) -> str:
    """Name each stuck stage, the step it is blocked at, and what that step waits for."""
    stuck = []
    for stage, steps in enumerate(schedule):
        if cursor[stage] < len(steps):
            step = steps[cursor[stage]]
            kind, mb, k = dependency(step, stage, p, v, placement)
            stuck.append(f"stage {stage} at step {cursor[stage]} ({step}) waits for {kind}{mb} "
                         f"of virtual stage {k} on stage {stage_of(k, p, placement)}")
    return "pipeline schedule deadlocks: " + "; ".join(stuck)


def _check_stage(stage: int, steps: list[Step], m: int, v: int) -> None:
    """Each (micro-batch, chunk) has exactly one F then one B (then one W, when the backward is
    split: every B then has its W) on this stage, and nothing else."""
    seen: Counter = Counter()
    for index, step in enumerate(steps):
        where = f"stage {stage} step {index} ({step})"
        if step.kind not in KINDS:
            raise SimulationError(f"{where}: kind must be 'F', 'B' or 'W'")
        if not (0 <= step.micro_batch < m and 0 <= step.chunk < v):
            raise SimulationError(f"{where}: outside micro-batches 0..{m - 1} / chunks 0..{v - 1}")
        if seen[step]:
            raise SimulationError(f"{where}: appears twice")
        before = FORWARD if step.kind == BACKWARD else BACKWARD
        if step.kind != FORWARD and not seen[Step(before, step.micro_batch, step.chunk)]:
            raise SimulationError(f"{where}: {NAMES[step.kind]} before its {NAMES[before]}")
        seen[step] += 1
    kinds = KINDS if any(step.kind == WEIGHT for step in steps) else KINDS[:2]
    if len(seen) != len(kinds) * m * v:
        missing = _missing(seen, m, v, kinds)
        raise SimulationError(f"stage {stage}: missing steps {', '.join(map(str, missing[:5]))}")


def _missing(seen: Counter, m: int, v: int, kinds: tuple) -> list[Step]:
    """Steps a complete stage would have that `seen` lacks."""
    every = (Step(kind, mb, c) for kind in kinds for mb in range(m) for c in range(v))
    return [step for step in every if not seen[step]]
