"""Validate a schedule before anything runs: completeness, then dependency-driven deadlock-freedom.

Dependencies (N21 §2.2): F of (micro-batch, virtual stage k) needs F of virtual stage k-1;
B of virtual stage k needs B of k+1; B of the last virtual stage needs its own F.
Chunk c of stage r is virtual stage c*p + r (Megatron round-robin layout).
"""
from collections import Counter

from simsp.errors import SimulationError
from simsp.training.pipeline.schedule_step import BACKWARD, FORWARD, Schedule, Step

Key = tuple[str, int, int]  # (kind, micro_batch, virtual_stage)


def check_schedule(schedule: Schedule, p: int, m: int, v: int = 1) -> None:
    """Raise SimulationError, naming stage and step, unless complete and deadlock-free."""
    if len(schedule) != p:
        raise SimulationError(f"schedule has {len(schedule)} stages, expected p={p}")
    for stage, steps in enumerate(schedule):
        _check_stage(stage, steps, m, v)
    execution_order(schedule, p, v)


def execution_order(schedule: Schedule, p: int, v: int = 1) -> list[tuple[int, Step]]:
    """A deterministic global order obeying every dependency.

    Dependency-driven execution that always runs the lowest stage able to progress.
    """
    done: set[Key] = set()
    cursor = [0] * p
    order: list[tuple[int, Step]] = []
    total = sum(len(steps) for steps in schedule)
    while len(order) < total:
        stage = _first_ready_stage(schedule, cursor, done, p, v)
        if stage is None:
            raise SimulationError(_deadlock_message(schedule, cursor, p, v))
        step = schedule[stage][cursor[stage]]
        done.add(key_of(step, stage, p))
        order.append((stage, step))
        cursor[stage] += 1
    return order


def key_of(step: Step, stage: int, p: int) -> Key:
    """The global identity of a step: its kind, micro-batch and virtual stage."""
    return step.kind, step.micro_batch, step.virtual_stage(stage, p)


def dependency(step: Step, stage: int, p: int, v: int) -> Key | None:
    """The one step that must finish before `step` can start (None for the first forward)."""
    k = step.virtual_stage(stage, p)
    if step.kind == FORWARD:
        return (FORWARD, step.micro_batch, k - 1) if k > 0 else None
    if k == p * v - 1:
        return FORWARD, step.micro_batch, k
    return BACKWARD, step.micro_batch, k + 1


def stage_of(virtual_stage: int, p: int) -> int:
    """The pipeline stage holding a virtual stage under the round-robin layout."""
    return virtual_stage % p


def _first_ready_stage(schedule: Schedule, cursor: list[int], done: set[Key], p: int,
                       v: int) -> int | None:
    """The lowest stage whose next step has its dependency done, or None if every stage is stuck."""
    for stage, steps in enumerate(schedule):
        if cursor[stage] < len(steps):
            need = dependency(steps[cursor[stage]], stage, p, v)
            if need is None or need in done:
                return stage
    return None


def _deadlock_message(schedule: Schedule, cursor: list[int], p: int, v: int) -> str:
    """Name each stuck stage, the step it is blocked at, and what that step waits for."""
    stuck = []
    for stage, steps in enumerate(schedule):
        if cursor[stage] < len(steps):
            step = steps[cursor[stage]]
            kind, mb, k = dependency(step, stage, p, v)
            stuck.append(f"stage {stage} at step {cursor[stage]} ({step}) waits for {kind}{mb} "
                         f"of virtual stage {k} on stage {stage_of(k, p)}")
    return "pipeline schedule deadlocks: " + "; ".join(stuck)


def _check_stage(stage: int, steps: list[Step], m: int, v: int) -> None:
    """Each (micro-batch, chunk) has exactly one F then one B on this stage, and nothing else."""
    seen: Counter = Counter()
    for index, step in enumerate(steps):
        where = f"stage {stage} step {index} ({step})"
        if step.kind not in (FORWARD, BACKWARD):
            raise SimulationError(f"{where}: kind must be 'F' or 'B'")
        if not (0 <= step.micro_batch < m and 0 <= step.chunk < v):
            raise SimulationError(f"{where}: outside micro-batches 0..{m - 1} / chunks 0..{v - 1}")
        if seen[step]:
            raise SimulationError(f"{where}: appears twice")
        if step.kind == BACKWARD and not seen[Step(FORWARD, step.micro_batch, step.chunk)]:
            raise SimulationError(f"{where}: backward before its forward")
        seen[step] += 1
    if len(seen) != 2 * m * v:
        missing = _missing(seen, m, v)
        raise SimulationError(f"stage {stage}: missing steps {', '.join(map(str, missing[:5]))}")


def _missing(seen: Counter, m: int, v: int) -> list[Step]:
    """Steps a complete stage would have that `seen` lacks."""
    every = (Step(kind, mb, c) for kind in (FORWARD, BACKWARD) for mb in range(m) for c in range(v))
    return [step for step in every if not seen[step]]
