"""Pipeline schedules as plain data: per stage, the ordered list of forward/backward steps.

Sources: N21 §2.2 (GPipe, 1F1B, interleaved 1F1B) and Megatron-LM
megatron/core/pipeline_parallel/schedules.py (warm-up counts and chunk/micro-batch numbering);
the zero-bubble family (split backward: B then W) is training/pipeline/zero_bubble.py's.
"""
from simsp.errors import UserError
from simsp.training.pipeline.dualpipe import dualpipe_steps, dualpipev_steps
from simsp.training.pipeline.schedule_check import check_schedule, execution_order
from simsp.training.pipeline.schedule_step import (
    BACKWARD, DUAL, FORWARD, ROUND_ROBIN, V_SHAPE, Schedule, Step)
from simsp.training.pipeline.schedule_timing import (
    Span, Timeline, bubble_fraction, pipeline_bubble, simulate_uniform)
from simsp.training.pipeline.zero_bubble import zb_h1, zb_h2, zbv

__all__ = ["Step", "Schedule", "Span", "Timeline", "SCHEDULES", "gpipe", "one_f_one_b",
           "interleaved_one_f_one_b", "build_schedule", "check_schedule", "execution_order",
           "simulate_uniform", "bubble_fraction", "pipeline_bubble", "max_in_flight",
           "one_f_one_b_warmup", "interleaved_warmup", "warmup_steady_cooldown", "placement_of",
           "SPLIT_BACKWARD"]


def gpipe(p: int, m: int) -> Schedule:
    """GPipe: every forward, then every backward, both in micro-batch order (N21 Fig. 3)."""
    _check_sizes(p, m, 1)
    stage = [Step(FORWARD, i) for i in range(m)] + [Step(BACKWARD, i) for i in range(m)]
    return [list(stage) for _ in range(p)]


def one_f_one_b_warmup(p: int, m: int, stage: int) -> int:
    """Warm-up forwards of 1F1B on stage r: min(p - r - 1, m) (Megatron schedules.py)."""
    return min(p - stage - 1, m)


def one_f_one_b(p: int, m: int) -> Schedule:
    """Megatron-LM non-interleaved 1F1B (PipeDream-Flush, N21 §2.2.1).

    Warm-up forwards, then steady state one forward / one backward, then cool-down backwards.
    """
    _check_sizes(p, m, 1)
    forwards = [Step(FORWARD, i) for i in range(m)]
    backwards = [Step(BACKWARD, i) for i in range(m)]
    return [warmup_steady_cooldown(forwards, backwards, one_f_one_b_warmup(p, m, r))
            for r in range(p)]


def interleaved_warmup(p: int, m: int, v: int, stage: int) -> int:
    """Interleaved warm-up on stage r: min(2(p - r - 1) + (v - 1)p, m*v) (Megatron schedules.py).

    Megatron also makes every step warm-up when m == p; the published formula (N21 §2.2.2) is kept:
    same iteration time, but later stages stash fewer chunks than Megatron does in that case.
    """
    return min(2 * (p - stage - 1) + (v - 1) * p, m * v)


def interleaved_one_f_one_b(p: int, m: int, v: int) -> Schedule:
    """Megatron-LM interleaved 1F1B (forward_backward_pipelining_with_interleaving, N21 §2.2.2)."""
    _check_sizes(p, m, v)
    if m % p:
        raise UserError("m", f"interleaving needs {m} micro-batches to be a multiple of p={p}")
    forwards = [_interleaved_step(FORWARD, k, p, v) for k in range(m * v)]
    backwards = [_interleaved_step(BACKWARD, k, p, v) for k in range(m * v)]
    return [warmup_steady_cooldown(forwards, backwards, interleaved_warmup(p, m, v, r))
            for r in range(p)]


SCHEDULES = {
    "gpipe": lambda p, m, v: gpipe(p, m),
    "1f1b": lambda p, m, v: one_f_one_b(p, m),
    "interleaved": interleaved_one_f_one_b,
    "zb-h1": lambda p, m, v: zb_h1(p, m),
    "zb-h2": lambda p, m, v: zb_h2(p, m),
    "zbv": zbv,
    "dualpipev": lambda p, m, v: dualpipev_steps(p, m),
    "dualpipe": lambda p, m, v: dualpipe_steps(p, m),
}
CHUNKED = ("interleaved", "zbv", "dualpipev", "dualpipe")  # the schedules that hold more than one chunk per stage
SPLIT_BACKWARD = ("zb-h1", "zb-h2", "zbv", "dualpipev", "dualpipe")  # B then W (arXiv:2401.10241)
V_PLACED = ("zbv", "dualpipev")  # two chunks per stage as a V (schedule_step.V_SHAPE)


def build_schedule(name: str, p: int, m: int, v: int = 1) -> Schedule:
    """The schedule called `name` (a key of SCHEDULES); v is for interleaved and zbv (2)."""
    if name not in SCHEDULES:
        raise UserError("schedule", f"unknown {name!r}; choose one of {sorted(SCHEDULES)}")
    if v != 1 and name not in CHUNKED:
        raise UserError("v", f"{v} model chunks per stage need interleaved or zbv, not {name}")
    return SCHEDULES[name](p, m, v)


def placement_of(name: str) -> str:
    """Where a schedule's chunks sit: the V for zbv and dualpipev, DualPipe's two pipelines,
    else Megatron's round robin."""
    if name == "dualpipe":
        return DUAL
    return V_SHAPE if name in V_PLACED else ROUND_ROBIN


def max_in_flight(schedule: Schedule) -> list[int]:
    """Per stage, the peak count of (micro-batch, chunk) with forward done and backward not."""
    return [_peak_in_flight(steps) for steps in schedule]


def _peak_in_flight(steps: list[Step]) -> int:
    """Walk one stage's steps counting stashed activations; forward +1, backward -1 (a W step
    keeps only the linears' inputs, counted apart: arXiv:2401.10241 Table 1's M_W)."""
    current = peak = 0
    for step in steps:
        current += {FORWARD: 1, BACKWARD: -1}.get(step.kind, 0)
        peak = max(peak, current)
    return peak


def _interleaved_step(kind: str, k: int, p: int, v: int) -> Step:
    """The k-th chunk-step of one direction.

    Megatron schedules.py get_model_chunk_id and get_microbatch_id_in_model_chunk.
    """
    chunk = (k // p) % v
    if kind == BACKWARD:
        chunk = v - 1 - chunk
    micro_batch = (k // (p * v)) * p + k % p
    return Step(kind, micro_batch, chunk)


def warmup_steady_cooldown(forwards: list[Step], backwards: list[Step],
                            warmup: int) -> list[Step]:
    """Megatron's loop: `warmup` forwards, pairs (forward k+warmup, backward k), rest backwards."""
    steps = list(forwards[:warmup])
    for forward, backward in zip(forwards[warmup:], backwards):
        steps += [forward, backward]
    steps += backwards[len(forwards) - warmup:]
    return steps


def _check_sizes(p: int, m: int, v: int) -> None:
    """Stages, micro-batches and chunks must all be positive integers."""
    for field, value in (("p", p), ("m", m), ("v", v)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UserError(field, f"must be a positive integer, got {value!r}")
