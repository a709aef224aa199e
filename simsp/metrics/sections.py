"""The metrics only some runs have: sharded data parallelism's units, the DP and TP overlaps,
CPU offloading, the MoE load and the in-network collectives."""

from simsp.hardware.profiles import gpu_profile
from simsp.metrics.timing import stage_ranks


def in_network_section(run) -> dict:
    """Under --use-sharp: how many collectives on the DP-CP groups (the communicators with
    CollNet) ran as each (collective, algorithm), e.g. reduce_scatter/collnet_direct or
    all_reduce/ring (engine/collectives/collnet.py); absent otherwise."""
    if not run.inputs.sc.cluster.use_sharp:
        return {}
    comm = run.inputs.world.comm
    counts: dict = {}
    for stats in comm.stats:
        if comm.sharp_groups is None or stats.gpus in comm.sharp_groups:
            key = f"{stats.collective}/{stats.algorithm}"
            counts[key] = counts.get(key, 0) + 1
    return {"in_network": dict(sorted(counts.items()))}


def moe_section(run) -> dict:
    """The MoE layers' load (training/moe_load.py, imported only for a model with experts)."""
    if run.inputs.sc.model.num_experts is None:
        return {}
    from simsp.training.moe_load import moe_metrics
    return moe_metrics(run.inputs)


def offload_section(run) -> dict:
    """Under --cpu-offloading, per stage: bytes moved to the host, copy seconds, seconds the
    compute waited, and the host memory held at its peak (training/pipeline/offload.py)."""
    p = run.inputs.sc.parallel
    if not p.cpu_offloading:
        return {}
    stages = [run.states[rank].offload.stats.as_dict() for rank in stage_ranks(run)]
    return {"offload": {"layers": p.cpu_offloading_num_layers,
                        "host_link_GBps": gpu_profile(run.inputs.sc.cluster.gpu).host_link_GBps,
                        "per_stage": stages,
                        "host_peak_bytes": max(s["host_peak_bytes"] for s in stages)}}


def overlaps_section(run) -> dict:
    """What the DP and the TP overlaps hid and left exposed, per stage (absent when off)."""
    return {**_dp_overlap(run), **_tp_overlap(run)}


def _dp_overlap(run) -> dict:
    """With --overlap-grad-reduce or --overlap-param-gather, per stage: the DP parameter
    all-gathers' and gradient reductions' seconds, the part the program waited on (exposed)
    and the part compute hid (training/data_parallel/grad_buckets.py); absent otherwise."""
    p = run.inputs.sc.parallel
    if p.fsdp is not None or not (p.overlap_grad_reduce or p.overlap_param_gather):
        return {}
    return {"dp_overlap_per_stage": [run.states[rank].ddp_buckets.overlap_report()
                                     for rank in stage_ranks(run)]}


def _tp_overlap(run) -> dict:
    """Under --tp-comm-overlap, per stage and Transformer Engine method: the seconds of TP
    communication it overlapped, the part the GEMMs waited on (exposed) and the part they hid
    (model/base/tp_overlap.py; docs/tp-overlap.md); absent otherwise."""
    if not run.inputs.sc.parallel.tp_comm_overlap:
        return {}
    stages = []
    for rank in stage_ranks(run):
        seen = run.inputs.world.ranks[rank].tp_overlap_s
        methods = sorted({method for method, _ in seen})
        comm = {method: seen.get((method, "comm"), 0.0) for method in methods}
        exposed = {method: seen.get((method, "exposed"), 0.0) for method in methods}
        stages.append({method: {"comm_s": comm[method], "exposed_s": exposed[method],
                                "hidden_s": comm[method] - exposed[method]}
                       for method in methods})
    return {"tp_overlap_per_stage": stages}


def fsdp_section(run) -> dict:
    """Under sharded data parallelism, per stage and unit: all-gather and reduction seconds
    and the share the compute waited for (training/data_parallel/fsdp.py); absent otherwise."""
    p = run.inputs.sc.parallel
    if p.fsdp is None:
        return {}
    stages = [run.states[rank].fsdp.unit_report() for rank in stage_ranks(run)]
    comm = sum(u["all_gather_s"] + u["reduce_s"] for s in stages for u in s.values())
    exposed = sum(u["all_gather_exposed_s"] + u["reduce_exposed_s"]
                  for s in stages for u in s.values())
    return {"fsdp": {"strategy": p.fsdp, "units_per_stage": stages, "comm_s": comm,
                     "exposed_s": exposed, "exposed_fraction": exposed / comm if comm else 0.0}}
