"""The timing plan of one run, computed before it: which ranks run programs, every communication
group's timing method, and the links the simulated ranks' hops also load for their images.

The engine takes the plan's `timing_of` as its one entry (engine/communicator.py) and knows no
group lists; where each method is exact is shortcuts/methods.py, which group meets which
condition shortcuts/check.py. Without the closed-form shortcut (`--no-shortcuts`, numeric mode)
every group runs step by step.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from simsp.cluster.grid import RankGrid
from simsp.scenario.config import sms_shared
from simsp.engine.group_timing import STEP_BY_STEP
from simsp.shortcuts.check import Shortcuts
from simsp.shortcuts.methods import UNLISTED
from simsp.shortcuts.representative import cp_simulated_ranks
from simsp.shortcuts.traffic import has_expert_groups, routing_is_uniform


@dataclass(frozen=True, eq=False)
class TimingPlan:
    """Every group's timing method (engine/group_timing.py), the simulated ranks (None: all)
    and, per hop they send, the links of its images (shortcuts/rail_symmetry.py; None: none).
    A group none of whose ranks is simulated is never run: the representative shortcut
    (shortcuts/methods.py REPRESENTED) times it as the image of one that is."""

    default: str  # the method of a group the check does not list
    methods: Mapping[tuple[int, ...], str]  # checked group -> its method
    simulated: tuple[int, ...] | None = None
    image_loads: Mapping | None = field(default=None, repr=False)
    # the quotient by rail symmetry (shortcuts/quotient.py): link -> its orbit's link, and
    # ring group -> its piece (engine/collectives/ring_piece.py)
    link_reps: Mapping | None = field(default=None, repr=False)
    pieces: Mapping = field(default_factory=dict, repr=False)
    # stepwise EP group -> its pairs' orbits, one flow each (shortcuts/rail_symmetry.py)
    pair_orbits: Mapping = field(default_factory=dict, repr=False)
    # with replicas placed unlike: rank -> the first rank placed as it is
    # (shortcuts/representative.py placement_replicas), for the pieces of its DP rings
    twins: Mapping = field(default_factory=dict, repr=False)
    # the ranks of those replicas (not replica 0) whose steps after their chunk's first replay
    # it (training/pipeline/step_replay.py; step_replay_why_not)
    replayed: frozenset = frozenset()

    def timing_of(self, group: tuple[int, ...]) -> str:
        """How the communicator times this group's collectives."""
        return self.methods.get(group, self.default)


def timing_plan(sc, shortcuts: Shortcuts) -> TimingPlan:
    """The plan that carries out `shortcuts` for scenario `sc`."""
    simulated = simulated_ranks(sc, shortcuts)
    symmetry = shortcuts.symmetry if shortcuts.representative else None
    reduced = (() if symmetry is None else
               (symmetry.loads, symmetry.link_reps, MappingProxyType(symmetry.pieces),
                MappingProxyType(dict(symmetry.pair_orbits))))
    if not shortcuts.closed_form:
        plan = TimingPlan(STEP_BY_STEP, MappingProxyType({}), simulated, *reduced)
    else:
        plan = TimingPlan(UNLISTED.name, MappingProxyType(dict(shortcuts.methods)), simulated,
                          *reduced)
    twins = rank_twins(sc, shortcuts)
    replayed = frozenset() if not twins or step_replay_why_not(sc) else frozenset(
        r for r in simulated if twins[r] == r and r % (sc.parallel.tp * sc.parallel.dp) > 0)
    return replace(plan, twins=MappingProxyType(twins), replayed=replayed)


def step_replay_why_not(sc) -> str:
    """Why the replicas kept beside replica 0 (one per placement on the leaves) cannot replay
    their steps after each chunk's first ("" when they can): a step must be a pure delay, the
    same in every micro-batch (training/pipeline/step_replay.py). So layer templates and the
    representative without FSDP, CP, experts or multi-token prediction (each has its own
    replicas or calls inside a step); blocking p2p calls; no DP communication overlapping the
    schedule, no FP8 amax reduction inside a step (its group spans replicas), no offload,
    deferred weight gradients, SMs shared with communication kernels or split backward."""
    from simsp.training.fp8_amax import delayed_scaling  # run-time module: imported on use
    p, m = sc.parallel, sc.model
    blockers = {"FSDP": p.fsdp is not None, "context parallelism": p.cp > 1,
                "experts": m.num_experts is not None, "multi-token prediction":
                bool(m.mtp_num_layers), "overlapped p2p": p.overlap_p2p_communication,
                "overlapped DP communication": p.overlap_grad_reduce or p.overlap_param_gather,
                "FP8 delayed scaling": delayed_scaling(sc), "offload": p.cpu_offloading,
                "delayed weight gradients": p.delay_wgrad_compute,
                "SMs shared with communication": sms_shared(sc),
                f"the {p.schedule_name} schedule": p.schedule_name not in ("1f1b", "interleaved")}
    return ", ".join(name for name, on in blockers.items() if on)


def rank_twins(sc, shortcuts: Shortcuts) -> dict[int, int]:
    """Every rank's twin where DP replicas are placed unlike on the leaves (the first replica
    placed as its own, same TP and pipeline ranks); empty otherwise, or where the replicas run
    are not those the verdict keeps for it (a test's plain run)."""
    twins, replicas = shortcuts.twins, shortcuts.replicas
    if not shortcuts.representative or not twins or not set(twins) <= set(replicas):
        return {}
    p = sc.parallel
    grid = RankGrid(p.tp, p.pp, p.dp)
    return {grid.rank_of(tp, dp, pp): grid.rank_of(tp, twin, pp) for tp in range(p.tp)
            for dp, twin in enumerate(twins) for pp in range(p.pp)}


def simulated_ranks(sc, shortcuts: Shortcuts) -> tuple[int, ...] | None:
    """The ranks that run programs: all (None) without the representative shortcut; one per
    orbit of rail symmetry on every stage; else the ranks with tp = 0 and dp = 0 (and each other
    replica of shortcuts.replicas: another placement or FSDP shard kind), grown to whole expert groups where routing depends on the data (they exchange their own rows;
    the MoE placement is imported only then)."""
    if not shortcuts.representative:
        return None
    if shortcuts.symmetry is not None:
        return tuple(shortcuts.symmetry.ranks)
    p = sc.parallel
    if p.cp > 1:  # every CP rank of TP rank 0 in each replica (shortcuts/representative.py)
        return tuple(cp_simulated_ranks(RankGrid(p.tp, p.pp, p.dp, p.cp), shortcuts.replicas))
    grid = RankGrid(p.tp, p.pp, p.dp)
    ranks = [grid.rank_of(0, dp, pp) for dp in shortcuts.replicas for pp in range(p.pp)]
    if has_expert_groups(sc) and not routing_is_uniform(sc):
        from simsp.model.blocks.moe.placement import representatives
        return tuple(representatives(sc, ranks))
    return tuple(ranks)


def cp_shadow_why_not(sc, shortcuts: Shortcuts, trace: str = "steps") -> str:
    """Why a CP group's ranks cannot run as one program, CP rank 0 of each stage with its
    shadows (training/context_parallel/shadows.py; "" when they can): the representative's
    CP ranks with layer templates and closed-form collectives, a p2p ring whose calls run in
    arithmetic (ring_pass.py: no compute spans traced, no SM contention, kernel log or CUDA
    graphs), d = 1, blocking p2p without scatter/gather, untied embeddings, and nothing whose
    timing reads another slice: no experts, FSDP, overlapped DP communication, offload,
    multi-token prediction, FP8 delayed scaling, deferred weight gradients or split-backward
    schedules."""
    from simsp.training.fp8_amax import delayed_scaling  # run-time module: imported on use
    from simsp.scenario.cuda_graphs import graph_impl
    p, m = sc.parallel, sc.model
    blockers = {
        "no context parallelism": p.cp == 1,
        f"--cp-comm-type {p.cp_comm_type}": p.cp_comm_type != "p2p",
        "numeric mode": sc.run.mode != "meta",
        "the full simulation": not (shortcuts.representative and shortcuts.closed_form
                                    and shortcuts.templates),
        "rail symmetry": shortcuts.symmetry is not None,
        "FSDP": p.fsdp is not None,
        "experts": m.num_experts is not None, "multi-token prediction": bool(m.mtp_num_layers),
        "overlapped p2p": p.overlap_p2p_communication,
        "scattered p2p": p.scatter_gather_tensors_in_pipeline and not p.sequence_parallel
        and p.tp > 1,
        "overlapped DP communication": p.overlap_grad_reduce or p.overlap_param_gather,
        "FP8 delayed scaling": delayed_scaling(sc), "offload": p.cpu_offloading,
        "delayed weight gradients": p.delay_wgrad_compute,
        "SMs shared with communication": sms_shared(sc),
        "CUDA graphs": graph_impl(p) != "none",
        "tied embeddings": p.pp > 1 and not m.untie_embeddings_and_output_weights,
        "traced compute": trace == "full",

        f"the {p.schedule_name} schedule": p.schedule_name not in ("1f1b", "interleaved")}
    return ", ".join(name for name, on in blockers.items() if on)
