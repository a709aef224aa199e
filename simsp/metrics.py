"""Metrics of one simulated iteration: pure functions of its trace, ledgers and step records.

MFU and HFU are computed as K22 §6.3 does (docs/MODEL.md#flops): the closed-form model and hardware
FLOPs with B = global batch over (iteration time · GPUs · 312 TFLOP/s); the FLOPs the simulated
GEMMs actually counted are reported beside them.
"""


from simsp import analytic
from simsp.engine.allocator.ledger_stream import replay_ledger
from simsp.memory_verdict import chosen_reserve, memory_verdict
from simsp.model.architecture import architecture
from simsp.model.flops import megatron_flops, recomputed_flops
from simsp.model.param_counts import parameter_counts
from simsp.hardware.costmodel import calibration_table
from simsp.scenario.config import Cluster
from simsp.scenario.pipeline_split import virtual_stage_layer_counts
from simsp.hardware.constants import GPUS, LinkCalibration, cluster_compute
from simsp.hardware.profiles import gpu_profile
from simsp.training.non_tensor_memory import non_tensor_items


def iteration_time(run) -> float:
    """From the first op to the last rank's optimizer step."""
    return max(run.results.end_s.values())


def stage_ranks(run) -> list[int]:
    """One simulated rank per pipeline stage (tp = 0, dp = 0), in stage order."""
    return [run.inputs.rank_of(0, 0, pp) for pp in range(run.inputs.sc.parallel.pp)]


def bubble(run) -> tuple[float, list[float]]:
    """The pipeline bubble as a fraction in [0, 1], defined once from pipeline wait (exposure's
    pp_wait: blocked on a peer stage in fill and drain, plus the idle tail): per stage pp_wait
    over pp_wait plus the stage's schedule work (its steps, from input ready to end), the share
    of its pipeline time the stage sits idle; the pipeline's is all stages' wait over all their
    wait and work. Uniform stages give GPipe's (p−1)/(m+p−1) (Huang et al., arXiv:1811.06965
    §2.2), N21 §2.2.1's ratio t_pb/t_id = (p−1)/m turned into a share (that ratio exceeds 1
    when m < p − 1 or a stage works little, e.g. a last stage of one layer); docs/schedules.md.
    0 at p = 1, where none waits."""
    waits, works = [], []
    for rank, row in zip(stage_ranks(run), exposure(run)):
        waits.append(row["pp_wait"])
        works.append(sum(end - begin for *_, begin, end in run.results.steps.get(rank, [])))
    per_stage = [_share(wait, work) for wait, work in zip(waits, works)]
    return _share(sum(waits), sum(works)), per_stage


def _share(wait: float, work: float) -> float:
    """wait / (wait + work), 0 without work."""
    return wait / (wait + work) if work else 0.0


def _counted_flops(run) -> tuple[float, float]:
    """GEMM FLOPs the simulation counted, over all ranks: (model, model + recompute)."""
    ranks = run.inputs.world.ranks
    represented = run.inputs.sc.parallel.world_size / len(ranks)  # each stands for this many
    model = hardware = 0.0
    for r in ranks.values():
        model += (r.flops["forward"] + r.flops["backward"]) * represented
        hardware += (r.flops["forward"] + r.flops["backward"] + r.flops["recompute"]) * represented
    return model, hardware


def oom_report(oom) -> dict | None:
    """An out-of-memory verdict as JSON: who asked for what, and the largest live tensors."""
    if oom is None:
        return None
    return {"rank": oom.rank, "op": oom.op, "tensor": oom.key, "time_s": oom.time_s,
            "bytes_asked": oom.bytes_asked, "bytes_in_use": oom.bytes_in_use,
            "capacity_bytes": oom.capacity_bytes,
            "largest_live": [{"name": t.key, "category": t.category, "bytes": t.nbytes}
                             for t in oom.largest_live]}


def ledger_of(run, rank: int):
    """The ledger of `rank`, or of the simulated rank identical to it when it was not simulated."""
    inputs, ranks = run.inputs, run.inputs.world.ranks
    if rank in ranks:
        return ranks[rank].ledger
    coords = inputs.world.grid.coords(rank)
    source = inputs.rank_of(0, 0, coords.pp, coords.cp)  # an identical representative
    if inputs.sc.model.num_experts is not None:
        from simsp.model.blocks.moe.placement import represented_by  # MoE only
        if represented_by(inputs.sc, rank) in ranks:
            source = represented_by(inputs.sc, rank)  # its place in a simulated expert group
    return ranks[source].ledger


def rank_memory(run, rank: int, name_live: bool = True) -> dict:
    """One rank's memory: peak, peaks by category, composition at the peak, OOM verdict
    (`name_live=False`: the verdict's largest live tensors left out, its bytes the same)."""
    inputs = run.inputs
    c = inputs.world.grid.coords(rank)
    simulated = rank in inputs.world.ranks
    ledger = ledger_of(run, rank)
    summary = ledger.summary(name_live)
    peaks = summary.peak_by_category
    return {"rank": rank, "tp": c.tp, "pp": c.pp, "dp": c.dp,
            "peak_bytes": summary.peak_total,
            "activation_peak_bytes": peaks["activations"],
            "weights_bytes": peaks["weights"], "gradients_bytes": peaks["gradients"],
            "optimizer_bytes": peaks["optimizer"],
            "oom": summary.oom is not None, "oom_detail": oom_report(summary.oom),
            "simulated": simulated,
            "at_peak_bytes": summary.at_peak, "peak_by_category_bytes": peaks,
            "final_bytes": ledger.final_bytes(),
            **({"cp": c.cp} if inputs.sc.parallel.cp > 1 else {})}


def memory_report(run, metrics: dict, override_bytes: float | None,
                  allocator: bool = False) -> dict:
    """The memory verdict of the layout (simsp/memory_verdict.py, as search, sweep and whatif
    give it), judged with `override_bytes` (--memory-reserve) or else the itemised non-tensor
    memory (`non_tensor`, each item's bytes and source: docs/non_tensor_memory.md) and, with
    `allocator` (run --caching-allocator), per stage's rank its ledger replayed through
    PyTorch's caching allocator: reserved and allocated peaks and the fragmentation at the
    allocated peak (docs/allocator.md), the largest of which is then the fragmentation item."""
    capacity = GPUS[run.inputs.sc.cluster.gpu].memory_bytes
    peak = max(r["peak_bytes"] for r in metrics["ranks"])
    stages = [_allocator_stage(run, stage, rank)
              for stage, rank in enumerate(stage_ranks(run))] if allocator else []
    modelled = max((s["fragmentation_at_peak_bytes"] for s in stages), default=None)
    items = non_tensor_items(run.inputs.sc, modelled)
    reserve = chosen_reserve(override_bytes, sum(item.bytes for item in items))
    verdict = memory_verdict(capacity, peak, metrics["oom"], reserve)
    for stage in stages:
        stage["headroom_bytes"] = capacity - reserve - stage["peak_bytes"]
    return {"capacity_bytes": capacity, "memory_reserve_bytes": reserve,
            "peak_bytes_max": peak, "headroom_bytes": verdict.headroom_bytes,
            "fits": verdict.fits,
            "non_tensor": {item.name: {"bytes": item.bytes, "source": item.source}
                           for item in items},
            "stages": stages}


def _allocator_stage(run, stage: int, rank: int) -> dict:
    """One stage's rank through the caching allocator (its headroom: memory_report)."""
    ledger = ledger_of(run, rank)
    timeline = replay_ledger(ledger).timeline
    peak = ledger.summary().peak_total
    oom = timeline.oom
    return {"stage": stage, "rank": rank, "capacity_bytes": ledger.capacity_bytes,
            "peak_bytes": peak, "allocated_peak_bytes": timeline.allocated_peak,
            "reserved_peak_bytes": timeline.reserved_peak,
            "fragmentation_at_peak_bytes": timeline.fragmentation_at_peak,
            "headroom_bytes": None,
            "allocator_oom": None if oom is None else {
                "bytes_asked": oom.nbytes, "reserved_bytes": oom.reserved,
                "allocated_bytes": oom.allocated}}


COMM_KEYS = ("tp_comm", "pp_transfer", "dp_comm", "cp_comm")  # communication proper
EXPOSURE_KEYS = ("compute", "tp_comm", "pp_transfer", "pp_wait", "dp_comm", "optimizer")
CP_KEYS = ("cp_comm",)  # context parallelism's ring exchanges (only where cp > 1)
# only where the run has them: MoE dispatch and combine (docs/moe.md), FP8 delayed scaling's amax
# all-reduces (training/fp8_amax.py)
OPTIONAL_KEYS = ("ep_comm", "fp8_amax")


def exposure(run) -> list[dict]:
    """Per stage, the iteration time split by what its program was doing (sums to it).

    compute: kernels (optimizer excluded); tp_comm, pp_transfer, dp_comm: blocked on that
    communication while data moved; pp_wait: blocked on a peer that had not arrived (pipeline
    fill, bubble, drain), plus the idle tail after the stage's own end; optimizer: Adam step;
    cp_comm (cp > 1 only): blocked on ring attention's K/V and dK/dV exchanges."""
    t_iter, p = iteration_time(run), run.inputs.sc.parallel
    keys = EXPOSURE_KEYS + (CP_KEYS if p.cp > 1 else ()) + \
        (("offload",) if p.cpu_offloading else ())  # training/pipeline/offload.py
    rows = []
    for rank in stage_ranks(run):
        r = run.inputs.world.ranks[rank]
        blocked = r.exposed_s
        row = {key: blocked.get(key, 0.0) for key in keys}
        row["compute"] = sum(r.busy_s.values()) - row["optimizer"]
        row["pp_wait"] += t_iter - run.results.end_s[rank]
        for key in OPTIONAL_KEYS:  # where the run has them
            if key in blocked:
                row[key] = blocked[key]
        rows.append(row)
    return rows


def collect(run, shortcuts, name_live: bool = True) -> dict:
    """Every metric of `simsp run`, JSON-ready (keys of issue #5 first); `name_live=False`
    leaves the tensors live at an out-of-memory verdict unnamed (a sweep row's cost)."""
    sc = run.inputs.sc
    m, p = sc.model, sc.parallel
    t_iter = iteration_time(run)
    gpus, peak = p.world_size, GPUS[sc.cluster.gpu].peak_flops
    bubble_all, bubble_stages = bubble(run)
    counted_model, counted_hw = _counted_flops(run)
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
        "shortcuts_used": shortcuts.why(),
        **_architecture(sc),
        **_fsdp(run),
        **_overlaps(run),
        **_offload(run),
        **_moe(run),
        **_in_network(run),
    }


def _in_network(run) -> dict:
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


def _moe(run) -> dict:
    """The MoE layers' load (training/moe_load.py, imported only for a model with experts)."""
    if run.inputs.sc.model.num_experts is None:
        return {}
    from simsp.training.moe_load import moe_metrics
    return moe_metrics(run.inputs)


def _offload(run) -> dict:
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


def _overlaps(run) -> dict:
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


def _fsdp(run) -> dict:
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


def sparse_or_latent(m) -> bool:
    """Whether the model has MoE layers, multi-latent attention or multi-token prediction
    (docs/moe.md, docs/mla.md, docs/mtp.md): its FLOPs are Megatron's count and its reports give
    total and active parameters."""
    return m.num_experts is not None or m.multi_latent_attention or bool(m.mtp_num_layers)


def model_flops(sc) -> float:
    """Model FLOPs of one iteration: K22's or Megatron's dense formula (analytic.py), or for
    MoE/MLA models Megatron's count with top-k routed and shared experts and MLA
    (model/flops.py)."""
    m, p = sc.model, sc.parallel
    if sparse_or_latent(m):
        return megatron_flops(m, p.global_batch, sc.padded_vocab_size)
    return analytic.iteration_model_flops(m, p)


def hardware_flops(sc) -> float:
    """Model FLOPs plus what recompute and FlashAttention's backward compute again."""
    m, p = sc.model, sc.parallel
    if sparse_or_latent(m):
        return model_flops(sc) + recomputed_flops(m, p.global_batch, p.recompute_module_set,
                                                  analytic.recomputed_layers(m, p))
    return analytic.iteration_hardware_flops(m, p)


def _architecture(sc) -> dict:
    """The Llama-class variant and the FLOPs formula used (absent for K22's GPT layer, whose
    metrics stay as they were); MoE and MLA models name Megatron's FLOPs count."""
    name = architecture(sc.model)
    if name == "GPT":
        return {}
    extra = {}
    if sparse_or_latent(sc.model):
        extra = {"flops_formula": "Megatron-LM num_floating_point_operations (training.py): "
                                  "top-k routed and shared experts, MLA"
                                  + (", MTP" if sc.model.mtp_num_layers else "")}
    return {"architecture": name, "flops_formula": analytic.flops_formula(sc.model),
            "layer_tensors": layer_tensors(sc), **extra}


def check_side_runs(sc) -> None:
    """Build, and so check, the scenario collect simulates beside the run (layer_tensors' one
    layer on one TP group): a refusal there comes before the run, not after it."""
    if architecture(sc.model) != "GPT":
        from simsp.scenario.loading import with_overrides
        from simsp.training.driver.layer_sim import one_tp_group
        one_tp_group(with_overrides(sc, run={"mode": "meta"}))


def layer_tensors(sc) -> dict:
    """One layer's kept tensors on rank 0 of a TP group, measured by `simsp layer`'s meta
    simulation, beside docs/llama.md's closed form (the new tensors, by name)."""
    from simsp.scenario.loading import with_overrides
    from simsp.training.driver.layer_sim import simulate_layer
    record = simulate_layer(with_overrides(sc, run={"mode": "meta"})).records[0]
    p = sc.parallel
    formula = analytic.cp_layer_activation_bytes(sc.model, p, p.recompute_granularity,
                                                 p.recompute_module_set)
    return {"saved": [{"name": n, "bytes": b} for n, b in record.saved],
            "measured_bytes": record.activation_bytes, "formula_bytes": formula}


def layout(sc) -> dict:
    """The parallel layout and model shape in a few numbers (metrics' `layout`)."""
    p, m = sc.parallel, sc.model
    return {"t": p.tp, "p": p.pp, "d": p.dp, "sequence_parallel": p.sequence_parallel,
            "recompute": p.recompute_granularity, "schedule": p.schedule_name,
            "micro_batch": p.micro_batch_size, "global_batch": p.global_batch,
            "micro_batches": p.num_micro_batches, "layers": m.num_layers,
            "hidden": m.hidden_size, "heads": m.num_attention_heads, "seq": m.seq_length,
            "vocab": m.vocab_size, "padded_vocab": sc.padded_vocab_size,
            "gpus": p.world_size, "nodes": sc.cluster.nodes,
            "distributed_optimizer": p.distributed_optimizer, **_recompute_layout(p),
            **_hardware_layout(sc), **_context_layout(p), **_llama_layout(sc)}


def _llama_layout(sc) -> dict:
    """The selective recompute modules when given (`recompute_modules`) and the layers of each
    pipeline stage of an uneven Megatron split (`stage_layers`; docs/llama.md); absent
    otherwise, so K22's reports stay as they were."""
    m, p = sc.model, sc.parallel
    extra = {}
    if p.recompute_granularity == "selective" and p.recompute_modules is not None:
        extra["recompute_modules"] = " ".join(p.recompute_modules.split())
    if p.uneven_pipeline:
        counts = virtual_stage_layer_counts(m, p)  # virtual stage k = chunk·p + stage
        extra["stage_layers"] = [sum(counts[k::p.pp]) for k in range(p.pp)]
    if p.pipeline_model_parallel_layout is not None:  # as given (docs/pipeline-layout.md)
        extra["pipeline_layout"] = p.pipeline_model_parallel_layout
    return extra


def _context_layout(p) -> dict:
    """cp and its comm type (docs/context-parallel.md), present only with cp > 1; a2a+p2p adds
    Megatron's hierarchical_context_parallel_sizes ("A P": a2a, p2p; the field's words)."""
    if p.cp == 1:
        return {}
    sizes = {"hierarchical_context_parallel_sizes": p.hierarchical_context_parallel_sizes} \
        if p.cp_comm_type == "a2a+p2p" else {}
    return {"cp": p.cp, "cp_comm_type": p.cp_comm_type, **sizes}


def _hardware_layout(sc) -> dict:
    """The GPU, system and FP8 settings (docs/hardware.md), present only when they differ from
    the default A100 in BF16 (whose reports stay as they were)."""
    p, c = sc.parallel, sc.cluster
    if c.gpu == Cluster().gpu and c.system is None and p.fp8_format is None:
        return {}
    fp8 = f"{p.fp8_format} ({p.fp8_recipe}{', FP8 parameters' if p.fp8_param_gather else ''})"
    return {"gpu": gpu_profile(c.gpu).name, "system": c.system,
            "fp8": fp8 if p.fp8_format else None}


def _recompute_layout(p) -> dict:
    """Full recompute's method and group size as run (Megatron's defaults: uniform, 1)."""
    full = p.recompute_granularity == "full"
    return {"recompute_method": (p.recompute_method or "uniform") if full else None,
            "recompute_num_layers": (p.recompute_num_layers or 1) if full else None}
