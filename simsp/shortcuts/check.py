"""Where meta mode's shortcuts are exact, decided before anything runs: `Shortcuts` and its check.

A collective timed as a whole moves no flows, so it is exact only while no other transfer
crosses a link its ring could be slowed on; the representative-rank shortcut is exact only
while the ranks it leaves out cannot slow the ones it simulates, and every rank of a stage sits
on the nodes as its representative does. Both are decided here from the routes alone
(shortcuts/traffic.py, shortcuts/clashes.py): every collective group gets the first method of
the table in shortcuts/methods.py whose condition it meets (step by step where other traffic
shares its links, which loads them in the fair-shared network, engine/network.py, as the full
simulation does; its ring alone where only its own channels share them; ...), and
shortcuts/plan.py turns the verdict into the run's timing plan. Sufficient conditions, not
necessary ones: a shortcut refused here is never wrong, only slower.
"""

from dataclasses import dataclass
import math

import networkx as nx

from simsp.cluster.grid import RankGrid
from simsp.cluster.topology import build_topology, nodes_hosting
from simsp.engine.collectives.ring_alone import piece_divisor
from simsp.gc_pause import gc_paused
from simsp.engine.group_timing import NODE_PIECE, STEP_BY_STEP, STEPPED
from simsp.hardware.cluster_hardware import fabric_of
from simsp.model.params import param_shapes
from simsp.model.sharding import local_shape
from simsp.scenario.tp_overlap import dgrad_rs_on
from simsp.shortcuts.clashes import Overlaps, conflicts, meeting_others, meeting_themselves
from simsp.shortcuts.methods import GroupFacts, method_for
from simsp.shortcuts.rail_symmetry import RailSymmetry
from simsp.shortcuts.ranks import hashed_once
from simsp.shortcuts.reasons import (closed_form_why, cp_templates_why, representative_why,
                                     segments_why, templates_why)
from simsp.shortcuts.representative import (cp_replicas, placement_replicas,
                                            representative_verdict)
from simsp.shortcuts.traffic import (Owner, amax_owners, expert_owners, has_expert_groups,
                                     link_users, mirror_owners, standalone_mtp_owners,
                                     traffic_owners)
from simsp.training.pipeline.plan import stage_param_names, stage_plans
from simsp.training.pipeline.schedules import SPLIT_BACKWARD

SHORTCUTS = ("representative", "closed_form", "templates")


@dataclass(frozen=True)
class Shortcuts:
    """The scale shortcuts of meta mode, each shown equal to the full simulation in
    tests/test_shortcuts.py: one simulated rank per TP group and DP replica, whole-collective
    timing, and layer templates (which need the other two); under whole-collective timing,
    every listed group's method (shortcuts/methods.py)."""

    representative: bool = False
    closed_form: bool = False
    templates: bool = False
    methods: tuple = ()  # ((group, method), ...): the checked groups, in the order listed
    reasons: tuple = ()  # (shortcut, "used: ..." or "not used: ...") from check_shortcuts
    # representative by rail symmetry: the ranks simulated, per hop its images' links
    # (shortcuts/rail_symmetry.py)
    symmetry: RailSymmetry | None = None
    # the DP replicas whose TP rank 0 runs on every stage: under FSDP one per placement on the
    # leaves and kind of shard (shortcuts/representative.py fsdp_replicas), without FSDP one
    # per placement where only the replicas' pair routes differ (placement_replicas), with CP
    # one per placement (cp_replicas)
    replicas: tuple[int, ...] = (0,)
    # with replicas placed unlike on the leaves: per DP replica, the first placed as it is
    # (placement_replicas; () where all are placed alike)
    twins: tuple[int, ...] = ()

    @classmethod
    def for_scale(cls, sc) -> "Shortcuts":
        """In meta mode every shortcut that is exact for this layout (check_shortcuts); none
        in numeric mode, whose numbers need every rank."""
        if sc.run.mode != "meta":
            why = "not used: numeric mode needs every rank and every ring step"
            return cls(reasons=tuple((name, why) for name in SHORTCUTS))
        binding = fabric_of(sc.cluster).uplinks_can_bind(sc.cluster.nodes)
        if binding:  # the proofs (docs/shortcuts.md) hold where links above the leaves never bind
            why = (f"not used: {binding}, so links above the leaves can bind, which the "
                   f"shortcuts' proofs assume they never do")
            return cls(reasons=tuple((name, why) for name in SHORTCUTS))
        verdict = check_shortcuts(sc)
        if sc.parallel.cp > 1:  # every CP rank of the representative's TP and DP coordinates
            # runs (shortcuts/plan.py simulated_ranks); templates split at the CP calls
            kept = verdict.reasons[0]
            if verdict.representative:
                kept = ("representative", _cp_representative_why(sc, verdict.replicas))
            why = cp_templates_why(sc, dict(verdict.reasons)["templates"])
            return cls(representative=verdict.representative, closed_form=verdict.closed_form,
                       templates=why.startswith("used"), methods=verdict.methods,
                       reasons=(kept, verdict.reasons[1], ("templates", why)),
                       replicas=verdict.replicas)
        return verdict

    def flags(self) -> dict:
        """The three shortcuts, on or off."""
        return {"representative": self.representative, "closed_form": self.closed_form,
                "templates": self.templates}

    def why(self) -> dict:
        """Per shortcut: used or not, and why (the `shortcuts_used` of metrics.json)."""
        reasons = dict(self.reasons)
        return {name: reasons.get(name, ("used" if on else "not used") + ": as requested")
                for name, on in self.flags().items()}

    def groups(self, *methods: str) -> frozenset[tuple[int, ...]]:
        """The checked groups given one of `methods`."""
        return frozenset(group for group, method in self.methods if method in methods)


def _cp_representative_why(sc, replicas: tuple[int, ...]) -> str:
    """The verdict's line for the CP representative: which replicas' TP rank 0 runs."""
    which, images = "", "TP ranks are their images (rails renamed)"
    if sc.parallel.dp > 1:
        which = (f" in DP replica{'s' if len(replicas) > 1 else ''} "
                 f"{', '.join(map(str, replicas))} (one per placement on the leaves)")
        images = "ranks are their images (rails renamed, replicas moved by whole leaves)"
    return (f"used: TP rank 0's {sc.parallel.cp} CP ranks of each stage run{which}; the other "
            f"{images} and no link carries their traffic and a simulated rank's at once")


def check_shortcuts(sc) -> Shortcuts:
    """The exact shortcuts of a meta-mode scenario, every checked group's method, and the
    reason for each shortcut. The cyclic collector is paused meanwhile (gc_pause.py): the
    check builds a tuple per route and clash over the whole world, and each full collection
    rescanned them (0.7 of 2.1 CPU s at 16,384 GPUs, benchmarks/scale.py llama3.1-405b-fsdp)."""
    with gc_paused():
        return _check_shortcuts(sc)


def _check_shortcuts(sc) -> Shortcuts:
    p, cluster = sc.parallel, sc.cluster
    grid = RankGrid(p.tp, p.pp, p.dp, p.cp)
    graph = build_topology(cluster, nodes_hosting(range(grid.world_size), cluster.gpus_per_node))
    owners = hashed_once(_owners(sc, grid) + amax_owners(sc, grid, graph))
    # FSDP's gathers and reductions run beside the compute's TP and p2p traffic, and beside
    # each other on the same DP group (two streams): its DP rings run step by step (docs/fsdp.md)
    overlaps = Overlaps(p.overlap_grad_reduce or p.fsdp is not None,  # zero-bubble p2p: non-blocking
                        p.overlap_p2p_communication or p.schedule_name in SPLIT_BACKWARD)
    clashes = list(conflicts(link_users(graph, owners), overlaps))
    fsdp_rings = (frozenset(ranks for kind, ranks in owners if kind == "dp" and len(ranks) > 1)
                  if p.fsdp is not None else frozenset())
    splits = _units_split_evenly(sc, grid, graph)
    methods = _group_methods(sc, owners, clashes, fsdp_rings, splits)
    stepwise = frozenset(g for g, m in methods if m in STEPPED)  # rings that load links
    pieced = frozenset(g for g, m in _pieces_beside_sends(methods, fsdp_rings, clashes,
                                                          cluster.gpus_per_node)
                       if m == NODE_PIECE and splits)  # rings a piece would quotient
    not_rep, symmetry, by_placement = representative_verdict(sc, grid, graph, owners, clashes,
                                                             stepwise, pieced)
    not_rep, replicas, twins = _replicas(sc, grid, graph, not_rep, symmetry, by_placement)
    if splits and not not_rep and symmetry is None and p.cp == 1:
        methods = _pieces_beside_sends(methods, fsdp_rings, clashes, cluster.gpus_per_node)
    used_templates = _templates_verdict(sc, not_rep, stepwise, owners, symmetry)
    pieces = frozenset(g for g, m in methods if m == NODE_PIECE)
    closed_why = closed_form_why(clashes, stepwise) + segments_why(
        pieces, cluster.gpus_per_node, graph.graph["fabric"].nodes_per_leaf)
    return Shortcuts(representative=not not_rep, closed_form=True,
                     templates=used_templates.startswith("used"), methods=methods,
                     reasons=(("representative", representative_why(not_rep, symmetry,
                                                                      replicas)),
                              ("closed_form", closed_why), ("templates", used_templates)),
                     symmetry=symmetry, replicas=replicas,
                     twins=twins if p.cp == 1 else ())


def _replicas(sc, grid: RankGrid, graph, not_rep: str, symmetry,
              by_placement: bool) -> tuple[str, tuple[int, ...], tuple]:
    """(why not representative, the DP replicas simulated, each replica's twin): one per
    placement on the leaves (and FSDP shard kind, shortcuts/representative.py
    placement_replicas), with CP the first of each placement (cp_replicas)."""
    fabric = graph.graph["fabric"]
    replicas, twins = ((0,), ()) if not_rep or symmetry is not None else placement_replicas(
        sc, grid, fabric, by_placement)
    if sc.parallel.cp > 1 and not not_rep:
        replicas = cp_replicas(grid, sc.cluster, fabric)
    if len(replicas) > 1 and has_expert_groups(sc):  # untested: experts grow the replicas
        return ("under FSDP the DP replicas' placements or shards differ (fsdp_replicas) and "
                "expert groups would grow each replica simulated"), (0,), ()
    return not_rep, replicas, twins


def _templates_verdict(sc, not_rep: str, stepwise: frozenset, owners: list[Owner],
                       symmetry) -> str:
    """Layer templates used or not, and why (shortcuts/reasons.py templates_why)."""
    why = templates_why(sc, not_rep, stepwise, {ranks for kind, ranks in owners if kind == "tp"},
                        {ranks for kind, ranks in owners if kind == "ep"})
    if symmetry is not None and has_expert_groups(sc) and why.startswith("used"):
        # a replayed step keeps its all-to-all's time, not its wait for the other simulated
        # members of the expert group (p3 d16 EP 16 across a leaf: 2.9e-3 off, docs/shortcuts.md)
        return ("not used: under rail symmetry an expert group's simulated members may reach "
                "its all-to-all at different moments")
    return why


def _owners(sc, grid: RankGrid) -> list[Owner]:
    """Every owner of traffic in one iteration (shortcuts/traffic.py; with context
    parallelism shortcuts/cp_traffic.py), the MoE all-to-all groups last (FP8 delayed scaling's
    amax groups are added after them, shortcuts/traffic.py amax_owners)."""
    p = sc.parallel
    interleaved = p.schedule_name == "interleaved"
    mirrors = mirror_owners(grid.groups("pp")) if p.schedule_name == "dualpipe" else []
    mirrors += standalone_mtp_owners(sc, grid.groups("pp"))  # its embedding group
    if p.cp == 1:
        return traffic_owners(grid, interleaved) + mirrors + expert_owners(sc)
    from simsp.shortcuts.cp_traffic import cp_moe_owners, cp_traffic_owners  # CP runs only
    return (cp_traffic_owners(grid, interleaved, p.cp_comm_type) + mirrors + cp_moe_owners(sc)
            + expert_owners(sc))


def _group_methods(sc, owners: list[Owner], clashes: list, fsdp_rings: frozenset,
                   splits: bool) -> tuple:
    """((group, method), ...) for every collective group among the owners, in their order:
    the first method of shortcuts/methods.py whose condition the group's facts meet."""
    others, themselves = meeting_others(clashes), meeting_themselves(clashes)
    all_to_all = {ranks for kind, ranks in owners if kind == "ep"}
    own_overlap = {ranks for kind, ranks in owners if kind == "tp"} if dgrad_rs_on(
        sc.parallel) else set()
    no_cp = sc.parallel.cp == 1
    methods = {}
    for kind, group in owners:
        if kind == "p2p" or group in methods:
            continue
        methods[group] = method_for(GroupFacts(
            meets_others=group in others, meets_itself=group in themselves,
            fsdp_ring=group in fsdp_rings, tp_own_overlap=group in own_overlap,
            pieces_allowed=splits and no_cp,
            all_to_all=group in all_to_all, templates_allowed=no_cp))
    return tuple(methods.items())


def _pieces_beside_sends(methods: tuple, fsdp_rings: frozenset, clashes: list,
                        gpus_per_node: int) -> tuple:
    """The methods with every stepped FSDP ring of one member per node that meets no other
    owner but pipeline pairs run as pieces: under the plain representative each member's
    NIC meets its own replica's sends, the image of the representative's (their clashes are
    mirrored), so the representative's NIC, up and down, stands for every member's
    (engine/collectives/ring_alone.py _lone_member_hop): the quotient of the full simulation
    by the shift of whole nodes, as for the pieces that meet only themselves."""
    partners: dict[tuple[int, ...], set[str]] = {}
    for _edge, owner, other in clashes:
        if owner != other:
            partners.setdefault(owner[1], set()).add(other[0])
            partners.setdefault(other[1], set()).add(owner[0])

    def lone(group: tuple[int, ...]) -> bool:
        return len({gpu // gpus_per_node for gpu in group}) == len(group)

    return tuple((g, NODE_PIECE if m == STEP_BY_STEP and g in fsdp_rings and lone(g)
                  and partners.get(g, set()) <= {"p2p"} else m) for g, m in methods)


def _units_split_evenly(sc, grid: RankGrid, graph: nx.DiGraph) -> bool:
    """Every FSDP collective (a unit's padded buffer, training/data_parallel/fsdp_units.py, in
    2- or 4-byte elements alike) can run as one node's piece of one channel
    (engine/collectives/ring_alone.py node_segment: nodes alike, one channel per member, equal
    slices; one member per node too): its group allows a piece and every unit's element count
    divides by the group's piece_divisor. The FSDP units are imported only under FSDP."""
    if sc.parallel.fsdp is None:
        return False
    from simsp.training.data_parallel.fsdp_units import stage_units
    shapes = param_shapes(sc.padded_model)
    d = grid.dp * grid.cp
    # a stage's layers depend on its pipeline rank alone: one plan per stage, not per rank
    for pp, plan in stage_plans(sc, RankGrid(1, grid.pp, 1, 1)).items():
        group = grid.dp_cp_group(grid.rank_of(0, 0, pp))
        divisor = piece_divisor(graph, list(group), one_per_node=True)
        numels = {n: math.prod(local_shape(n, shapes[n], grid.tp))
                  for n in stage_param_names(shapes, plan)}
        if divisor is None or any(unit.padded % divisor for unit in stage_units(numels, d)):
            return False
    return True
