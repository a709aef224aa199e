"""Lower bounds for `simsp search`, each proven for every schedule, recompute method and gradient
dtype, so a layout they rule out provably loses (docs/exploration.md gives the proofs):

- time: stage p − 1 cannot start before micro-batch 0 has crossed the p − 1 model chunks ahead
  of it, runs m·v chunk forwards and backwards one after another on its compute stream, and its
  last backward still has p − 1 chunk backwards downstream: T ≥ (m·v + p − 1)·(C_f + C_b)
  (N21 §2.2 with v model chunks per stage). C_f + C_b is one model chunk's layers simulated
  alone on their TP group (simsp.model.layer_sim, timed as the iteration times collectives):
  block recompute rebuilds only the first N layers of a chunk, so a chunk costs
  N·(f + b)_full + (L_c − N)·(f + b)_none (Megatron transformer_block.py).
- memory: stage 0 allocates its weights, gradients and optimizer state before its first step
  and holds them to the end, and at the schedule's busiest moment it keeps the activations of
  every (micro-batch, chunk) whose forward is done and backward not (simsp.training.schedules
  max_in_flight, exact for the schedule simsp runs). Each held chunk keeps at least its layers'
  saved tensors, measured from the ledger of the layer simulated alone.
"""

import math
from dataclasses import dataclass
from functools import lru_cache

from simsp.analytic import chunk_recompute_bytes, chunks_per_stage
from simsp.config import Parallel, Scenario, load_scenario, with_overrides
from simsp.engine.communicator import CLOSED_FORM, STEPWISE
from simsp.hardware import GPUS
from simsp.model.layer_sim import simulate_layer
from simsp.model.tensor import FP16, FP32
from simsp.training.schedules import build_schedule, max_in_flight

OPTIMIZER_BYTES = 12  # fp32 master weight, Adam m and v per parameter (training/optimizer.py)


@dataclass(frozen=True)
class LayerCost:
    """One layer on one TP rank, simulated alone: seconds, kept activations, weight elements."""

    seconds: float  # forward + backward (with the recompute it was simulated with)
    kept_bytes: int  # activations saved for backward, the fewest over the TP ranks
    weight_elements: int  # this rank's parameters of the layer, the fewest over the TP ranks


@lru_cache(maxsize=4096)
def _simulated_layer(sc: Scenario) -> LayerCost:
    """Memoised: one layer of `sc` (already reduced to one TP group) simulated alone."""
    timing = CLOSED_FORM if sc.run.mode == "meta" else STEPWISE  # as simulate_metrics times
    result = simulate_layer(sc, timing=timing)
    kept = min(rec.activation_bytes for rec in result.records)
    weights = min(r.ledger.live_bytes("weights") for r in result.ranks) // FP16
    return LayerCost(result.forward_time_s + result.backward_time_s, kept, weights)


def layer_cost(sc: Scenario, granularity: str) -> LayerCost:
    """One layer of this layout (t, SP, b, model) under `granularity`; the pipeline, data
    parallelism and runtime switches do not change a layer alone, so they are reset (shared memo)."""
    defaults = Parallel()
    reduced = with_overrides(sc, parallel={
        "pipeline_model_parallel_size": 1, "data_parallel_size": 1, "global_batch_size": None,
        "schedule": None, "num_layers_per_virtual_pipeline_stage": None,
        "distributed_optimizer": False, "recompute_granularity": granularity,
        "recompute_method": None, "recompute_num_layers": None,
        **{key: getattr(defaults, key) for key in (
            "overlap_p2p_communication", "scatter_gather_tensors_in_pipeline",
            "overlap_grad_reduce", "overlap_param_gather", "ddp_bucket_size",
            "accumulate_allreduce_grads_in_fp32")}},
        cluster={"nodes": math.ceil(sc.parallel.tp / sc.cluster.gpus_per_node)},
        run={"name": "layer"})
    return _simulated_layer(reduced)


def layers_per_chunk(sc: Scenario) -> int:
    """L_c: layers of one model chunk (L / p, or L / (p·v) interleaved)."""
    return sc.model.num_layers // sc.parallel.pp // chunks_per_stage(sc.model, sc.parallel)


def _chunk_recomputed_layers(sc: Scenario) -> int:
    """Layers of a chunk whose forward full recompute re-runs: all (uniform), or the first N
    (block); none under no or selective recompute (there the granularity's own cost holds)."""
    p, layers = sc.parallel, layers_per_chunk(sc)
    if p.recompute_granularity == "full" and p.recompute_method == "block":
        return min(p.recompute_num_layers or 1, layers)
    return layers


def chunk_seconds(sc: Scenario) -> float:
    """C_f + C_b: one model chunk's forward and backward, from its layers alone."""
    layers, rebuilt = layers_per_chunk(sc), _chunk_recomputed_layers(sc)
    own = layer_cost(sc, sc.parallel.recompute_granularity).seconds
    if rebuilt == layers:
        return layers * own
    return rebuilt * own + (layers - rebuilt) * layer_cost(sc, "none").seconds


def even_stages(sc: Scenario) -> bool:
    """Every stage holds L/p layers (the bounds' premise); uneven Megatron splits
    (--decoder-first-pipeline-num-layers, ...) get no bound beyond what always holds."""
    return not getattr(sc.parallel, "uneven_pipeline", False)


def time_lower_bound(sc: Scenario) -> float:
    """T ≥ (m·v + p − 1)·(C_f + C_b) (module docstring); 0 for uneven stages."""
    if not even_stages(sc):
        return 0.0
    p = sc.parallel
    chunks = chunks_per_stage(sc.model, p)
    return (p.num_micro_batches * chunks + p.pp - 1) * chunk_seconds(sc)


@lru_cache(maxsize=1024)
def stage0_in_flight(schedule: str, p: int, m: int, v: int) -> int:
    """Peak (micro-batch, chunk) pairs stage 0 holds between forward and backward."""
    return max_in_flight(build_schedule(schedule, p, m, v))[0]


def chunk_kept_bytes(sc: Scenario) -> int:
    """Bytes one model chunk keeps per micro-batch (Megatron's uniform or block methods)."""
    p = sc.parallel
    own = layer_cost(sc, p.recompute_granularity).kept_bytes
    plain = layer_cost(sc, "none").kept_bytes if p.recompute_granularity == "full" else own
    return chunk_recompute_bytes(p, layers_per_chunk(sc), own, plain)[0]


def static_bytes(sc: Scenario) -> float:
    """Weights, gradients and optimizer state one stage-0 rank holds at least: its layers'
    measured parameters and its word-embedding shard; 2-byte weights, 4-byte main gradients
    (2 counted when gradients are reduced in 16 bits), 12 optimizer bytes (1/d of them with the
    distributed optimizer)."""
    p = sc.parallel
    layers = sc.model.num_layers // p.pp
    elements = layers * layer_cost(sc, "none").weight_elements
    elements += sc.padded_vocab_size * sc.model.hidden_size // p.tp
    gradient = FP32 if p.accumulate_allreduce_grads_in_fp32 else FP16
    shard = p.dp if p.distributed_optimizer else 1
    return elements * (FP16 + gradient + OPTIMIZER_BYTES / shard)


def memory_lower_bound(sc: Scenario) -> float:
    """Stage 0's peak is at least its static bytes plus its busiest moment's kept chunks;
    0 for uneven stages."""
    if not even_stages(sc):
        return 0.0
    p = sc.parallel
    chunks = chunks_per_stage(sc.model, p)
    held = stage0_in_flight(p.schedule_name, p.pp, p.num_micro_batches, chunks)
    return static_bytes(sc) + held * chunk_kept_bytes(sc)


def memory_verdict(sc: Scenario, reserve_bytes: float = 0.0) -> str | None:
    """Why the layout provably does not fit in capacity − reserve, or None."""
    usable = GPUS[sc.cluster.gpu].memory_bytes - reserve_bytes
    bound = memory_lower_bound(sc)
    if bound > usable:
        return f"stage 0 needs at least {bound / 2**30:.1f} GiB of {usable / 2**30:.1f} GiB usable"
    return None


def scenario_of(config) -> Scenario:
    """The validated scenario of a Config."""
    return load_scenario(None, config.overrides())
