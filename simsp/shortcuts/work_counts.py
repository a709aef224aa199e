"""What the engine will simulate, counted from the shortcut verdict before the run: the flows the
stepped tensor- and data-parallel rings start on the shared links (engine/network.py
`flows_started`), the work estimate's term that layer-steps miss (simsp/scenario/work.py).

A ring collective over n ranks on k NCCL channels (engine/collectives/ring_plan.py
channel_rings) starts k·n·(n − 1) flows per phase (reduce-scatter or all-gather: n − 1 steps,
every position sending; an all-reduce is two phases). A group runs step by step when the
verdict gives it STEP_BY_STEP or NODE_PIECE (engine/group_timing.py); the representative run
executes only the groups holding its simulated ranks (shortcuts/plan.py simulated_ranks), each
once. Per layer-step a tensor-parallel group runs, with sequence parallelism, 4 collectives
forward and 6 backward (Megatron-LM megatron/core/tensor_parallel/layers.py: the column-parallel
backward gathers its input again for the weight gradient), without it 2 all-reduces each way;
after the schedule one all-reduce per sequence-parallel gradient tensor (norm weights and
biases, row-parallel biases; training/data_parallel/finalize.py); a data-parallel group two
phases per gradient bucket of its stage (bucket_counts.py stage_buckets: only the first
stage's first model chunk is cut at the bucket size; training/data_parallel/grad_buckets.py).
A CP all-gather group
(--cp-comm-type allgather) that steps runs cp_gather_phases ring phases per layer-step; under
--tp-comm-overlap Transformer Engine's exchanges and the phases it leaves to NCCL are counted by
shortcuts/overlap_counts.py.
"""

from typing import NamedTuple

from simsp.cluster.grid import RankGrid
from simsp.engine.collectives.ring_plan import channel_rings
from simsp.cluster.topology import build_topology, hop_route, nodes_hosting, placement
from simsp.engine.group_timing import NODE_PIECE, STEPPED, TEMPLATE
from simsp.hardware.cluster_hardware import fabric_of
from simsp.scenario.work import (TIME_LIMIT_S, VerdictCounts, fsdp_collectives,
                                 layer_steps, meta_seconds, numeric_seconds)
from simsp.scenario.work_constants import SYMMETRY_SECONDS_PER_RANK
from simsp.shortcuts.bucket_counts import stage_buckets, stage_layers
from simsp.shortcuts.check import Shortcuts
from simsp.shortcuts.overlap_counts import exchange_flows, overlap_counts
from simsp.shortcuts.plan import cp_shadow_why_not, simulated_ranks

# sequence parallel -> ring phases of one layer's (forward, backward): 4 and 6 single-phase
# collectives with SP, 2 all-reduces (4 phases) each way without
TP_PHASES_PER_LAYER_STEP = {True: (4, 6), False: (4, 4)}


class WorkCounts(NamedTuple):
    """Counts of one meta iteration: layer-steps, flows of the stepped TP and DP rings, and of
    the FSDP rings stepped whole and run as pieces (priced apart: scenario/work.py)."""

    layer_steps: int
    flows: int
    fsdp_flows: int = 0
    piece_flows: int = 0
    a2a_flows: int = 0  # the TEMPLATE all-to-alls' private simulations (alone_a2a_flows)
    checked_members: int = 0  # members of the all-to-all owners the check lists
    ep_pairs: float | None = None  # flows per all-to-all where not one per pair (_ep_pairs)
    train_steps: int = 0  # steps of FSDP pieces of one member per node, run in arithmetic
    train_collectives: int = 0  # those pieces' collectives (phases)
    exchange_flows: int = 0  # TE's ring exchanges under --tp-comm-overlap (overlap_counts.py)
    flow_visits: float = 0.0  # flows the fair-share solves take up under the quotient (ep_visits)
    gather_flows: float = 0.0  # token-count all-gathers' flows under the quotient (gather_flows)


def ring_flows(gpus: tuple[int, ...], gpus_per_node: int) -> int:
    """Flows one phase of a ring collective over `gpus` starts: k channels x n positions x
    (n − 1) steps."""
    n = len(gpus)
    return len(channel_rings(list(gpus), gpus_per_node)) * n * (n - 1)


def estimated_counts(sc, shortcuts: Shortcuts) -> WorkCounts:
    """Layer-steps and the stepped rings' flows of one meta iteration under `shortcuts`."""
    p = sc.parallel
    grid = RankGrid(p.tp, p.pp, p.dp, p.cp)
    ranks = simulated_ranks(sc, shortcuts)
    ranks = range(grid.world_size) if ranks is None else ranks
    stepped = stepped_groups(sc, shortcuts)
    per_node = sc.cluster.gpus_per_node
    all_tp_groups = {grid.tp_group(r) for r in ranks} if p.tp > 1 else set()
    tp_groups = all_tp_groups & stepped
    dp_groups = ({grid.dp_cp_group(r) for r in ranks} & stepped
                 if p.dp * p.cp > 1 and p.fsdp is None else set())
    stage_steps = layer_steps(sc) / p.pp  # layer-steps of one stage (uneven splits: the mean)
    forward, backward = tp_phases_per_layer_step(sc)
    recomputed = forward if p.recompute_granularity == "full" else 0  # the forward again
    tp_phases = stage_steps * (forward + backward + recomputed)
    if p.sequence_parallel:
        tp_phases += 2 * _sp_tensors(sc) / p.pp
    per_phase = phase_flows(shortcuts, per_node)
    flows = sum(tp_phases * per_phase(g) for g in tp_groups)
    flows += sum(2 * stage_buckets(sc, grid.coords(g[0]).pp) * per_phase(g)
                 for g in dp_groups)
    flows += cp_gather_flows(sc, shortcuts, ranks, stepped)
    pieces = shortcuts.groups(NODE_PIECE) if shortcuts.closed_form else frozenset()
    hopping = _hopping_pieces(shortcuts, ranks, pieces)  # one hop per simulated member
    hop_steps = _fsdp_flows(sc, grid, ranks, hopping, train_steps)  # in lockstep: one position
    return WorkCounts(layer_steps(sc), round(flows),
                      _fsdp_flows(sc, grid, ranks, stepped - pieces, ring_flows),
                      _fsdp_flows(sc, grid, ranks, pieces - hopping, piece_flows),
                      alone_a2a_flows(sc, shortcuts, ranks), checked_members(sc),
                      _ep_pairs(shortcuts),
                      _fsdp_flows(sc, grid, ranks, pieces - hopping, train_steps) + hop_steps,
                      _fsdp_flows(sc, grid, ranks, pieces, train_phases),
                      exchange_flows(sc, shortcuts.templates, len(all_tp_groups)),
                      ep_visits(sc, shortcuts), gather_flows(sc, shortcuts))


def ep_visits(sc, shortcuts: Shortcuts) -> float:
    """Flows the fair-share solves take up (engine/network.py `flow_visits`) where the quotient
    by rail symmetry runs stepwise EP groups: every EP flow a simulated rank starts (each
    all-to-all's E orbit flows, C classes of them as the network drains like flows together:
    _ep_classes; each token-count all-gather's ring piece) is, at its start or finish, solved
    with the all-to-all classes in flight on its GPU's links, C of them while micro-batches
    stream (a share m/(m + p) of the schedule), since under the quotient every flow of a stage
    shares its one simulated GPU's links (docs/PERFORMANCE.md)."""
    a2a, gathers, pairs = _ep_flows(sc, shortcuts)
    if not pairs:
        return 0.0
    classes = _ep_classes(sc, shortcuts)
    p = sc.parallel
    return ((a2a * classes / pairs + gathers) * classes * p.num_micro_batches
            / (p.num_micro_batches + p.pp))


def _ep_classes(sc, shortcuts: Shortcuts) -> float:
    """Classes one all-to-all's orbit flows drain as (engine/network.py: flows starting
    together with the same route, bytes and latency): their distinct routes on the orbits'
    links (link_reps) with their image links, the bytes taken alike (uniform routing); the
    mean over the EP groups run."""
    symmetry, per_node = shortcuts.symmetry, sc.cluster.gpus_per_node
    reps, counts = symmetry.link_reps, []
    for group, orbits in symmetry.pair_orbits.items():
        graph = build_topology(sc.cluster, nodes_hosting(group, per_node))
        counts.append(len({(tuple(reps.get(edge, edge) for edge in hop_route(graph, src, dst)),
                            images) for src, dst, images in orbits}))
    return sum(counts) / len(counts)


def gather_flows(sc, shortcuts: Shortcuts) -> float:
    """Flows of the EP groups' token-count all-gathers under the quotient with EP groups: one
    ring piece per forward of every MoE layer-step (_ep_flows)."""
    return _ep_flows(sc, shortcuts)[1]


def _ep_flows(sc, shortcuts: Shortcuts) -> tuple[float, float, float]:
    """(all-to-all orbit flows, token-count all-gather flows, E) the simulated ranks start in
    one iteration under the quotient with stepwise EP groups, else zeros: per MoE layer-step
    (every stage's and the MTP depths' together) dispatch and combine forward and backward, and
    forward again under full recompute, each E flows (one per orbit of a member's pairs); a
    token-count all-gather per forward (model/blocks/moe/dispatch.py exchange_counts), its
    ring piece's executed positions x (n − 1) steps."""
    orbits = (shortcuts.symmetry.pair_orbits if shortcuts.representative and shortcuts.symmetry
              else {})
    if not orbits or sc.model.num_experts is None:
        return 0.0, 0.0, 0.0
    p, m = sc.parallel, sc.model
    pieces = shortcuts.symmetry.pieces
    pairs = sum(map(len, orbits.values())) / len(orbits)  # E: orbit flows of one all-to-all
    gather = sum(len(pieces[g].executed) * (len(g) - 1) if g in pieces else len(g) - 1
                 for g in orbits) / len(orbits)  # flows of one token-count all-gather
    recompute = p.recompute_granularity == "full"
    moe_layers = sum(map(m.is_moe_layer, range(m.num_layers))) + (m.mtp_num_layers or 0)
    moe_steps = moe_layers * p.num_micro_batches
    return (moe_steps * 2 * (2 + recompute) * pairs, moe_steps * (1 + recompute) * gather,
            pairs)


def tp_phases_per_layer_step(sc) -> tuple[int, int]:
    """Ring phases of one TP group per layer-step, (forward, backward): Megatron's
    collectives (TP_PHASES_PER_LAYER_STEP), or under TE's overlap those it leaves to NCCL's
    rings (shortcuts/overlap_counts.py)."""
    p = sc.parallel
    if p.tp_comm_overlap:
        forward, backward, _, _ = overlap_counts(sc)
        return forward, backward
    return TP_PHASES_PER_LAYER_STEP[p.sequence_parallel]


def cp_gather_flows(sc, shortcuts: Shortcuts, ranks, stepped: set) -> float:
    """Flows the stepped CP all-gather rings of the simulated ranks start: cp_gather_phases
    per layer-step of their stage, each one phase (phase_flows)."""
    p = sc.parallel
    if p.cp == 1 or p.cp_comm_type != "allgather":
        return 0
    grid = RankGrid(p.tp, p.pp, p.dp, p.cp)
    per_phase = phase_flows(shortcuts, sc.cluster.gpus_per_node)
    stage_steps = layer_steps(sc) / p.pp
    return sum(stage_steps * cp_gather_phases(sc) * per_phase(g)
               for g in {grid.cp_group(r) for r in ranks} & stepped)


def cp_gather_phases(sc) -> int:
    """Ring phases of one CP all-gather group per layer-step (training/context_parallel/
    allgather.py CpAllGather): the forward's K/V all-gather, the backward's again and its dK/dV
    reduce-scatter, and the forward's again where the core attention is recomputed (full, or
    selective with core_attn: model/blocks/attention/core.py _cp_forward)."""
    p = sc.parallel
    again = p.recompute_granularity == "full" or "core_attn" in p.recompute_module_set
    return 3 + again


def alone_a2a_flows(sc, shortcuts: Shortcuts, ranks) -> int:
    """Flows the all-to-alls timed alone (TEMPLATE, alltoall dispatcher) start in their
    private simulations: engine/exchanges.py runs one per placement of the group on the
    fabric (cluster/topology.py placement) and byte matrix, n(n − 1) transfers each
    (engine/collectives/all_to_all.py). TEMPLATE needs uniform routing, under which every
    dispatch and combine of a group sends the same uniform matrix: one per placement of the
    simulated ranks' EP groups. The MoE grid is imported only for a model with experts."""
    templates = shortcuts.groups(TEMPLATE) if shortcuts.closed_form else frozenset()
    if not templates or sc.parallel.moe_token_dispatcher_type != "alltoall":
        return 0
    from simsp.model.blocks.moe.placement import expert_grid
    ranks, cluster = set(ranks), sc.cluster
    fabric = fabric_of(cluster)
    placements = {placement(g, cluster.gpus_per_node, cluster.nodes, fabric)
                  for g in set(expert_grid(sc).groups("ep")) & templates if ranks & set(g)}
    return sum(len(place) * (len(place) - 1) for place in placements)


def checked_members(sc) -> int:
    """Members of the owners the shortcut check lists as all-to-alls, each member's links counted
    once per kind of peer, on its node and off it (shortcuts/a2a_links.py; shortcuts/traffic.py
    expert_owners: every EP group; shortcuts/cp_traffic.py: every CP group but all-gather's):
    world/n groups of n members each."""
    p, world = sc.parallel, sc.parallel.world_size
    sizes = [p.expert_model_parallel_size] if sc.model.num_experts is not None else []
    if p.cp > 1 and p.cp_comm_type != "allgather":
        sizes.append(p.cp)
    return sum(world // n * n for n in sizes if n > 1)


def cp_checked_members(sc) -> int:
    """checked_members' CP part: every rank once where CP groups are listed as all-to-alls
    (priced apart: scenario/work.py VerdictCounts.cp_members)."""
    p = sc.parallel
    return p.world_size if p.cp > 1 and p.cp_comm_type != "allgather" else 0


def phase_flows(shortcuts: Shortcuts, gpus_per_node: int):
    """Flows of one phase of a stepped ring: ring_flows, or where the representative run is
    the quotient by rail symmetry (shortcuts/quotient.py) its piece's positions x (n − 1)
    steps (engine/collectives/ring_piece.py)."""
    symmetry = shortcuts.symmetry if shortcuts.representative else None
    pieces = symmetry.pieces if symmetry is not None else {}

    def flows(gpus: tuple[int, ...]) -> int:
        if gpus in pieces:
            return len(pieces[gpus].executed) * (len(gpus) - 1)
        return ring_flows(gpus, gpus_per_node)

    return flows


def _ep_pairs(shortcuts: Shortcuts) -> float | None:
    """Flows one all-to-all of a stepwise EP group starts under rail symmetry: one per orbit of
    its pairs (shortcuts/rail_symmetry.py pair_orbits; the mean over the groups run); None
    where every pair is a flow."""
    orbits = (shortcuts.symmetry.pair_orbits if shortcuts.representative and shortcuts.symmetry
              else {})
    return sum(map(len, orbits.values())) / len(orbits) if orbits else None


def piece_flows(gpus: tuple[int, ...], gpus_per_node: int) -> int:
    """Flows one phase of a ring run as one node's piece of one channel starts: the m members
    a node holds x (n − 1) steps (engine/collectives/ring_alone.py segment_run); none for a
    ring of one member per node, whose one hop's steps run in arithmetic while only pieces
    use its NIC (engine/collectives/step_trains.py; counted by train_steps)."""
    m = len(gpus) // len({gpu // gpus_per_node for gpu in gpus})
    return 0 if m == 1 else m * (len(gpus) - 1)


def _hopping_pieces(shortcuts: Shortcuts, ranks, pieces: frozenset) -> frozenset:
    """The pieces of one member per node that run one hop per simulated member: under FSDP
    with replicas placed unlike (engine/collectives/ring_alone.py _lone_member_hops). Each
    phase runs in arithmetic, alone or with the other ring of its hops (hop_rings.py), its
    positions in lockstep (alike hops, begun together: hop_timelines.py works out one
    position for all), so it costs its n − 1 steps (train_steps), not members x (n − 1);
    the steps that meet a pipeline send on a member's NIC step as flows until the send
    ends (not counted: 1.3% of the members' steps at 2,048 GPUs, 0.5% at 16,384,
    docs/fsdp.md), as do the positions of a ring desynchronised by one."""
    if not shortcuts.twins or len(set(shortcuts.twins)) < 2:
        return frozenset()
    simulated = set(ranks)
    return frozenset(g for g in pieces if len(simulated.intersection(g)) > 1)


def train_steps(gpus: tuple[int, ...], gpus_per_node: int) -> int:
    """Steps one phase of a piece of one member per node runs in arithmetic: n − 1."""
    return (len(gpus) - 1) * train_phases(gpus, gpus_per_node)


def train_phases(gpus: tuple[int, ...], gpus_per_node: int) -> int:
    """1 where a ring is one member per node (its pieces run in arithmetic), else 0."""
    return int(len({gpu // gpus_per_node for gpu in gpus}) == len(gpus))


def _fsdp_flows(sc, grid: RankGrid, ranks, groups: set, per_phase) -> int:
    """Flows of the FSDP rings among `groups` the simulated ranks belong to: each collective
    of its stage (scenario/work.py fsdp_collectives, the stage's own layers) one phase of
    `per_phase` flows."""
    p = sc.parallel
    if p.fsdp is None or p.dp * p.cp == 1:
        return 0
    layers = stage_layers(sc)
    return sum(fsdp_collectives(sc, layers[grid.coords(g[0]).pp])
               * per_phase(g, sc.cluster.gpus_per_node)
               for g in {grid.dp_cp_group(r) for r in ranks} & groups)


def stepped_groups(sc, shortcuts: Shortcuts) -> set:
    """The groups whose rings run as flows: every group without whole-collective timing."""
    if not shortcuts.closed_form:
        p = sc.parallel
        grid = RankGrid(p.tp, p.pp, p.dp, p.cp)
        return set(grid.groups("tp")) | set(grid.groups("dp_cp")) | set(grid.groups("cp"))
    return {group for group, method in shortcuts.methods if method in STEPPED}


def _sp_tensors(sc) -> int:
    """Gradient tensors sequence parallelism leaves partial over TP: per layer its two norms'
    weights (and biases with LayerNorm) and the two row-parallel biases, plus the final norm."""
    m = sc.model
    per_norm = 2 if m.normalization == "LayerNorm" else 1
    per_layer = 2 * per_norm + (2 if m.add_bias_linear else 0)
    return m.num_layers * per_layer + per_norm


def run_seconds(sc, shortcuts: Shortcuts | None = None) -> float:
    """CPU seconds of one iteration by run's rule (simsp/scenario/work.py meta_seconds) with
    the stepped rings' flows counted under `shortcuts` (meta mode; default: the verdict
    Shortcuts.for_scale gives), and rail symmetry's check where the verdict took it."""
    shortcuts = Shortcuts.for_scale(sc) if shortcuts is None else shortcuts
    counts = estimated_counts(sc, shortcuts)
    symmetry = (sc.parallel.tp * sc.parallel.pp * sc.parallel.dp * SYMMETRY_SECONDS_PER_RANK
                if shortcuts.symmetry is not None else 0.0)
    return symmetry + meta_seconds(sc, shortcuts.representative, VerdictCounts(
        fsdp_pieces=_pieces(shortcuts), flows=counts.flows,
        fsdp_flows=(counts.fsdp_flows, counts.piece_flows, counts.train_steps,
                    counts.train_collectives),
        a2a=(counts.a2a_flows, counts.checked_members - cp_checked_members(sc)),
        cp_members=cp_checked_members(sc), ep_pairs=counts.ep_pairs,
        exchange_flows=counts.exchange_flows, flow_visits=counts.flow_visits,
        gather_flows=counts.gather_flows, replicas=len(shortcuts.replicas),
        cp_lone=cp_lone(sc, shortcuts), cp_templates=shortcuts.templates and sc.parallel.cp > 1,
        ranks=run_ranks(sc, shortcuts), cp_shadows=cp_shadows(sc, shortcuts)))


def run_ranks(sc, shortcuts: Shortcuts) -> int:
    """Ranks the run simulates under `shortcuts`: the timing plan's (shortcuts/plan.py
    simulated_ranks: replicas per placement or shard kind, CP ranks, rail symmetry's orbits,
    expert groups grown), every rank without the representative."""
    ranks = simulated_ranks(sc, shortcuts)
    return sc.parallel.world_size if ranks is None else len(ranks)


def cp_shadows(sc, shortcuts: Shortcuts) -> bool:
    """Whether CP rank 0 of each stage runs for its group (training/context_parallel/
    shadows.py: shortcuts/plan.py cp_shadow_why_not finds nothing against it, at the trace
    detail a benchmark takes, and the ring runs in arithmetic); the run may still refuse it
    (pipeline transfers over a link's capacity) and run every rank: the estimate's
    optimistic side."""
    return cp_lone(sc, shortcuts) and not cp_shadow_why_not(sc, shortcuts, "none")


def cp_lone(sc, shortcuts: Shortcuts) -> bool:
    """Whether the simulated ranks' CP p2p rings run alone on their links, timed in arithmetic
    (training/context_parallel/lone_ring.py lone_ring: not stepped by the verdict, no image
    loads or link quotient)."""
    p = sc.parallel
    if p.cp == 1 or p.cp_comm_type != "p2p" or not shortcuts.representative \
            or shortcuts.symmetry is not None:
        return False
    grid = RankGrid(p.tp, p.pp, p.dp, p.cp)
    ranks = simulated_ranks(sc, shortcuts) or range(grid.world_size)
    return not {grid.cp_group(r) for r in ranks} & stepped_groups(sc, shortcuts)


def _pieces(shortcuts: Shortcuts) -> bool:
    """Whether any FSDP ring runs as one node's piece (scenario/work.py fsdp_pieces)."""
    return any(method == "node_piece" for _, method in shortcuts.methods)


def row_seconds(sc) -> float:
    """run's CPU-second estimate of one configuration, for a batch's budget (simsp/batch_work.py
    TOTAL_TIME_LIMIT_S: sweep, search, validate): numeric mode's, else meta mode's with the
    stepped rings counted, unless the estimate without them is already above run's limit
    (the shortcut check walks every route: a row run refuses is not worth it)."""
    if sc.run.mode == "numeric":
        return numeric_seconds(sc)
    cheapest = meta_seconds(sc, True)
    return cheapest if cheapest > TIME_LIMIT_S else run_seconds(sc)

