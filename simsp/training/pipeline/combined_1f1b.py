"""Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm): the steady state's
forward of one micro-batch and backward of another run as one step, layer by layer, so that
one's expert all-to-all runs on the communication stream beside the other's compute.

NVIDIA/Megatron-LM commit d98e8a6: megatron/core/pipeline_parallel/schedules.py
`get_pp_rank_microbatches` (the interleaved warm-up gets one extra forward "to ensure the
forward and backward computations are independent in all 1f1b steps") and
`forward_backward_helper_wrapper`; megatron/core/pipeline_parallel/combined_1f1b.py
`combined_1f1b_schedule_for_no_pipelining` (PP 1: F0, F1+B0, ..., F(m-1)+B(m-2), B(m-1)) and
`combined_1f1b_schedule_for_interleaved_pipelining`. The two micro-batches' pieces share the
rank's streams as model/blocks/moe/comm_stream.py says.
"""
from simsp.training.pipeline.schedule_step import Step
from simsp.training.pipeline.schedules import (
    interleaved_one_f_one_b, interleaved_warmup, one_f_one_b, warmup_steady_cooldown)


def combined_warmup(p: int, m: int, v: int, stage: int) -> int:
    """Warm-up forwards with the overlap: interleaved's plus one, at most m·v; PP 1's one
    forward alone (combined_1f1b_schedule_for_no_pipelining)."""
    if p == 1:
        return min(1, m)
    return min(interleaved_warmup(p, m, v, stage) + 1, m * v)


def combined_schedule(p: int, m: int, v: int) -> list[list[Step]]:
    """Per stage, Megatron's steps with the overlap's warm-up: the interleaved schedule's
    forward and backward orders (PP 1: micro-batch order), cut at combined_warmup."""
    base = one_f_one_b(1, m) if p == 1 else interleaved_one_f_one_b(p, m, v)
    schedule = []
    for stage, steps in enumerate(base):
        forwards = [step for step in steps if step.kind == "F"]
        backwards = [step for step in steps if step.kind == "B"]
        schedule.append(warmup_steady_cooldown(forwards, backwards,
                                               combined_warmup(p, m, v, stage)))
    return schedule


def combined_forwards(steps: list[Step], warmup: int) -> frozenset:
    """The forwards that run combined with the backward after them: the steady state's
    (positions warmup, warmup + 2, ... while a backward follows)."""
    total = len(steps) // 2
    return frozenset(steps[warmup + 2 * i] for i in range(total - warmup))
