"""1F1B and ZB-H1 as op schedules (op_step.py), for the unit-time list scheduler and the pipeline
lesson: 1F1B's backward as one BW task, ZB-H1's split into B and a deferred W.

1F1B: Megatron-LM's warm-up, steady and cool-down (schedules.py one_f_one_b_warmup). ZB-H1: the
step lists of zero_bubble.py (Qi et al., "Zero Bubble Pipeline Parallelism", arXiv:2401.10241
§2.1 and Figure 3), one op per step; bubble (p-1)(F+B-W) and 1F1B's activation memory.
"""
from simsp.training.pipeline.op_step import (FORWARD, FULL_BACKWARD, OpSchedule, line_routes,
                                             single)
from simsp.training.pipeline.schedules import one_f_one_b_warmup
from simsp.training.pipeline.zero_bubble import zb_h1


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
    """ZB-H1 in op form: the very schedule `simsp run --schedule zb-h1` executes
    (zero_bubble.zb_h1, the ZB paper's Figure 3: stage r runs W of micro-batch i after B of
    i + r), each step one op."""
    stages = zb_h1(p, m)
    return OpSchedule("zb-h1", tuple(tuple(single(step.kind, step.micro_batch) for step in steps)
                                     for steps in stages), line_routes(p, m))
