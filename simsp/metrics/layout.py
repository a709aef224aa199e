"""The run's parallel layout and model shape in a few numbers, and for a Llama-class model its
architecture, FLOPs formula and one layer's kept tensors."""

from simsp import analytic
from simsp.hardware.profiles import gpu_profile
from simsp.metrics.flops import sparse_or_latent
from simsp.model.architecture import architecture
from simsp.scenario.config import Cluster
from simsp.scenario.pipeline_split import virtual_stage_layer_counts


def architecture_section(sc) -> dict:
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
