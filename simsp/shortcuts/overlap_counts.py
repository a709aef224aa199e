"""What Transformer Engine's TP communication overlap (--tp-comm-overlap, userbuffers;
model/base/tp_overlap.py, docs/tp-overlap.md) makes the engine simulate per layer-step, counted
for the work estimate (shortcuts/work_counts.py): the ring phases left to the TP group's NCCL
rings, and the ring-exchange steps.

Per layer-step, as model/base/linear.py runs the four TE GEMM sites under overlap (the GEMM
names and methods: scenario/tp_overlap.py ub_gemms, TE's defaults or the user's file):
- forward: qkv_fprop and fc1_fprop are ring-exchange all-gathers; proj_fprop and fc2_fprop
  reduce-scatter their output in num_splits ring phases (pipeline) or by ring exchange;
- backward: proj_dgrad and fc2_dgrad are ring-exchange all-gathers; qkv and fc1 run TE's bulk
  pair (the input's all-gather beside the dgrad GEMM, the dgrad's reduce-scatter beside the
  wgrad GEMM: two ring phases), or under a dgrad reduce-scatter method the input's all-gather
  (one phase) and the dgrad output's reduce-scatter in num_splits phases or by ring exchange.
A ring-exchange all-gather sends t − 1 steps (`aggregate`: the pair swap and t/2 − 1 steps of
two chunks, t/2 in all), a ring-exchange reduce-scatter t − 1 steps; each step is one
all-to-all over the TP group (model/base/tp_overlap.py _send_to), which starts a flow for every
ordered pair of its t ranks, the t − 1 zero-byte ones included (engine/collectives/all_to_all.py),
whatever the group's timing method (engine/communicator.py _all_to_all).
"""

from simsp.scenario.tp_overlap import PIPELINE, is_dgrad_rs, ub_gemms

AG_SITES = {"forward": ("qkv_fprop", "fc1_fprop"), "backward": ("proj_dgrad", "fc2_dgrad")}
RS_FPROP = ("proj_fprop", "fc2_fprop")  # row-parallel forward: output reduce-scattered
COLUMN_DGRAD = ("qkv_dgrad", "fc1_dgrad")  # column-parallel backward: bulk or dgrad RS


def _rs_counts(ub, t: int) -> tuple[int, int]:
    """(ring phases, exchange steps) of one overlapped reduce-scatter: num_splits phases when
    pipelined, t − 1 steps by ring exchange."""
    return (ub.num_splits, 0) if ub.method == PIPELINE else (0, t - 1)


def _ag_steps(ub, t: int) -> int:
    """Exchange steps of one ring-exchange all-gather: t − 1, or t/2 under `aggregate`."""
    return t // 2 if ub.aggregate else t - 1


def overlap_counts(sc) -> tuple[int, int, int, int]:
    """Per layer-step of one TP group under TP overlap: (forward ring phases, backward ring
    phases, forward exchange steps, backward exchange steps)."""
    t = sc.parallel.tp
    gemms = ub_gemms(t, sc.parallel.tp_comm_overlap_cfg)
    forward = [_rs_counts(gemms[name], t) for name in RS_FPROP]  # (phases, steps) per site
    backward = []
    for name in COLUMN_DGRAD:
        ub = gemms[name]
        if is_dgrad_rs(ub):  # the input's all-gather, then the dgrad output's reduce-scatter
            phases, steps = _rs_counts(ub, t)
            backward.append((1 + phases, steps))
        else:  # TE's bulk pair: a whole all-gather and a whole reduce-scatter
            backward.append((2, 0))
    ag = {kind: sum(_ag_steps(gemms[name], t) for name in names)
          for kind, names in AG_SITES.items()}
    return (sum(c[0] for c in forward), sum(c[0] for c in backward),
            ag["forward"] + sum(c[1] for c in forward),
            ag["backward"] + sum(c[1] for c in backward))


def exchange_flows(sc, templates: bool, tp_groups: int) -> int:
    """Flows the ring exchanges of one iteration start: steps x t(t − 1) per layer-step of each
    of `tp_groups` TP groups (one per simulated stage's rank), the forward again under full
    recompute; under layer templates (model/replay.py) one layer's forward and backward,
    recorded once and replayed."""
    p = sc.parallel
    if not p.tp_comm_overlap or p.tp == 1:
        return 0
    _, _, forward, backward = overlap_counts(sc)
    recomputed = forward if p.recompute_granularity == "full" else 0
    steps = forward + backward + recomputed
    if templates:
        return steps * p.tp * (p.tp - 1)
    stage_steps = sc.model.num_layers * p.num_micro_batches / p.pp
    return round(tp_groups * stage_steps * steps * p.tp * (p.tp - 1))
