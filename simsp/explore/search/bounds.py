"""Lower bounds for `simsp search`, each proven for every schedule, recompute method and gradient
dtype, so a layout they rule out provably loses (docs/exploration.md gives the proofs):

- time: stage p − 1 cannot start before micro-batch 0 has crossed the p − 1 model chunks ahead
  of it, runs m·v chunk forwards and backwards one after another on its compute stream, and its
  last backward still has p − 1 chunk backwards downstream: T ≥ (m·v + p − 1)·(C_f + C_b)
  (N21 §2.2 with v model chunks per stage). C_f + C_b is one model chunk's layers simulated
  alone on their TP group (simsp.training.driver.layer_sim, timed as the iteration times collectives):
  block recompute rebuilds only the first N layers of a chunk, so a chunk costs
  N·(f + b)_full + (L_c − N)·(f + b)_none (Megatron transformer_block.py).
- time, split-backward schedules (zb-h1, zb-h2, zbv, dualpipev, dualpipe; their W steps fill
  what 1F1B idles, so the bound above is not theirs): each layer simulated alone with its
  backward split (B, then W running the deferred weight-gradient GEMMs) gives a chunk's F, B,
  W; T is at least the iteration time of the schedule's own step (or op) lists with each step
  taking that time and no communication, since the run executes the same steps in the same
  order and every end in such a list schedule is a max of sums of durations, none decreasing
  when a duration grows. At F = B = W it is ZB §2's and DeepSeek-V3 Table 2's closed forms.
  Where DualPipe's or DualPipeV's F&B pairs overlap (TP or EP collectives to hand over at) a
  pair takes the compute kernels' seconds of its F, B and W alone, which run one at a time on
  the rank's compute stream, its collectives free to hide (pair_bound.py).
- memory: stage 0 allocates its weights, gradients and optimizer state (bytes per parameter as
  simsp's allocators give them) before its first step and holds them to the end, and at the
  schedule's busiest moment it keeps the activations of
  every (micro-batch, chunk) whose forward is done and backward not (simsp.training.pipeline.schedules
  max_in_flight, exact for the schedule simsp runs; where DualPipe's or DualPipeV's F&B pairs
  overlap (TP or EP collectives to hand over at) a pair is counted backward first, as the run
  may free its backward's chunk before its forward keeps one). Each held chunk keeps at least its layers'
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
- experts: a MoE layer is simulated alone on one expert grid (t ranks by ETP·EP/gcd(t, ETP·EP)
  replicas, the smallest d Megatron allows), its tokens crossing the layout's own EP group with
  its dispatcher, each rank computing and keeping its own E/EP experts' rows: the layout's layer,
  less the gradient reduction and pipeline that only add. Expert parameters are E/EP experts of
  f/ETP on a rank, their optimizer state sharded over t·cp·d/(ETP·EP) (Megatron's expert data
  parallel group); a model with dense and MoE layers charges every layer the smaller kind. With
  imbalanced routing and 1 < EP < E another layer's busiest rank may hold cooler experts than
  layer 0's: no bound there (alike_layers). docs/exploration.md "Experts".
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
from simsp.explore.search.pair_bound import PER_LAYER_GRAPHS, overlapped_pairs_time
from simsp.scenario.cuda_graphs import graph_impl
from simsp.model.blocks.moe.placement import is_expert_param
from simsp.model.params import param_shapes
from simsp.model.sharding import local_shape
from simsp.model.tensor import FP16, Tensor
from simsp.training.data_parallel.optimizer import allocate_optimizer
from simsp.training.data_parallel.fsdp_units import fsdp_bytes_per_element, sharding_of
from simsp.training.pipeline.dualpipe import dualpipe, dualpipev, op_steps
from simsp.training.pipeline.op_timing import Durations, simulate_ops
from simsp.training.pipeline.schedules import (SPLIT_BACKWARD, build_schedule, max_in_flight,
                                               placement_of, simulate_uniform)


@dataclass(frozen=True)
class LayerCost:
    """One layer on one rank, simulated alone: seconds, kept activations, and its parameters
    with the bytes simsp's own allocators give them (so a dtype the config changes is followed)."""

    seconds: float  # forward + backward (with the recompute it was simulated with)
    kept_bytes: int  # activations saved for backward, the fewest over the ranks simulated
    dense_elements: int  # this rank's parameters of the layer outside the experts
    expert_elements: int  # this rank's expert parameters (E/EP experts, f/ETP each)
    static_bytes_per_element: tuple  # (weights, gradients, optimizer unsharded) bytes
    steps: tuple = ()  # (F, B, W) seconds with the backward split (B then W); () if not split
    compute: tuple = ()  # (F, B, W) of compute kernels alone (full rate); () if not split

    def static_bytes(self, layers: int, dense_shard: int, expert_shard: int) -> float:
        """Weights, gradients and optimizer state of `layers` such layers on a rank, the
        optimizer's sharded over `dense_shard` (dp·cp) and `expert_shard` (the expert data
        parallel size)."""
        weight, gradient, optimizer = self.static_bytes_per_element
        return (layers * self.dense_elements * (weight + gradient + optimizer / dense_shard)
                + layers * self.expert_elements * (weight + gradient + optimizer / expert_shard))


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


def _layer_elements(sc: Scenario) -> tuple[int, int]:
    """(dense, expert) parameters of one layer on one rank, from the model's shapes: dense ones
    split over t, expert ones E/EP experts with f split over ETP (model/blocks/moe/placement.py)."""
    p, dense, expert = sc.parallel, 0, 0
    for name, shape in param_shapes(sc.padded_model).items():
        if not name.startswith(PREFIX):
            continue
        if is_expert_param(name):
            expert += math.prod(shape) // (p.ep * p.etp)
        else:
            dense += math.prod(local_shape(name, shape, p.tp))
    return dense, expert


@lru_cache(maxsize=4096)
def _simulated_layer(sc: Scenario, split: bool = False) -> LayerCost:
    """Memoised: one layer of `sc` (already reduced to one expert grid) simulated alone; with
    `split` its backward as B then W, as the zero-bubble schedules run it (layer_sim)."""
    method = RING_ALONE if sc.run.mode == "meta" else STEP_BY_STEP  # as simulate_metrics times
    result = simulate_layer(sc, method=method, keep_experts=True, split_backward=split)
    kept = min(rec.activation_bytes for rec in result.records)
    dense, expert = _layer_elements(result.scenario)
    rank = result.ranks[0]
    per_element = (rank.ledger.live_bytes("weights") / (dense + expert),
                   rank.ledger.live_bytes("gradients") / (dense + expert),
                   _optimizer_bytes_per_element(rank, dense + expert))
    seconds = result.forward_time_s + result.backward_time_s
    steps = (result.forward_time_s, result.input_grad_time_s,
             result.weight_grad_time_s) if split else ()
    compute = result.compute_steps_s if split else ()
    return LayerCost(seconds, kept, dense, expert, per_element, steps, compute)


def _expert_grid_dp(sc: Scenario) -> int:
    """The data-parallel size of the smallest grid of t ranks per replica that the expert grid
    (ETP·EP ranks) tiles: ETP·EP / gcd(t, ETP·EP) (Megatron: t·dp divisible by ETP·EP)."""
    grid = sc.parallel.etp * sc.parallel.ep if sc.model.num_experts else 1
    return grid // math.gcd(sc.parallel.tp, grid)


def _layer_kinds(sc: Scenario) -> list[dict]:
    """Model overrides for each kind of layer the model has: itself when all its layers are
    alike, else a dense layer and a MoE layer (as --moe-layer-freq patterns of one entry)."""
    m = sc.model
    kinds = {m.is_moe_layer(i) for i in range(m.num_layers)}
    return [{}] if len(kinds) == 1 else [{"num_layers": 1, "moe_layer_freq": f"[{kind}]"}
                                           for kind in (0, 1)]


def layer_costs(sc: Scenario, granularity: str, split: bool = False) -> list[LayerCost]:
    """One layer of each kind of this layout (t, SP, b, model, expert layout) under
    `granularity`, on one expert grid (a MoE layer exchanges its tokens as in the layout); the
    pipeline, data parallelism and runtime switches do not change a layer alone, so they are
    reset (shared memo); `split`: its backward as B then W."""
    defaults = Parallel()
    reduced = with_overrides(sc, model={"seq_length": sc.model.seq_length // sc.parallel.cp},
                             parallel={
        "context_parallel_size": 1, "cp_comm_type": defaults.cp_comm_type,
        "hierarchical_context_parallel_sizes": None,
        "pipeline_model_parallel_size": 1, "data_parallel_size": _expert_grid_dp(sc),
        "global_batch_size": None,
        "schedule": None, "num_layers_per_virtual_pipeline_stage": None,
        "pipeline_model_parallel_layout": None,
        "distributed_optimizer": False, "recompute_granularity": granularity,
        "recompute_method": None, "recompute_num_layers": None,
        **{key: getattr(defaults, key) for key in (
            "overlap_p2p_communication", "scatter_gather_tensors_in_pipeline",
            "overlap_grad_reduce", "overlap_param_gather", "align_grad_reduce",
            "align_param_gather", "ddp_bucket_size", "overlap_param_gather_with_optimizer_step",
            "ddp_average_in_collective",
            "accumulate_allreduce_grads_in_fp32")}},
        cluster={"nodes": math.ceil(sc.parallel.tp * _expert_grid_dp(sc)
                                    / sc.cluster.gpus_per_node)},
        run={"name": "layer"})
    return [_simulated_layer(with_overrides(reduced, model=kind) if kind else reduced, split)
            for kind in _layer_kinds(sc)]


def layer_seconds(sc: Scenario, granularity: str) -> float:
    """The fewest seconds any layer of the model takes alone under `granularity`."""
    return min(cost.seconds for cost in layer_costs(sc, granularity))


def layer_kept_bytes(sc: Scenario, granularity: str) -> int:
    """The fewest bytes any layer of the model keeps for backward under `granularity`."""
    return min(cost.kept_bytes for cost in layer_costs(sc, granularity))


def split_layer_seconds(sc: Scenario, granularity: str,
                        compute: bool = False) -> tuple[float, float, float]:
    """(F, B, W): the fewest seconds any layer of the model takes in each step of a split
    backward under `granularity` (each the smallest over the layer kinds on its own);
    `compute`: of its compute kernels alone."""
    steps = [cost.compute if compute else cost.steps
             for cost in layer_costs(sc, granularity, split=True)]
    return tuple(min(kind[i] for kind in steps) for i in range(3))


def layers_per_chunk(sc: Scenario) -> int:
    """L_c: layers of one model chunk (L / p, or L / (p·v) interleaved or as a V; DualPipe's
    two chunks are each a whole stage of its two pipelines, L / p: docs/dualpipe.md)."""
    p = sc.parallel
    if p.schedule_name == "dualpipe":
        return sc.model.num_layers // p.pp
    return sc.model.num_layers // p.pp // chunks_per_stage(sc.model, p)


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
    own = layer_seconds(sc, sc.parallel.recompute_granularity)
    if rebuilt == layers:
        return layers * own
    return rebuilt * own + (layers - rebuilt) * layer_seconds(sc, "none")


def chunk_steps(sc: Scenario, compute: bool = False) -> tuple[float, float, float]:
    """(F, B, W) of one model chunk under a split backward, from its layers alone (block
    recompute: the first N layers at the full-recompute cost, the rest at none's);
    `compute`: of their compute kernels alone."""
    layers, rebuilt = layers_per_chunk(sc), _chunk_recomputed_layers(sc)
    own = split_layer_seconds(sc, sc.parallel.recompute_granularity, compute)
    plain = own if rebuilt == layers else split_layer_seconds(sc, "none", compute)
    return tuple(rebuilt * o + (layers - rebuilt) * q for o, q in zip(own, plain))


def even_stages(sc: Scenario) -> bool:
    """Every stage holds L/p layers (the bounds' premise); uneven Megatron splits
    (--decoder-first-pipeline-num-layers, ...) get no bound beyond what always holds."""
    return not getattr(sc.parallel, "uneven_pipeline", False)


def alike_layers(sc: Scenario) -> bool:
    """Every MoE layer's expert loads on its ranks are layer 0's up to the ranks' order (the
    bounds' other premise): balanced routing, or imbalanced (a seeded expert order per layer,
    model/blocks/moe/routing.py) with all experts on one rank or one expert per rank. Between
    those, another layer's busiest rank may hold a cooler set of experts than layer 0's."""
    m, p = sc.model, sc.parallel
    return (not m.num_experts or m.moe_routing_imbalance == 0
            or p.ep in (1, m.num_experts))


def bounded(sc: Scenario) -> bool:
    """Whether the layout meets both premises; the bounds are 0 (always simulated) if not."""
    return even_stages(sc) and alike_layers(sc)


def time_lower_bound(sc: Scenario) -> float:
    """T ≥ (m·v + p − 1)·(C_f + C_b), or for a split-backward schedule the list schedule of
    its own steps at the chunk's F, B, W (module docstring), an overlapped F&B pair at the
    compute of its F, B and W (pair_bound.py); 0 without its premises."""
    if not bounded(sc):
        return 0.0
    p = sc.parallel
    if pairs_overlap(sc):
        if graph_impl(p) in PER_LAYER_GRAPHS:
            return 0.0
        return overlapped_pairs_time(p.schedule_name, p.pp, p.num_micro_batches,
                                     chunk_steps(sc), chunk_steps(sc, compute=True))
    chunks = chunks_per_stage(sc.model, p)
    if p.schedule_name in SPLIT_BACKWARD:
        return split_schedule_time(p.schedule_name, p.pp, p.num_micro_batches, chunks,
                                   chunk_steps(sc))
    return (p.num_micro_batches * chunks + p.pp - 1) * chunk_seconds(sc)


# The schedules with F&B pairs, by their op lists: the run sends a pair's (and a full
# backward's) outputs after the op ends and waits both inputs before a pair
# (training/pipeline/stage_program.py), as dualpipe.py and dualpipev.py do.
PAIRED_OPS = {"dualpipe": dualpipe, "dualpipev": dualpipev}


@lru_cache(maxsize=1024)
def split_schedule_time(name: str, p: int, m: int, v: int, steps: tuple) -> float:
    """The iteration time of schedule `name`'s own step lists run as soon as each step's input
    is there, every F, B, W taking steps = (F, B, W) seconds, no communication
    (schedule_timing.simulate_uniform; DualPipe's and DualPipeV's op lists by
    op_timing.simulate_ops, a pair's
    and a full backward's outputs sent when the op ends, as the run sends them): at equal times
    the ZB paper's and DeepSeek-V3 Table 2's bubbles (docs/schedules.md, docs/dualpipe.md)."""
    forward, input_grad, weight_grad = steps
    if name in PAIRED_OPS:
        ops = PAIRED_OPS[name](p, m)
        return simulate_ops(ops, Durations(forward, input_grad, weight_grad)).iteration_time
    timeline = simulate_uniform(build_schedule(name, p, m, v), p, v, forward, input_grad,
                                weight_time=weight_grad, placement=placement_of(name))
    return timeline.iteration_time


@lru_cache(maxsize=1024)
def stage0_in_flight(schedule: str, p: int, m: int, v: int, pairs_overlap: bool = False) -> int:
    """Peak (micro-batch, chunk) pairs stage 0 holds between forward and backward; with
    `pairs_overlap` an F&B pair's backward counted first (the run may then free its chunk
    before the forward keeps one: training/pipeline/stage_program.py)."""
    if pairs_overlap and schedule in PAIRED_OPS:
        return max_in_flight(op_steps(PAIRED_OPS[schedule](p, m), backward_first=True))[0]
    return max_in_flight(build_schedule(schedule, p, m, v))[0]


def pairs_overlap(sc: Scenario) -> bool:
    """Whether the run overlaps the two halves of DualPipe's or DualPipeV's F&B pairs: the
    schedule has them and its ranks have TP or EP collectives to hand the compute stream over
    at (training/pipeline/stage_program.py `_dualpipe_pair`)."""
    p = sc.parallel
    return p.schedule_name in PAIRED_OPS and (
        p.tp > 1 or bool(sc.model.num_experts) and p.ep * p.etp > 1)


def chunk_kept_bytes(sc: Scenario) -> int:
    """Bytes one model chunk keeps per micro-batch (Megatron's uniform or block methods); under
    --cpu-offloading only the layers past the first N (whose saved tensors go to host memory,
    training/pipeline/offload.py; offload needs one stage and no recompute) are counted."""
    p = sc.parallel
    own = layer_kept_bytes(sc, p.recompute_granularity)
    if p.cpu_offloading:
        return max(layers_per_chunk(sc) - p.cpu_offloading_num_layers, 0) * own
    plain = layer_kept_bytes(sc, "none") if p.recompute_granularity == "full" else own
    return chunk_recompute_bytes(p, layers_per_chunk(sc), own, plain)[0]


def static_bytes(sc: Scenario) -> float:
    """Weights, gradients and optimizer state one stage-0 rank holds at least: L/p layers at the
    fewest bytes any kind of layer takes (its parameters on one rank, at the bytes per parameter
    simsp's allocators gave the layer alone; with the distributed optimizer the optimizer's over
    d·cp, and over the expert-data-parallel size t·cp·d/(ETP·EP) for expert weights), and its
    word-embedding shard at no more than 4 bytes per parameter (16-bit weights and gradients)."""
    p = sc.parallel
    costs = layer_costs(sc, "none")
    dense_shard = p.dp * p.cp if p.distributed_optimizer else 1  # Megatron's dp_cp group
    expert_shard = (p.tp * p.cp * p.dp // (p.etp * p.ep) if p.distributed_optimizer
                    and sc.model.num_experts else 1)  # the EDP group (iteration.py)
    count = layers_per_chunk(sc) * chunks_per_stage(sc.model, p)  # DualPipe: two stages
    layers = min(cost.static_bytes(count, dense_shard, expert_shard) for cost in costs)
    weight, gradient, optimizer = costs[0].static_bytes_per_element
    per_element = weight + gradient + optimizer / dense_shard
    if p.fsdp is not None:  # what the strategy keeps for the whole iteration (docs/fsdp.md)
        per_element = fsdp_bytes_per_element(sharding_of(sc), p.dp * p.cp)
        layers = min(count * (cost.dense_elements + cost.expert_elements) * per_element
                     for cost in costs)
    embedding = sc.padded_vocab_size * sc.model.hidden_size // p.tp
    return layers + embedding * min(per_element, FP16 + FP16)


def memory_lower_bound(sc: Scenario) -> float:
    """Stage 0's peak is at least its static bytes plus its busiest moment's kept chunks;
    0 without its premises (bounded)."""
    if not bounded(sc):
        return 0.0
    p = sc.parallel
    chunks = chunks_per_stage(sc.model, p)
    held = stage0_in_flight(p.schedule_name, p.pp, p.num_micro_batches, chunks,
                            pairs_overlap(sc))
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
