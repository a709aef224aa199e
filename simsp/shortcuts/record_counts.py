"""The transfer records the data-parallel rings leave in the network's trace, counted before
the run for its memory estimate (simsp/scenario/work.py meta_bytes `records`): engine/network.py
keeps every delivered ring step where every rank runs (`record_ring_steps`; the representative
keeps none), one record per flow, of the groups timed step by step (engine/group_timing.py
STEP_BY_STEP: a node's piece loads links, recording nothing) and of the collectives NCCL runs
as rings (engine/timed_collectives.py runs_as_rings: an NVLS, CollNet or tree collective is
timed whole). A ring phase (reduce-scatter or all-gather; an all-reduce is two) leaves k
channels x n positions x (n − 1) steps (work_counts.py ring_flows). The collectives: per
gradient bucket of a stage (DDPBuckets, training/data_parallel/grad_buckets.py, built here as
the run builds it) a reduce-scatter and an all-gather with the distributed optimizer, else an
all-reduce; a MoE model's expert buckets over the expert-data-parallel group likewise; under
FSDP each unit's gathers and reductions (training/data_parallel/fsdp.py, fsdp_collectives)."""

import math
from types import SimpleNamespace

import simpy

from simsp.cluster.grid import RankGrid
from simsp.cluster.topology import build_topology
from simsp.engine.collectives.ring_plan import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from simsp.engine.communicator import Communicator
from simsp.engine.group_timing import STEP_BY_STEP
from simsp.engine.meeting import Meeting
from simsp.engine.network import Network
from simsp.hardware.constants import LinkCalibration
from simsp.model.params import param_shapes
from simsp.model.sharding import local_shape
from simsp.model.tensor import FP16, Tensor
from simsp.scenario.config import bucket_size
from simsp.scenario.pipeline_split import model_chunks, virtual_stage_layer_counts
from simsp.scenario.work import buckets_of
from simsp.shortcuts.check import Shortcuts
from simsp.shortcuts.work_counts import ring_flows
from simsp.training.data_parallel.grad_buckets import DDPBuckets
from simsp.training.pipeline.plan import stage_param_names, stage_plans

PHASES = {ALL_REDUCE: 2, REDUCE_SCATTER: 1, ALL_GATHER: 1}  # ring phases of each collective


def dp_ring_records(sc, shortcuts: Shortcuts) -> int:
    """Transfer records the data-parallel rings of one iteration leave: per DP group timed step
    by step its stage's bucket collectives (FSDP: its units'), per expert-data-parallel group
    its stage's expert buckets (none where the representative runs)."""
    p = sc.parallel
    if shortcuts.representative or p.dp * p.cp == 1:
        return 0
    grid = RankGrid(p.tp, p.pp, p.dp, p.cp)
    groups = _stepped(shortcuts, grid.groups("dp_cp"))
    if not groups:
        return _expert_records(sc, shortcuts)
    rings = RingChoice(sc, grid)
    plans = stage_plans(sc, RankGrid(1, p.pp, 1, 1))  # [stage] its plan (alike over t, d, c)
    collectives = fsdp_collectives if p.fsdp is not None else bucket_collectives
    per_stage = {}  # pipeline stage -> its collectives (every DP group of a stage alike)
    records = 0
    for g in groups:
        stage = grid.coords(g[0]).pp
        if stage not in per_stage:
            per_stage[stage] = collectives(sc, grid, plans[stage], g[0])
        records += group_records(rings, g, per_stage[stage])
    return records + _expert_records(sc, shortcuts)


def _stepped(shortcuts: Shortcuts, groups: list) -> list:
    """The `groups` whose rings run step by step, as transfers (every one without closed
    forms)."""
    if not shortcuts.closed_form:
        return groups
    stepped = shortcuts.groups(STEP_BY_STEP)
    return [g for g in groups if g in stepped]


def group_records(rings, group: tuple, collectives: list) -> int:
    """Records of `collectives` [(collective, bytes, element bytes, calls)] over `group`: each
    call NCCL runs as rings its phases of ring_flows."""
    flows = ring_flows(group, rings.gpus_per_node)
    return sum(calls * PHASES[kind] * flows for kind, nbytes, elem, calls in collectives
               if rings(kind, group, nbytes, elem))


class RingChoice:
    """Whether NCCL runs a collective as rings in the run: the communicator's own test
    (engine/timed_collectives.py runs_as_rings) with the run's calibration and --use-sharp's
    DP-CP groups (training/driver/world.py). The test reads of the topology only its GPUs per
    node and link speeds (collectives/nccl_group.py nccl_choice: the nodes a group spans come
    from its GPUs), so one node's stands for the run's (a 4,096-node graph took 0.6 CPU s);
    memoised per collective, group and size."""

    def __init__(self, sc, grid: RankGrid):
        self.gpus_per_node = sc.cluster.gpus_per_node
        env = simpy.Environment()
        network = Network(env, build_topology(sc.cluster, [0]),
                          LinkCalibration.from_cluster(sc.cluster))
        self.comm = Communicator(env, network)
        if sc.cluster.use_sharp:
            self.comm.sharp_groups = frozenset(grid.groups("dp_cp"))
        self._memo: dict[tuple, bool] = {}

    def __call__(self, collective: str, group: tuple, nbytes: int, elem_bytes: int) -> bool:
        key = (collective, group, nbytes, elem_bytes)
        if key not in self._memo:
            meeting = Meeting(collective, group, nbytes, "", frozenset(group),
                              self.comm.env.event(), elem_bytes)
            self._memo[key] = self.comm.runs_as_rings(meeting)
        return self._memo[key]


def _stage_shapes(sc, plan) -> dict:
    """The stage's parameters {canonical name: full shape}, as the run allocates them
    (training/driver/iteration.py _allocate)."""
    shapes = param_shapes(sc.padded_model)
    return {n: shapes[n] for n in stage_param_names(shapes, plan)}


def bucket_collectives(sc, grid: RankGrid, plan, rank: int) -> list:
    """The dense gradient buckets' collectives of `rank` of `plan`'s stage, [(collective,
    bytes, element bytes, 1)]: DDPBuckets built on its TP shards of the stage's dense
    parameters (a ledger-less rank: the buckets need only its rank and clock), each bucket a
    reduce-scatter of its gradients and an all-gather of its parameters (distributed
    optimizer, bucket_reductions.py, bucket_gathers.py) or an all-reduce."""
    p = sc.parallel
    expert = _expert_test(sc)
    grads = {n: Tensor(local_shape(n, shape, p.tp), FP16)
             for n, shape in _stage_shapes(sc, plan).items() if not expert(n)}
    ddp = DDPBuckets(SimpleNamespace(env=simpy.Environment(), rank=rank, moe=None), p, grid,
                     plan, grads)
    collectives = []
    for b in ddp.buckets:
        n = len(b.group)
        if ddp.distributed:
            collectives += [(REDUCE_SCATTER, b.numel * b.grad_bytes, b.grad_bytes, 1),
                            (ALL_GATHER, b.numel // n * b.param_bytes * n, b.param_bytes, 1)]
        else:
            collectives.append((ALL_REDUCE, b.numel * b.grad_bytes, b.grad_bytes, 1))
    return collectives


def fsdp_collectives(sc, grid: RankGrid, plan, rank: int) -> list:
    """The FSDP collectives of one iteration of a rank of `plan`'s stage (every rank of it
    alike: `grid`, `rank` unused), [(collective, bytes, element bytes, calls)] per unit
    (fsdp_units.py stage_units): with sharded parameters two gathers of a layer unit per
    micro-batch (before its forward and its backward), one of a root unit (kept until the
    schedule ends); a reduction (reduce-scatter, all-reduce under no_shard) per micro-batch
    with sharded gradients, else once; with only the optimizer sharded a gather of every unit
    after the step (fsdp_gathers.py, fsdp_reductions.py). The FSDP code is imported only for
    a run that uses it."""
    from simsp.training.data_parallel.fsdp_units import GATHERED_BYTES, sharding_of, stage_units
    p, s = sc.parallel, sharding_of(sc)
    local = {n: math.prod(local_shape(n, shape, p.tp))
             for n, shape in _stage_shapes(sc, plan).items()}
    m = p.num_micro_batches
    reduce = REDUCE_SCATTER if s.shard_optim else ALL_REDUCE
    collectives = []
    for unit in stage_units(local, p.dp * p.cp):
        gathers = (2 * m if unit.layer is not None else 1) if s.shard_params else 0
        gathers += s.shard_optim and not s.shard_params  # after the step
        gathered = unit.padded * GATHERED_BYTES
        collectives += [(ALL_GATHER, gathered, GATHERED_BYTES, gathers),
                        (reduce, unit.padded * s.reduce_bytes, s.reduce_bytes,
                         m if s.per_step_reduce else 1)]
    return collectives


def _expert_test(sc):
    """name -> whether it is an expert weight (reduced over its own group; the MoE code is
    imported only for a model with experts)."""
    if sc.model.num_experts is None:
        return lambda name: False
    from simsp.model.blocks.moe.placement import is_expert_param
    return is_expert_param


def _expert_records(sc, shortcuts: Shortcuts) -> int:
    """The expert buckets' rings: per expert-data-parallel group of more than one rank timed
    step by step two phases per expert bucket of its stage, each taken as rings (their sizes
    are not worked out: a tree or NVLS expert all-reduce is overcounted). The MoE placement
    is imported only for a model with experts."""
    if sc.model.num_experts is None:
        return 0
    from simsp.model.blocks.moe.placement import expert_grid
    grid = expert_grid(sc)
    groups = _stepped(shortcuts, [g for g in grid.groups("edp") if len(g) > 1])
    return sum(2 * expert_buckets(sc, grid.coords(g[0]).pp, len(g))
               * ring_flows(g, sc.cluster.gpus_per_node) for g in groups)


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
