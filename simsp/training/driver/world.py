"""A simulated cluster ready for rank programs: simpy env, topology, links, collectives, ranks."""

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import simpy

from simsp.cluster.grid import RankGrid
from simsp.cluster.topology import build_topology, nodes_hosting
from simsp.scenario.config import Scenario, sms_shared
from simsp.scenario.cuda_graphs import graph_impl, graph_modules
from simsp.engine.communicator import Communicator
from simsp.engine.group_timing import STEP_BY_STEP, EveryGroup, TimingOf
from simsp.engine.memory import Ledger
from simsp.engine.network import Network
from simsp.engine.sm_share import SmShare
from simsp.engine.streams import COMM, Stream
from simsp.engine.trace import Trace
from simsp.hardware.attention_kernels import attention_rates
from simsp.hardware.constants import GPUS, LinkCalibration, cluster_compute
from simsp.hardware.costmodel import active_calibration
from simsp.hardware.launch import launch_costs
from simsp.hardware.profiles import gpu_profile
from simsp.model.cuda_graphs import cuda_graphs
from simsp.model.rank import Rank, TPGroup
from simsp.scenario.precision import precision_of
from simsp.scenario.tp_overlap import ub_gemms
from simsp.training.pipeline.p2p import Mailbox


@dataclass
class World:
    """Everything one simulation shares; `ranks` holds the simulated ranks only. Besides the
    links and collectives, the meeting points of rank programs: the pipeline's p2p mailbox, the
    tied embedding's all-reduce arrivals, the rings CP groups meet on."""

    scenario: Scenario
    env: simpy.Environment
    grid: RankGrid
    network: Network
    comm: Communicator
    trace: Trace
    ranks: dict = field(default_factory=dict)  # global rank -> Rank
    cp_rings: dict = field(default_factory=dict)  # rings met by CP groups (context_parallel/)
    mailbox: Mailbox = field(init=False)  # posted p2p sends, receives (training/pipeline/p2p.py)
    # (first stage rank, last stage rank) -> {rank: arrival_s} at the tied embedding's
    # all-reduce (training/data_parallel/finalize.py)
    tied_embedding_arrivals: dict = field(default_factory=dict)
    # CP leaders and their shadows (training/context_parallel/shadows.py CpShadows), or None
    shadows: object = None

    def __post_init__(self):
        """The p2p mailbox runs on the world's clock."""
        self.mailbox = Mailbox(self.env)

    def release(self) -> None:
        """Cut the reference cycles that keep a finished world alive (each ledger's clock
        closes over the world, simpy's Environment binds its own methods, networkx caches its
        views on the graph), so reference counting frees it at once instead of the cyclic
        collector rescanning it (a sweep evaluates thousands). The world is unusable after."""
        for rank in self.ranks.values():
            rank.ledger.clock = None
        self.ranks.clear()
        vars(self.env).clear()
        for view in ("edges", "adj", "succ", "pred", "nodes", "in_edges", "out_edges"):
            vars(self.network.graph).pop(view, None)


def build_world(sc: Scenario, simulated: Sequence[int] | None = None,
                timing_of: TimingOf = EveryGroup(STEP_BY_STEP),
                image_loads: dict | None = None, link_reps: dict | None = None,
                pieces: dict | None = None, pair_orbits: dict | None = None) -> World:
    """A world whose `simulated` ranks (default: all) get a Rank; others are assumed alike.

    `timing_of(group)` gives each group's timing method (engine/group_timing.py; meta mode's
    plan, shortcuts/plan.py, decided before the run; default: every ring step by step).
    `image_loads`: per hop, the links its flows also load for the ranks a rail-symmetric
    representative stands for (shortcuts/rail_symmetry.py), `pair_orbits` per EP group its
    all-to-all's pairs by orbit, one flow each; or, its quotient (shortcuts/quotient.py),
    `link_reps` (link -> its orbit's) and `pieces` (ring group -> the positions that run,
    engine/collectives/ring_piece.py)."""
    env = simpy.Environment()
    p = sc.parallel
    grid = RankGrid(p.tp, p.pp, p.dp, p.cp)
    trace = Trace()
    # only the nodes that host ranks (a 1-GPU job on a 100000-node cluster builds one node)
    hosts = nodes_hosting(range(grid.world_size), sc.cluster.gpus_per_node)
    network = Network(env, build_topology(sc.cluster, hosts),
                      LinkCalibration.from_cluster(sc.cluster), trace=trace,
                      image_loads=image_loads, link_reps=link_reps)
    ranks = list(range(grid.world_size)) if simulated is None else sorted(simulated)
    network.record_ring_steps = simulated is None
    present = None if simulated is None else set(ranks)
    # the model's own spans name each collective by its role; the communicator's go unused
    comm = Communicator(env, network, present=present, trace=Trace(), timing_of=timing_of,
                        pieces=pieces)
    comm.sm_share, comm.nccl_sms = _sm_share(sc, env), sc.cluster.sm_contention
    # Megatron's --use-sharp: NCCL_COLLNET_ENABLE=1 while the DP-CP groups are created, first
    # ("only the initially created communication group is eligible"), then unset
    # (megatron/core/parallel_state.py initialize_model_parallel)
    if sc.cluster.use_sharp:
        comm.sharp_groups = frozenset(grid.groups("dp_cp"))
    comm.pair_orbits = dict(pair_orbits or {})
    world = World(sc, env, grid, network, comm, trace)
    for rank in ranks:
        world.ranks[rank] = _make_rank(world, rank)
    return world


@functools.lru_cache(maxsize=8)
def _tp_overlap(tp: int, cfg: str | None) -> dict:
    """TE's per-GEMM overlap (scenario/tp_overlap.py; the user's file read once)."""
    return ub_gemms(tp, cfg)


def _make_rank(world: World, rank: int) -> Rank:
    sc = world.scenario
    members = world.grid.tp_group(rank)
    overlap = (_tp_overlap(sc.parallel.tp, sc.parallel.tp_comm_overlap_cfg)
               if sc.parallel.tp_comm_overlap else None)
    tp = TPGroup(members, members.index(rank), sc.parallel.sequence_parallel, world.comm,
                 overlap)
    precision = precision_of(sc)
    ledger = Ledger(rank, GPUS[sc.cluster.gpu].memory_bytes, clock=lambda: world.env.now)
    # collectives record their own spans (by role, on tp/dp tracks); the stream's go unused
    comm_stream = Stream(world.env, rank, COMM, Trace())
    return Rank(rank, world.env, ledger, tp, mode=sc.run.mode,
                dtype=np.dtype(sc.run.numeric_dtype), seed=sc.run.seed, trace=world.trace,
                comm_stream=comm_stream, compute_cal=cluster_compute(sc.cluster),
                precision=precision, fp8=precision.fp8, cp=_cp_attention(world, rank),
                attention=attention_rates(sc.cluster.gpu, sc.model.attention_backend,
                                          sc.parallel.fp8_dot_product_attention),
                moe=_expert_rank(sc, rank), sm_share=world.comm.sm_share,
                graphs=_cuda_graphs(sc))


def _cuda_graphs(sc: Scenario):
    """The rank's CUDA graphs as Megatron resolves the flags (scenario/cuda_graphs.py), with the
    GPU's launch costs (hardware/launch.py); None without graphs."""
    impl = graph_impl(sc.parallel)
    if impl == "none":
        return None
    stream_launch = (cluster_compute(sc.cluster) or active_calibration()).launch_overhead_s
    costs = launch_costs(gpu_profile(sc.cluster.gpu).launch, stream_launch)
    return cuda_graphs(impl, graph_modules(sc.parallel), costs)


def _sm_share(sc: Scenario, env: simpy.Environment) -> SmShare | None:
    """The ranks' shared SMs (engine/sm_share.py) where communication kernels hold some: NCCL's
    channels under --sm-contention, TE's userbuffers kernels under --tp-comm-overlap."""
    if not sms_shared(sc):
        return None
    return SmShare(env, int(gpu_profile(sc.cluster.gpu).attention["sm_count"]))


def _cp_attention(world: World, rank: int):
    """The rank's context-parallel attention, or None without context parallelism (the CP
    code, training/context_parallel/, is imported only by a run that has it)."""
    if world.grid.cp == 1:
        return None
    from simsp.training.context_parallel.choice import cp_attention_of
    return cp_attention_of(world, rank)


def _expert_rank(sc: Scenario, rank: int):
    """The rank's expert placement, or None for a dense model (the MoE placement code,
    model/blocks/moe/placement.py, is imported only by a run that has experts)."""
    if sc.model.num_experts is None:
        return None
    from simsp.model.blocks.moe.placement import expert_rank
    return expert_rank(sc, rank)
