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
from simsp.shortcuts.check import Shortcuts
from simsp.shortcuts.work_counts import ring_flows
from simsp.training.data_parallel.grad_buckets import DDPBuckets
from simsp.training.pipeline.plan import stage_param_names, stage_plans

PHASES = {ALL_REDUCE: 2, REDUCE_SCATTER: 1, ALL_GATHER: 1}  # ring phases of each collective


def dp_ring_records(sc, shortcuts: Shortcuts) -> int:
    """Transfer records the data-parallel rings of one iteration leave: per DP group timed step
    by step its stage's bucket collectives (FSDP: its units'), per expert-data-parallel group
    of more than one rank its stage's expert buckets' (none where the representative runs)."""
    p = sc.parallel
    if shortcuts.representative or p.dp * p.cp == 1:
        return 0
    grid = RankGrid(p.tp, p.pp, p.dp, p.cp)
    rounds = [(_stepped(shortcuts, grid.groups("dp_cp")), grid.coords)]  # (groups, coords)
    if sc.model.num_experts is not None:
        from simsp.model.blocks.moe.placement import expert_grid
        experts = expert_grid(sc)
        rounds.append((_stepped(shortcuts, [g for g in experts.groups("edp") if len(g) > 1]),
                       experts.coords))
    if not any(groups for groups, _ in rounds):
        return 0
    rings = RingChoice(sc, grid)
    plans = stage_plans(sc, RankGrid(1, p.pp, 1, 1))  # [stage] its plan (alike over t, d, c)
    collectives = fsdp_collectives if p.fsdp is not None else bucket_collectives
    per_stage = {}  # pipeline stage -> (DP, EDP) collectives: every group of a stage alike
    records = 0
    for kind, (groups, coords) in enumerate(rounds):
        for g in groups:
            stage = coords(g[0]).pp
            if stage not in per_stage:
                per_stage[stage] = collectives(sc, grid, plans[stage], grid.rank_of(0, 0, stage))
            records += group_records(rings, g, per_stage[stage][kind])
    return records


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


def bucket_collectives(sc, grid: RankGrid, plan, rank: int) -> tuple[list, list]:
    """The gradient buckets' collectives of `rank` of `plan`'s stage, ([dense], [expert]) of
    (collective, bytes, element bytes, 1): DDPBuckets built on its shards of the stage's
    parameters as the run allocates them (model/weights.py allocate_params: TP shards, a MoE
    rank's E/EP experts with f over ETP) on a ledger-less rank (the buckets need its rank,
    clock and expert placement), each bucket a reduce-scatter of its gradients and an
    all-gather of its parameters (distributed optimizer, bucket_reductions.py,
    bucket_gathers.py) or an all-reduce."""
    p = sc.parallel
    moe = _expert_rank(sc, rank)
    grads = {n: Tensor(moe.shard_shape(n, shape) if moe is not None and moe.holds(n)
                       else local_shape(n, shape, p.tp), FP16)
             for n, shape in _stage_shapes(sc, plan).items()}
    ddp = DDPBuckets(SimpleNamespace(env=simpy.Environment(), rank=rank, moe=moe), p, grid,
                     plan, grads)
    dense, expert = [], []
    for b in ddp.buckets:
        n = len(b.group)
        if ddp.distributed:
            kinds = [(REDUCE_SCATTER, b.numel * b.grad_bytes, b.grad_bytes, 1),
                     (ALL_GATHER, b.numel // n * b.param_bytes * n, b.param_bytes, 1)]
        else:
            kinds = [(ALL_REDUCE, b.numel * b.grad_bytes, b.grad_bytes, 1)]
        (expert if moe is not None and _is_expert(b.names[0]) else dense).extend(kinds)
    return dense, expert


def fsdp_collectives(sc, grid: RankGrid, plan, rank: int) -> tuple[list, list]:
    """The FSDP collectives of one iteration of a rank of `plan`'s stage (every rank of it
    alike: `grid`, `rank` unused), ([(collective, bytes, element bytes, calls)] per unit, [])
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
    collectives = []  # FSDP has no expert buckets (scenario/checks/fsdp.py: no MoE)
    for unit in stage_units(local, p.dp * p.cp):
        gathers = (2 * m if unit.layer is not None else 1) if s.shard_params else 0
        gathers += s.shard_optim and not s.shard_params  # after the step
        gathered = unit.padded * GATHERED_BYTES
        collectives += [(ALL_GATHER, gathered, GATHERED_BYTES, gathers),
                        (reduce, unit.padded * s.reduce_bytes, s.reduce_bytes,
                         m if s.per_step_reduce else 1)]
    return collectives, []


def _expert_rank(sc, rank: int):
    """The rank's expert placement (model/blocks/moe/placement.py expert_rank), None for a
    dense model (the MoE code is imported only for a model with experts)."""
    if sc.model.num_experts is None:
        return None
    from simsp.model.blocks.moe.placement import expert_rank
    return expert_rank(sc, rank)


def _is_expert(name: str) -> bool:
    """Whether a parameter is an expert weight, in buckets of its own (MoE code, imported only
    for a model with experts)."""
    from simsp.model.blocks.moe.placement import is_expert_param
    return is_expert_param(name)
