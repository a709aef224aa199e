"""The zero-bubble schedules as data: ZB-H1, ZB-H2 and ZB-V, whose backward is split into B
(input gradients) and W (weight gradients) so that W steps fill the pipeline's bubble.

Sources: Qi et al., "Zero Bubble Pipeline Parallelism", arXiv:2401.10241 (ICLR 2024): §2 the
handcrafted ZB-H1 and ZB-H2 (bubble (p-1)(T_F+T_B-T_W) with 1F1B's p micro-batches in flight, and
(p-1)(T_F+T_B-2T_W) with 2p-1; Figs. 3 and 4 place each stage's W a fixed number of Bs after
its own B), §6 the V schedule; ZB-V after
torch.distributed.pipelining schedules.py ScheduleZBVZeroBubble._calculate_single_rank_operations.
docs/schedules.md derives the bubbles and peaks the tests check.
"""
from simsp.errors import UserError
from simsp.training.pipeline.schedule_step import (
    BACKWARD, FORWARD, WEIGHT, Schedule, Step)


def zb_h1(p: int, m: int) -> Schedule:
    """ZB-H1 (arXiv:2401.10241 §2.1, Fig. 3): 1F1B's order of F and B (p - r forwards before
    stage r's first B), and stage r's W of micro-batch i after its B of i + r."""
    _check_sizes(p, m)
    return [delayed_weights(m, p - r, r) for r in range(p)]


def zb_h2(p: int, m: int) -> Schedule:
    """ZB-H2 (arXiv:2401.10241 §2.2, Fig. 4): 2(p - r) - 1 forwards before stage r's first B,
    enough to fill the bubble before it, and stage r's W of micro-batch i after its B of
    i + 2r; zero bubble once m >= 2p - 1."""
    _check_sizes(p, m)
    return [delayed_weights(m, 2 * (p - r) - 1, 2 * r) for r in range(p)]


def delayed_weights(m: int, warmup: int, delay: int) -> list[Step]:
    """One stage's steps: `warmup` forwards, then each B followed by the next F, and each W
    of micro-batch i right after the B of i + delay (the last `delay` Ws at the tail).

    The W that waits `delay` Bs fills the time the stage would otherwise wait for a gradient
    (stage r's wait before its first B grows with p - r, its spare Ws with r), and at most
    `delay` Ws are pending, each holding less than a micro-batch's activations
    (docs/schedules.md derives the bubbles and peaks)."""
    warmup = min(warmup, m)
    forwards = [Step(FORWARD, i) for i in range(m)]
    steps = forwards[:warmup]
    for b in range(m):
        steps.append(Step(BACKWARD, b))
        if b >= delay:
            steps.append(Step(WEIGHT, b - delay))
        if warmup + b < m:
            steps.append(forwards[warmup + b])
    return steps + [Step(WEIGHT, i) for i in range(max(0, m - delay), m)]


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
