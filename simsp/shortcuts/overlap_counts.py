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
whatever the group's timing method (engine/exchanges.py _all_to_all). The sites are the
dense MLP's and the attention's (an MoE layer's experts and MLA's projections are not TE's
overlapped GEMMs: block_weights).
"""

from simsp.scenario.tp_overlap import PIPELINE, is_dgrad_rs, ub_gemms

AG_GEMMS = ("qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad")  # ring-exchange all-gathers
RS_FPROP = ("proj_fprop", "fc2_fprop")  # row-parallel forward: output reduce-scattered
# the GEMM sites of one layer-step by direction, each with the block it belongs to
SITES = {"forward": (("qkv_fprop", "qkv"), ("proj_fprop", "attn"), ("fc1_fprop", "mlp"),
                     ("fc2_fprop", "mlp")),
         "backward": (("proj_dgrad", "attn"), ("qkv_dgrad", "qkv"), ("fc2_dgrad", "mlp"),
                      ("fc1_dgrad", "mlp"))}


def _rs_counts(ub, t: int) -> tuple[int, int]:
    """(ring phases, exchange steps) of one overlapped reduce-scatter: num_splits phases when
    pipelined, t − 1 steps by ring exchange."""
    return (ub.num_splits, 0) if ub.method == PIPELINE else (0, t - 1)


def _site_counts(ub, t: int) -> tuple[int, int]:
    """(ring phases, exchange steps) of one GEMM site: a ring-exchange all-gather t − 1 steps
    (t/2 under `aggregate`); a forward reduce-scatter as _rs_counts; a column-parallel dgrad
    TE's bulk pair (two whole phases) or, as a dgrad reduce-scatter, the input's all-gather
    and the output's reduce-scatter."""
    if ub.name in AG_GEMMS:
        return 0, t // 2 if ub.aggregate else t - 1
    if ub.name in RS_FPROP:
        return _rs_counts(ub, t)
    if is_dgrad_rs(ub):
        phases, steps = _rs_counts(ub, t)
        return 1 + phases, steps
    return 2, 0


def block_weights(sc) -> dict[str, float]:
    """How many of each block's overlapped sites a mean layer runs: TE's GEMMs are the dense
    MLP's (model/blocks/mlp/dense.py; an MoE layer's experts are not overlapped) and the
    attention's QKV (mha.py; MLA's projections are not) and output projection (core.py)."""
    m = sc.model
    dense = sum(not m.is_moe_layer(i) for i in range(m.num_layers)) / m.num_layers
    return {"qkv": 0.0 if m.multi_latent_attention else 1.0, "attn": 1.0, "mlp": dense}


def overlap_counts(sc) -> tuple[float, float, float, float]:
    """Per layer-step of one TP group under TP overlap: (forward ring phases, backward ring
    phases, forward exchange steps, backward exchange steps)."""
    t = sc.parallel.tp
    gemms = ub_gemms(t, sc.parallel.tp_comm_overlap_cfg)
    weights = block_weights(sc)
    totals = []
    for direction in ("forward", "backward"):
        counts = [(weights[block], _site_counts(gemms[name], t))
                  for name, block in SITES[direction]]  # (weight, (phases, steps)) per site
        totals.append([sum(w * c[k] for w, c in counts) for k in (0, 1)])
    (fwd_phases, fwd_steps), (bwd_phases, bwd_steps) = totals
    return fwd_phases, bwd_phases, fwd_steps, bwd_steps


def exchange_flows(sc, templates: bool, tp_groups: int) -> int:
    """Flows the ring exchanges of one iteration start: steps x t(t − 1) per layer-step of each
    of `tp_groups` TP groups (one per simulated stage's rank), the forward again under full
    recompute and fc1's all-gather again under selective recompute of the MLP
    (dense.py _recompute); under layer templates (model/replay.py) one layer's forward and
    backward, recorded once and replayed."""
    p = sc.parallel
    if not p.tp_comm_overlap or p.tp == 1:
        return 0
    _, _, forward, backward = overlap_counts(sc)
    recomputed = forward if p.recompute_granularity == "full" else 0
    if "mlp" in p.recompute_module_set:
        fc1 = ub_gemms(p.tp, p.tp_comm_overlap_cfg)["fc1_fprop"]
        recomputed += block_weights(sc)["mlp"] * _site_counts(fc1, p.tp)[1]
    steps = forward + backward + recomputed
    if templates:
        return round(steps * p.tp * (p.tp - 1))
    stage_steps = sc.model.num_layers * p.num_micro_batches / p.pp
    return round(tp_groups * stage_steps * steps * p.tp * (p.tp - 1))
