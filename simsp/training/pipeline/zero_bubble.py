"""The zero-bubble schedules as data: ZB-H1, ZB-H2 and ZB-V, whose backward is split into B
(input gradients) and W (weight gradients) so that W steps fill the pipeline's bubble.

Sources: Qi et al., "Zero Bubble Pipeline Parallelism", arXiv:2401.10241 (ICLR 2024): §2 the
handcrafted ZB-H1 and ZB-H2 (bubble (p-1)(T_F+T_B-T_W) with 1F1B's p micro-batches in flight, and
(p-1)(T_F+T_B-2T_W) with 2p-1), §3.1 the heuristic that places them (as many warm-up forwards as
memory allows, a B as soon as it can run, a W in every gap), §6 the V schedule; ZB-V after
torch.distributed.pipelining schedules.py ScheduleZBVZeroBubble._calculate_single_rank_operations.
docs/schedules.md derives the bubbles and peaks the tests check.
"""
from simsp.errors import UserError
from simsp.training.pipeline.schedule_step import (
    BACKWARD, FORWARD, WEIGHT, Schedule, Step)


def zb_h1(p: int, m: int) -> Schedule:
    """ZB-H1 (arXiv:2401.10241 §2.1, Fig. 3): 1F1B's order of F and B, so stage r holds at most
    p - r micro-batches between F and B, with stage r's W of micro-batch i after its B of i + r
    (the rest at the tail): W fills the time the stage would wait for a gradient, and at most r
    Ws wait on stage r, so no stage holds more than 1F1B's first stage (W's inputs are part of
    B's)."""
    from simsp.training.pipeline.schedules import one_f_one_b  # its F/B order
    _check_sizes(p, m)
    schedule = []
    for r, steps in enumerate(one_f_one_b(p, m)):
        stage = []
        for step in steps:
            stage.append(step)
            if step.kind == BACKWARD and step.micro_batch >= r:
                stage.append(Step(WEIGHT, step.micro_batch - r))
        schedule.append(stage + [Step(WEIGHT, i) for i in range(max(0, m - r), m)])
    return schedule


def zb_h2(p: int, m: int) -> Schedule:
    """ZB-H2: stage r holds at most 2(p - r) - 1, enough warm-up forwards to fill the bubble
    before the first B (arXiv:2401.10241 §2.2); zero bubble once m >= 2p - 1."""
    _check_sizes(p, m)
    return unit_time_heuristic(p, m, [2 * (p - r) - 1 for r in range(p)])


def unit_time_heuristic(p: int, m: int, limits: list[int]) -> Schedule:
    """Each stage's steps with T_F = T_B = T_W = one tick (arXiv:2401.10241 §3.1): a free stage
    runs its next B if its gradient has arrived, else its next F if its activation has arrived
    and fewer than limits[r] micro-batches are between F and B, else its oldest pending W."""
    finished: dict = {}  # (kind, micro_batch, stage) -> the tick it ends
    state = [_StageCursor() for _ in range(p)]
    schedule: Schedule = [[] for _ in range(p)]
    tick = 0
    while sum(len(steps) for steps in schedule) < 3 * p * m:
        for stage in range(p):
            step = state[stage].next_step(stage, p, m, limits[stage], finished, tick)
            if step is not None:
                finished[(step.kind, step.micro_batch, stage)] = tick + 1
                schedule[stage].append(step)
        tick += 1
    return schedule


class _StageCursor:
    """One stage's progress in the heuristic: next F and B micro-batch, pending Ws, busy until."""

    def __init__(self):
        self.forward = self.backward = self.busy_until = 0
        self.weights: list[int] = []  # micro-batches whose B ran and W did not, oldest first

    def next_step(self, stage: int, p: int, m: int, limit: int, finished: dict,
                  tick: int) -> Step | None:
        """The step this stage starts at `tick`, or None (busy, or nothing is ready)."""
        if self.busy_until > tick:
            return None
        step = self._pick(stage, p, m, limit, finished, tick)
        if step is not None:
            self.busy_until = tick + 1
        return step

    def _pick(self, stage, p, m, limit, finished, tick) -> Step | None:
        """B first, then F within the limit, then the oldest W (each one tick long)."""
        b, f = self.backward, self.forward
        grad = (FORWARD, b, stage) if stage == p - 1 else (BACKWARD, b, stage + 1)
        if b < f and finished.get(grad, tick + 1) <= tick:
            self.backward += 1
            self.weights.append(b)
            return Step(BACKWARD, b)
        ready = stage == 0 or finished.get((FORWARD, f, stage - 1), tick + 1) <= tick
        if f < m and f - b < limit and ready:
            self.forward += 1
            return Step(FORWARD, f)
        return Step(WEIGHT, self.weights.pop(0)) if self.weights else None


def zbv(p: int, m: int, v: int = 2) -> Schedule:
    """ZB-V: two chunks per stage in the V placement (stage r holds virtual stages r and
    2p-1-r); torch's ScheduleZBVZeroBubble order, its padding micro-batches (up to 2p-1) dropped."""
    _check_sizes(p, m)
    if v != 2:
        raise UserError("v", f"zbv holds exactly 2 model chunks per stage, not {v}")
    padded = max(2 * p - 1, m)
    return [[step for step in _zbv_stage(p, padded, r) if step.micro_batch < m]
            for r in range(p)]


def _zbv_stage(p: int, m: int, rank: int) -> list[Step]:
    """One stage's ZB-V steps: warm-up, steady state, cool-down (torch's three phases)."""
    order = _Counts()
    steps = [order.take(FORWARD, 0) for _ in range(2 * (p - rank) - 1)]
    for _ in range(rank):
        steps += [order.take(FORWARD, 1), order.take(FORWARD, 0)]
    for _ in range(p - rank):
        steps += [order.take(FORWARD, 1), order.take(BACKWARD, 1), order.take(WEIGHT, 1)]
    while order.count[(FORWARD, 1)] < order.count[(FORWARD, 0)] or \
            order.count[(FORWARD, 0)] < m:
        if order.count[(FORWARD, 0)] < m:
            steps.append(order.take(FORWARD, 0))
        steps += [order.take(BACKWARD, 0), order.take(WEIGHT, 0)]
        steps += [order.take(FORWARD, 1), order.take(BACKWARD, 1), order.take(WEIGHT, 1)]
    return steps + _zbv_cooldown(order, p, rank)


def _zbv_cooldown(order: "_Counts", p: int, rank: int) -> list[Step]:
    """The cool-down: B of both chunks, then B and W of chunk 0, then the Ws left (chunk 1's
    first, as torch orders them)."""
    steps = []
    for _ in range(rank):
        steps += [order.take(BACKWARD, 0), order.take(BACKWARD, 1)]
    for _ in range(p - rank):
        steps += [order.take(BACKWARD, 0), order.take(WEIGHT, 0)]
    for chunk in (1, 0):
        while order.count[(WEIGHT, chunk)] < order.count[(BACKWARD, chunk)]:
            steps.append(order.take(WEIGHT, chunk))
    return steps


class _Counts:
    """How many steps of each (kind, chunk) a stage has taken: the next one's micro-batch."""

    def __init__(self):
        self.count = {(kind, chunk): 0 for kind in (FORWARD, BACKWARD, WEIGHT) for chunk in (0, 1)}

    def take(self, kind: str, chunk: int) -> Step:
        """The next step of this kind on this chunk."""
        micro_batch = self.count[(kind, chunk)]
        self.count[(kind, chunk)] += 1
        return Step(kind, micro_batch, chunk)


def _check_sizes(p: int, m: int) -> None:
    """Stages and micro-batches must be positive integers."""
    for field, value in (("p", p), ("m", m)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UserError(field, f"must be a positive integer, got {value!r}")
