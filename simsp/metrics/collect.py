"""Every metric of `simsp run` in one JSON-ready dict.

MFU and HFU are computed as K22 §6.3 does (docs/MODEL.md#flops): the closed-form model and hardware
FLOPs with B = global batch over (iteration time · GPUs · 312 TFLOP/s); the FLOPs the simulated
GEMMs actually counted are reported beside them.
"""

from simsp import analytic
from simsp.hardware.constants import GPUS, LinkCalibration, cluster_compute
from simsp.hardware.costmodel import calibration_table
from simsp.metrics.flops import counted_flops, hardware_flops, model_flops
from simsp.metrics.layout import architecture_section, layout
from simsp.metrics.memory import rank_memory
from simsp.metrics.sections import (fsdp_section, in_network_section, moe_section,
                                    offload_section, overlaps_section)
from simsp.metrics.timing import COMM_KEYS, OPTIONAL_KEYS, bubble, exposure, iteration_time
from simsp.model.param_counts import parameter_counts


def collect(run, shortcuts, name_live: bool = True) -> dict:
    """Every metric of `simsp run`, JSON-ready (keys of issue #5 first); `name_live=False`
    leaves the tensors live at an out-of-memory verdict unnamed (a sweep row's cost)."""
    sc = run.inputs.sc
    m, p = sc.model, sc.parallel
    t_iter = iteration_time(run)
    gpus, peak = p.world_size, GPUS[sc.cluster.gpu].peak_flops
    bubble_all, bubble_stages = bubble(run)
    counted_model, counted_hw = counted_flops(run)
    breakdown = exposure(run)
    exposed = [{k: e[k] for k in COMM_KEYS + OPTIONAL_KEYS if e.get(k)} for e in breakdown]
    ranks = [rank_memory(run, rank, name_live) for rank in range(p.world_size)]
    return {
        "iteration_time_s": t_iter,
        "tokens_per_s": p.global_batch * m.seq_length / t_iter,
        "mfu": model_flops(sc) / (t_iter * gpus * peak),
        "hfu": hardware_flops(sc) / (t_iter * gpus * peak),
        "bubble_fraction": bubble_all,
        "ranks": ranks,
        "scenario": sc.run.name,
        "mode": sc.run.mode,
        "layout": layout(sc),
        "bubble_fraction_per_stage": bubble_stages,
        "exposed_comm_s_per_stage": exposed,
        "exposed_comm_s": max(sum(e.values()) for e in exposed),
        "exposed_s_per_stage": breakdown,
        "model_flops": model_flops(sc),
        "hardware_flops": hardware_flops(sc),
        "counted_model_flops": counted_model,
        "counted_hardware_flops": counted_hw,
        "mfu_counted": counted_model / (t_iter * gpus * peak),
        "hfu_counted": counted_hw / (t_iter * gpus * peak),
        "first_stage_activation_formula_bytes": analytic.first_stage_activation_bytes(sc),
        "parameters": parameter_counts(m),
        "oom": any(r["oom"] for r in ranks),
        "loss": run.loss,
        "calibration": {"compute": calibration_table(cluster_compute(sc.cluster)), "links": LinkCalibration.from_cluster(sc.cluster).describe()},
        "shortcuts": shortcuts.flags(),
        "shortcuts_used": shortcuts_used(shortcuts, run.inputs.replayed,
                                         run.inputs.world.shadows),
        **architecture_section(sc),
        **fsdp_section(run),
        **overlaps_section(run),
        **offload_section(run),
        **moe_section(run),
        **in_network_section(run),
    }


def shortcuts_used(shortcuts, replayed: frozenset, shadows=None) -> dict:
    """The verdict's reasons (Shortcuts.why), the representative's naming the ranks of other
    replicas that replayed their steps after each chunk's first (training/pipeline/
    step_replay.py): timing only, their memory rows their stage's replica 0's; and the CP
    ranks that ran as their leader's shadows (training/context_parallel/shadows.py)."""
    why = shortcuts.why()
    if shadows is not None:
        why["representative"] += (f"; CP rank 0 of each stage runs for its group, the other "
                                  f"{len(shadows.shadowed())} CP ranks following it in vector "
                                  f"clocks (their own CP kernels, ring ends and pipeline "
                                  f"transfers), their memory rows their leader's")
    if replayed:
        why["representative"] += (f"; the {len(replayed)} ranks of the other replicas replay "
                                  f"their steps after each chunk's first (each a pure delay), "
                                  f"their memory rows replica 0's of their stage")
    return why
