"""1F1B and ZB-H1 as op schedules (op_step.py), for the unit-time list scheduler and the pipeline
lesson: 1F1B's backward as one BW task, ZB-H1's split into B and a deferred W.

1F1B: Megatron-LM's warm-up, steady and cool-down (schedules.py one_f_one_b_warmup). ZB-H1: Qi
et al., "Zero Bubble Pipeline Parallelism" (arXiv:2401.10241) §3.1 and Figure 3 (top): 1F1B's
order of F and B, each stage i starting its W passes i micro-batches late so that the last
stage runs F and B back to back and every stage's W fills the cool-down; bubble (p-1)(F+B-W)
and 1F1B's activation memory.
"""
from simsp.training.pipeline.op_step import (FORWARD, FULL_BACKWARD, INPUT_GRAD, WEIGHT_GRAD, Op,
                                             OpSchedule, line_routes, single)
from simsp.training.pipeline.schedules import one_f_one_b_warmup


def one_f_one_b_ops(p: int, m: int) -> OpSchedule:
    """Megatron's 1F1B with the whole backward (BW) of a micro-batch as one op."""
    ranks = []
    for stage in range(p):
        warmup = one_f_one_b_warmup(p, m, stage)
        ops = [single(FORWARD, k) for k in range(warmup)]
        for k in range(m - warmup):
            ops += [single(FORWARD, k + warmup), single(FULL_BACKWARD, k)]
        ops += [single(FULL_BACKWARD, k) for k in range(m - warmup, m)]
        ranks.append(tuple(ops))
    return OpSchedule("1f1b", tuple(ranks), line_routes(p, m))


def zb_h1_ops(p: int, m: int) -> OpSchedule:
    """ZB-H1: 1F1B's F and B order; stage i runs W of micro-batch k - i after B of k, one W after
    each cool-down B, and the W passes left at the end (ZB paper Figure 3)."""
    return OpSchedule("zb-h1", tuple(tuple(_zb_h1_stage(p, m, stage)) for stage in range(p)),
                      line_routes(p, m))


def _zb_h1_stage(p: int, m: int, stage: int) -> list[Op]:
    """One stage's ZB-H1 ops: warm-up F, steady F B [W], cool-down B W, the last W passes."""
    warmup = one_f_one_b_warmup(p, m, stage)
    ops = [single(FORWARD, k) for k in range(warmup)]
    weights = 0  # W passes run so far, in micro-batch order
    for k in range(m - warmup):
        ops += [single(FORWARD, k + warmup), single(INPUT_GRAD, k)]
        if k >= stage:
            ops.append(single(WEIGHT_GRAD, weights))
            weights += 1
    for k in range(m - warmup, m):
        ops.append(single(INPUT_GRAD, k))
        if weights <= k:
            ops.append(single(WEIGHT_GRAD, weights))
            weights += 1
    return ops + [single(WEIGHT_GRAD, k) for k in range(weights, m)]
