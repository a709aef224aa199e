"""The transfer records the data-parallel rings leave in the network's trace, counted before
the run for its memory estimate (simsp/scenario/work.py meta_bytes `records`): engine/network.py
keeps every delivered ring step where every rank runs (`record_ring_steps`; the representative
keeps none), one record per flow: per gradient bucket two ring phases (reduce-scatter and
all-gather, or an all-reduce's two) of k channels x n positions x (n − 1) steps
(work_counts.py phase_flows), the dense buckets over the DP group (work_counts.py
stage_buckets), a MoE model's expert buckets over the expert-data-parallel group
(training/data_parallel/grad_buckets.py expert_buckets)."""

import math

from simsp.cluster.grid import RankGrid
from simsp.engine.group_timing import STEPPED
from simsp.model.params import param_shapes
from simsp.scenario.config import bucket_size
from simsp.scenario.pipeline_split import model_chunks, virtual_stage_layer_counts
from simsp.scenario.work import buckets_of
from simsp.shortcuts.check import Shortcuts
from simsp.shortcuts.work_counts import stepped_groups, phase_flows, stage_buckets


def dp_ring_records(sc, shortcuts: Shortcuts) -> int:
    """Transfer records the data-parallel rings of one iteration leave: per stepped DP group
    its stage's dense buckets, per expert-data-parallel group its stage's expert buckets, two
    ring phases each (none under FSDP, whose rings are other collectives, or the
    representative)."""
    p = sc.parallel
    if shortcuts.representative or p.dp * p.cp == 1 or p.fsdp is not None:
        return 0
    grid = RankGrid(p.tp, p.pp, p.dp, p.cp)
    per_phase = phase_flows(shortcuts, sc.cluster.gpus_per_node)
    stepped = stepped_groups(sc, shortcuts)
    groups = set(grid.groups("dp_cp")) & stepped
    dense = sum(2 * stage_buckets(sc, grid.coords(g[0]).pp) * per_phase(g) for g in groups)
    return dense + _expert_records(sc, shortcuts, per_phase)


def _expert_records(sc, shortcuts: Shortcuts, per_phase) -> int:
    """The expert buckets' rings: per expert-data-parallel group of more than one rank (every
    one without closed forms, else those the verdict steps) two phases per expert bucket of
    its stage. The MoE placement is imported only for a model with experts."""
    if sc.model.num_experts is None:
        return 0
    from simsp.model.blocks.moe.placement import expert_grid
    grid = expert_grid(sc)
    groups = {g for g in grid.groups("edp") if len(g) > 1}
    if shortcuts.closed_form:
        groups &= {group for group, method in shortcuts.methods if method in STEPPED}
    return sum(2 * expert_buckets(sc, grid.coords(g[0]).pp, len(g)) * per_phase(g)
               for g in groups)


def expert_buckets(sc, stage: int, edp: int) -> int:
    """Expert buckets on a rank of pipeline stage `stage` (grad_buckets.py expert_buckets,
    built as the dense ones): one per model chunk holding MoE layers, the first stage's first
    chunk cut at the bucket size for `edp` ranks, its experts' weights (model/params.py
    shapes) a rank's E/EP experts, f split over ETP, walked in reverse."""
    m, p = sc.model, sc.parallel
    counts = virtual_stage_layer_counts(m, p)  # shape (p·v,): layers per virtual stage
    chunks = model_chunks(m, p)
    buckets = 0
    for chunk in range(chunks):
        first = sum(counts[:chunk * p.pp + stage])
        layers = range(first, first + counts[chunk * p.pp + stage])
        if not any(map(m.is_moe_layer, layers)):
            continue
        if stage == 0 and chunk == 0 and not p.overlap_param_gather_with_optimizer_step:
            buckets += buckets_of(_expert_shards(sc, layers)[::-1],
                                  bucket_size(edp, p.overlap_grad_reduce, p.ddp_bucket_size))
        else:
            buckets += 1
    return buckets


def _expert_shards(sc, layers: range) -> list[int]:
    """Elements of a rank's shard of each expert weight of `layers`, in module order: E/EP of
    the experts, f split over ETP (model/blocks/moe/placement.py shard_shape)."""
    from simsp.model.blocks.moe.placement import is_expert_param
    p = sc.parallel
    names = {f"layers.{i}." for i in layers}
    return [math.prod(shape) // (p.expert_model_parallel_size * p.etp)
            for name, shape in param_shapes(sc.model).items()
            if is_expert_param(name) and name[:name.index(".", 7) + 1] in names]
