"""Lower bounds for `simsp search`, each proven for every schedule, recompute method and gradient
dtype, so a layout they rule out provably loses (docs/exploration.md gives the proofs):

- time: stage p − 1 cannot start before micro-batch 0 has crossed the p − 1 model chunks ahead
  of it, runs m·v chunk forwards and backwards one after another on its compute stream, and its
  last backward still has p − 1 chunk backwards downstream: T ≥ (m·v + p − 1)·(C_f + C_b)
  (N21 §2.2 with v model chunks per stage). C_f + C_b is one model chunk's layers simulated
  alone on their TP group (simsp.training.driver.layer_sim, timed as the iteration times collectives):
  block recompute rebuilds only the first N layers of a chunk, so a chunk costs
  N·(f + b)_full + (L_c − N)·(f + b)_none (Megatron transformer_block.py).
- memory: stage 0 allocates its weights, gradients and optimizer state (bytes per parameter as
  simsp's allocators give them) before its first step and holds them to the end, and at the
  schedule's busiest moment it keeps the activations of
  every (micro-batch, chunk) whose forward is done and backward not (simsp.training.pipeline.schedules
  max_in_flight, exact for the schedule simsp runs). Each held chunk keeps at least its layers'
  saved tensors, measured from the ledger of the layer simulated alone. Under FSDP the static
  bytes are what the strategy keeps for the whole iteration, each sharded part at no more than
  its 1/d share (a unit's padding only adds); gathered copies and unsharded gradients are
  transient and left out (docs/fsdp.md). FSDP's gathers and reductions add time, never remove
  compute: the time bound holds as it is.
- context parallelism (cp > 1): a layer is simulated alone at s/cp tokens without CP. Its saved
  tensors are exactly the CP layer's but for the K/V block the ring keeps for backward, so its
  kept bytes are a lower bound; its time is too, since the CP layer runs the same kernels on
  the same s/cp rows and its ring's diagonal step (the forward's first, the backward's last) is
  the same (s/cp × s/cp) FlashAttention block,
  the other cp − 1 steps and any wait for a K/V block only adding time; a2a and a2a+p2p
  run (A·s/cp, d, A·s/cp) blocks on a/(t·A) heads (A = cp for a2a), whose time is at least
  the (s/cp)² block's on a/t heads (docs/context-parallel.md's argument).
  Stage 0's optimizer state is sharded over d·cp.
"""

import math
from dataclasses import dataclass
from functools import lru_cache

from simsp.analytic import chunk_recompute_bytes, chunks_per_stage
from simsp.scenario.config import Parallel, Scenario
from simsp.scenario.loading import load_scenario, with_overrides
from simsp.engine.group_timing import RING_ALONE, STEP_BY_STEP
from simsp.hardware.constants import GPUS
from simsp.training.driver.layer_sim import PREFIX, simulate_layer
from simsp.model.params import param_shapes
from simsp.model.sharding import local_shape
from simsp.model.tensor import FP16, Tensor
from simsp.training.data_parallel.optimizer import allocate_optimizer
from simsp.training.data_parallel.fsdp_units import fsdp_bytes_per_element, sharding_of
from simsp.training.pipeline.schedules import build_schedule, max_in_flight


@dataclass(frozen=True)
class LayerCost:
    """One layer on one TP rank, simulated alone: seconds, kept activations, and its parameters
    with the bytes simsp's own allocators give them (so a dtype the config changes is followed)."""

    seconds: float  # forward + backward (with the recompute it was simulated with)
    kept_bytes: int  # activations saved for backward, the fewest over the TP ranks
    weight_elements: int  # this rank's parameters of the layer
    static_bytes_per_element: tuple  # (weights, gradients, optimizer unsharded) bytes


def _optimizer_bytes_per_element(rank, elements: int) -> float:
    """Bytes simsp's optimizer allocates per parameter (training/data_parallel/optimizer.py), probed on a
    scratch parameter of the layer's size in the simulated rank's ledger; 0 (still a lower
    bound) if the allocator cannot be probed so."""
    probe = Tensor.meta((elements,), FP16, None)
    before = rank.ledger.live_bytes("optimizer")
    try:
        allocate_optimizer(rank, {"probe": probe}, 1)
    except (TypeError, AttributeError, KeyError):
        return 0.0
    return (rank.ledger.live_bytes("optimizer") - before) / elements


def _layer_elements(sc: Scenario, t: int) -> int:
    """One layer's parameters on one TP rank, from the model's shapes and their TP split."""
    shapes = param_shapes(sc.padded_model)
    return sum(math.prod(local_shape(name, shape, t)) for name, shape in shapes.items()
               if name.startswith(PREFIX))


@lru_cache(maxsize=4096)
def _simulated_layer(sc: Scenario) -> LayerCost:
    """Memoised: one layer of `sc` (already reduced to one TP group) simulated alone."""
    method = RING_ALONE if sc.run.mode == "meta" else STEP_BY_STEP  # as simulate_metrics times
    result = simulate_layer(sc, method=method)
    kept = min(rec.activation_bytes for rec in result.records)
    elements = _layer_elements(sc, sc.parallel.tp)
    rank = result.ranks[0]
    per_element = (rank.ledger.live_bytes("weights") / elements,
                   rank.ledger.live_bytes("gradients") / elements,
                   _optimizer_bytes_per_element(rank, elements))
    return LayerCost(result.forward_time_s + result.backward_time_s, kept, elements, per_element)


def layer_cost(sc: Scenario, granularity: str) -> LayerCost:
    """One layer of this layout (t, SP, b, model) under `granularity`; the pipeline, data
    parallelism and runtime switches do not change a layer alone, so they are reset (shared memo)."""
    defaults = Parallel()
    reduced = with_overrides(sc, model={"seq_length": sc.model.seq_length // sc.parallel.cp},
                             parallel={
        "context_parallel_size": 1, "cp_comm_type": defaults.cp_comm_type,
        "hierarchical_context_parallel_sizes": None,
        "pipeline_model_parallel_size": 1, "data_parallel_size": 1, "global_batch_size": None,
        "expert_model_parallel_size": 1, "expert_tensor_parallel_size": None,  # one TP group
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
    parameters and its word-embedding shard, at the bytes per parameter simsp's allocators gave
    the layer alone (the optimizer's over d·cp with the distributed optimizer); the embedding's
    shard at no more than 4 bytes per parameter (16-bit weights and gradients: a lower bound)."""
    p = sc.parallel
    cost = layer_cost(sc, "none")
    weight, gradient, optimizer = cost.static_bytes_per_element
    shard = p.dp * p.cp if p.distributed_optimizer else 1  # Megatron's dp_cp group
    per_element = weight + gradient + optimizer / shard
    if p.fsdp is not None:  # what the strategy keeps for the whole iteration (docs/fsdp.md)
        per_element = fsdp_bytes_per_element(sharding_of(sc), p.dp * p.cp)
    layers = sc.model.num_layers // p.pp * cost.weight_elements * per_element
    embedding = sc.padded_vocab_size * sc.model.hidden_size // p.tp
    return layers + embedding * min(per_element, FP16 + FP16)


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
