"""One rank per stage where stages are alike only up to rail symmetry: the traffic of the groups
the representative run leaves out is loaded as images of the traffic it runs (docs/shortcuts.md).

A stage's t·d ranks are laid out on whole blocks of rails (B = min(t·d, GPUs per node)) and,
beyond one node, on N = t·d / B whole nodes. Three shifts move a stage onto itself: the TP rank
(tp -> tp + 1 inside every TP group), the TP group inside a block (by t rails) and the node
inside a stage. They commute, so they generate a group H of t·d elements acting on every
stage's ranks freely and transitively, and on the links that can bind (NVLink ports and NICs,
each one GPU's) alike. Where every shift maps every traffic owner (TP, DP, embedding group,
pipeline pair, EP group: its all-to-all's direct pairs, where every member sends alike:
shortcuts/representative.py experts_why_not_symmetric) onto an owner of the same kind, hop for
hop with the same links' speeds and latencies, and keeps which groups run step by step, the
full simulation is H-invariant: the image h(f) of a flow f moves at f's rate at every moment.
The representative run executes the groups holding its ranks; each of their flows then carries,
besides its own links, the links of its images under one h per other group of the orbit (the cosets
of the group's stabiliser), so every link is loaded as in the full simulation and max-min fair
sharing (engine/fair_share.py) gives every executed flow its full-simulation rate. Flows are equal
across an orbit only when the chunk slices are (engine/collectives/ring_plan.py chunk_counts); where
they are not the images differ by one element per slice. Where every executed ring has its piece the
run is rather the full simulation's quotient by H (shortcuts/quotient.py): one hop per orbit, one
link per orbit, an EP group's all-to-all as the pairs its simulated members send (present_pairs).
"""

from dataclasses import dataclass, field
from itertools import product

import networkx as nx

from simsp.cluster.grid import RankGrid
from simsp.cluster.topology import hop_route
from simsp.engine.collectives.ring_plan import channel_rings
from simsp.shortcuts.quotient import quotient
from simsp.shortcuts.traffic import Edge, Owner, can_bind

Hop = tuple[int, int, int | None]  # (src GPU, dst GPU, relaying GPU or None)
MAX_IMAGE_ENTRIES = 4_000_000  # |H| x ranks: the permutations this module keeps in memory


def owner_hops(graph: nx.DiGraph, owner: Owner) -> list[Hop]:
    """Every hop of an owner's traffic: a pair's one hop, an EP group's every ordered pair (its
    all-to-all's direct transfers, engine/collectives/all_to_all.py), or every ring position of
    every NCCL channel (engine/collectives/ring_plan.py channel_rings), as the transfers name
    them."""
    return [hop for channel in owner_channels(graph, owner) for hop in channel]


def owner_channels(graph: nx.DiGraph, owner: Owner) -> list[list[Hop]]:
    """[channel][ring position] an owner's hops (a pair: one channel of its one hop; an EP
    group: one channel per ordered pair, each its own transfer)."""
    kind, ranks = owner
    if kind == "p2p":
        return [[(ranks[0], ranks[1], None)]]
    if kind == "ep":
        return [[(a, b, None)] for a in ranks for b in ranks if a != b]
    gpus = list(ranks)
    n = len(gpus)
    return [[(gpus[ch.order[i]], gpus[ch.order[(i + 1) % n]], ch.via[i]) for i in range(n)]
            for ch in channel_rings(gpus, graph.graph["gpus_per_node"])]


@dataclass(frozen=True)
class StageAxes:
    """A stage's ranks as (node in stage, TP group in block, TP rank) on whole rail blocks:
    `block` = min(t·d, GPUs per node) rails, `nodes` = t·d / block, `groups` = block / t."""

    per_stage: int
    block: int
    tp: int

    @property
    def sizes(self) -> tuple[int, int, int]:
        """How many values each shift axis takes: (TP rank, TP group, node)."""
        return self.tp, self.block // self.tp, self.per_stage // self.block

    def shift(self, world_size: int, steps: tuple[int, int, int]) -> tuple[int, ...]:
        """The permutation rank -> image moving every stage by `steps` along the three axes."""
        return tuple(self.moved(rank, steps) for rank in range(world_size))

    def coords(self, rank: int) -> tuple[int, tuple[int, int, int]]:
        """(the rank's stage's first rank, its (TP rank, TP group, node) in the stage)."""
        base, local = divmod(rank, self.per_stage)
        node, within = divmod(local, self.block)
        group, tp = divmod(within, self.tp)
        return base * self.per_stage, (tp, group, node)

    def moved(self, rank: int, steps: tuple[int, int, int]) -> int:
        """The rank's image under the shift by `steps` along the three axes."""
        first, coords = self.coords(rank)
        tp, group, node = (c + s for c, s in zip(coords, steps))
        t, groups, nodes = self.sizes
        return first + node % nodes * self.block + group % groups * t + tp % t

    def to_origin(self, rank: int, steps: tuple[int, int, int]) -> tuple[int, int, int]:
        """The shift (a multiple of `steps` per axis) moving the rank onto its orbit's
        representative (_orbit_origin: each coordinate below its axis's step)."""
        return tuple(-(c - c % s) for c, s in zip(self.coords(rank)[1], steps))


def stage_axes(grid: RankGrid, gpus_per_node: int) -> StageAxes | None:
    """The stage's axes, or None where a stage does not sit on whole blocks of rails."""
    per_stage = grid.tp * grid.dp
    block = min(per_stage, gpus_per_node)
    if per_stage % block or block % grid.tp or gpus_per_node % block:
        return None
    return StageAxes(per_stage, block, grid.tp)


def symmetric_steps(graph: nx.DiGraph, axes: StageAxes, world_size: int, owners: list[Owner],
                    stepwise: frozenset) -> tuple[tuple[int, int, int], str]:
    """Per axis the shortest shift that is a symmetry (symmetry_breach); an axis's size where
    none is (e.g. node shifts that would move a pipeline pair from one leaf to two); and why a
    shift by one node is none ("" where it is, or the stage has one node)."""
    steps, node_why = [], ""
    routes = RouteSignatures(graph)  # one cache for every candidate shift
    for axis, size in enumerate(axes.sizes):
        step = size
        for candidate in (s for s in range(1, size) if size % s == 0):
            unit = tuple(candidate if i == axis else 0 for i in range(3))
            breach = symmetry_breach(graph, axes.shift(world_size, unit), owners, stepwise,
                                     routes)
            if not breach:
                step = candidate
                break
            node_why = node_why or (breach if axis == 2 else "")
        steps.append(step)
    return tuple(steps), node_why


class RouteSignatures:
    """What hops meet on their routes, worked out once per link, per hop (and per ring owner)
    for every shift symmetric_steps tries."""

    def __init__(self, graph: nx.DiGraph):
        self.graph = graph
        self._links: dict[Edge, tuple] = {}  # link -> (kind, speed, latency, can bind)
        self._full: dict[Hop, tuple] = {}
        self._binding: dict[Hop, tuple] = {}
        self._hops: dict[Owner, list[Hop]] = {}
        self._sorted: dict[Owner, list[Hop]] = {}
        self._keys: dict[tuple, dict] = {}
        self._key_numbers: dict[tuple, int] = {}  # a channel's sorted hop signatures -> number

    def _link(self, edge: Edge) -> tuple:
        """The link's kind, speed, latency and whether it can bind (read off the graph once:
        a hop's route shares its links with thousands of others)."""
        if edge not in self._links:
            data = self.graph.succ[edge[0]][edge[1]]
            self._links[edge] = (data["kind"], data["bandwidth_Bps"], data["latency_s"],
                                 can_bind(edge))
        return self._links[edge]

    def full(self, hop: Hop) -> tuple:
        """Every link's kind, speed and latency on the hop's route, in order."""
        if hop not in self._full:
            links = [self._link(edge) for edge in hop_route(self.graph, *hop)]
            self._full[hop] = tuple((kind, speed, latency) for kind, speed, latency, _ in links)
        return self._full[hop]

    def binding(self, hop: Hop) -> tuple:
        """The kinds and speeds of the hop's links that can bind, in order."""
        if hop not in self._binding:
            links = [self._link(edge) for edge in hop_route(self.graph, *hop)]
            self._binding[hop] = tuple((kind, speed) for kind, speed, _, binds in links if binds)
        return self._binding[hop]

    def hops(self, owner: Owner) -> list[Hop]:
        """The owner's hops (owner_hops), listed once for every shift tried."""
        if owner not in self._hops:
            self._hops[owner] = owner_hops(self.graph, owner)
        return self._hops[owner]

    def sorted_hops(self, owner: Owner) -> list[Hop]:
        """The owner's hops in order, sorted once for every shift that maps an owner onto it."""
        if owner not in self._sorted:
            self._sorted[owner] = sorted(self.hops(owner))
        return self._sorted[owner]

    def channel_keys(self, owner: Owner) -> dict[Hop, int]:
        """Per hop of a ring, what fixes its step latency: its channel's hop signatures,
        sorted, as their number (equal lists, equal numbers: comparing two hops' keys then
        costs one step, not one per member, which made _ring_breach d² per d-member ring)."""
        if owner not in self._keys:
            keys = {}
            for channel in owner_channels(self.graph, owner):
                signatures = tuple(sorted(self.full(hop) for hop in channel))
                key = self._key_numbers.setdefault(signatures, len(self._key_numbers))
                keys.update((hop, key) for hop in channel)
            self._keys[owner] = keys
        return self._keys[owner]


def _image_hop(shift: tuple[int, ...], hop: Hop) -> Hop:
    src, dst, via = hop
    return shift[src], shift[dst], None if via is None else shift[via]


def _owner_key(owner: Owner) -> tuple:
    """An owner whatever its ring's starting member (a pair keeps its direction)."""
    return owner[0], owner[1] if owner[0] == "p2p" else frozenset(owner[1])


def symmetry_breach(graph: nx.DiGraph, shift: tuple[int, ...], owners: list[Owner],
                    stepwise: frozenset, routes: RouteSignatures | None = None) -> str:
    """Why `shift` is no symmetry ("" where it is): it must map every owner onto an owner of
    its kind whose hops are its hops' images, and keep who runs step by step. A pair's image hop crosses links of the same kinds, speeds and
    latencies; a ring hop's, binding links of the same kinds and speeds in a channel whose
    hops' routes are those of its own channel (every step of a channel pays one pipelined
    latency from them, engine/collectives/nccl_group.py pipelined_step_latency_s, so a map may
    move a spine or core crossing along the ring)."""
    routes = routes or RouteSignatures(graph)
    by_key = {_owner_key(o): o for o in owners}
    for owner in owners:
        moved = tuple(shift[r] for r in owner[1])
        image = by_key.get(_owner_key((owner[0], moved)))
        named = owner  # the messages name it (worked out only for one)
        if image is None or (owner[1] in stepwise) != (image[1] in stepwise):
            return f"maps {_named(named)} onto no owner of its kind and timing"
        if owner[0] == "p2p":  # its image is the moved pair (a pair keeps its direction), so
            # its one hop's image is its image's hop: only the route's class to compare
            if routes.full((*owner[1], None)) != routes.full((*moved, None)):
                return (f"moves {_named(named)} onto a route of another class (leaf, spine, "
                        f"core: other link latencies)")
            continue
        hops = routes.hops(owner)
        if sorted(_image_hop(shift, h) for h in hops) != routes.sorted_hops(image):
            return f"maps the hops of {_named(named)} onto other hops than its image's"
        if owner[0] == "ep":  # direct transfers: every link alike
            if any(routes.full(h) != routes.full(_image_hop(shift, h)) for h in hops):
                return (f"moves {_named(named)} onto a route of another class (leaf, spine, "
                        f"core: other link latencies)")
            # an EP group also gathers its token counts as a ring over its ranks
            # (model/blocks/moe/dispatch.py exchange_counts): checked as a ring is
            owner, image = as_ring(owner), as_ring(image)
            hops = routes.hops(owner)
            if sorted(_image_hop(shift, h) for h in hops) != routes.sorted_hops(image):
                return (f"maps the token-count ring of {_named(named)} onto other hops than "
                        f"its image's")
        if _ring_breach(routes, shift, owner, image, hops):
            return f"moves a hop of {_named(named)} into a channel of other hop routes"
    return ""


def _named(owner: Owner) -> str:
    """An owner as a refusal names it: its kind and first ranks."""
    return f"{owner[0]} {owner[1][:4]}"


def as_ring(owner: Owner) -> Owner:
    """An EP group's token-count all-gather: a ring over the group's ranks."""
    return ("ring", owner[1])


def _ring_breach(routes: RouteSignatures, shift: tuple[int, ...], owner: Owner, image: Owner,
                 hops: list[Hop]) -> bool:
    """Some ring hop's image crosses binding links of other kinds or speeds, or sits in a
    channel of other hop routes (another pipelined step latency)."""
    mine, theirs = routes.channel_keys(owner), routes.channel_keys(image)
    return any(routes.binding(h) != routes.binding(_image_hop(shift, h))
               or mine[h] != theirs[_image_hop(shift, h)] for h in hops)


def _binding(edges: tuple[Edge, ...]) -> tuple[Edge, ...]:
    """The links of a route that can bind (docs/shortcuts.md: leaf-spine links never do)."""
    return tuple(e for e in edges if can_bind(e))


@dataclass(frozen=True)
class RailSymmetry:
    """The ranks a representative run simulates (one per orbit of H on every stage) and, per
    hop they send, the links its images in the groups left out also load."""

    ranks: tuple[int, ...]
    loads: dict = field(compare=False, repr=False)
    node_why: str = ""  # why a shift by one node is no symmetry ("" where it is)
    # the quotient (shortcuts/quotient.py) where every executed ring has its piece: link ->
    # its orbit's link, and group -> its ring piece; then `loads` is empty
    link_reps: dict = field(default_factory=dict, compare=False, repr=False)
    pieces: dict = field(default_factory=dict, compare=False, repr=False)
    # stepwise EP group -> its pairs' orbits, each run as one flow: with image loads each
    # loading its images' links (pair_orbits), under the quotient none (present_pairs)
    pair_orbits: dict = field(default_factory=dict, compare=False, repr=False)


def rail_symmetry(graph: nx.DiGraph, grid: RankGrid, owners: list[Owner],
                  stepwise: frozenset) -> RailSymmetry | None:
    """The representative run by rail symmetry: its quotient where every executed ring (an EP
    group's token-count ring too) has its piece, else image loads; None where the layout is not so symmetric, where it keeps too many images,
    or where the orbits of the traffic it runs miss traffic that loads links (a pipeline pair,
    a stepwise group) or hold it twice."""
    axes = stage_axes(grid, graph.graph["gpus_per_node"])
    if axes is None:
        return None
    steps, node_why = symmetric_steps(graph, axes, grid.world_size, owners, stepwise)
    ranks = tuple(rank for rank in range(grid.world_size)
                  if _orbit_origin(axes, rank, steps))
    simulated = set(ranks)
    executed = [o for o in owners if (o[0] == "p2p" and o[1][0] in simulated) or
                (o[0] != "p2p" and o[1] in stepwise and simulated.intersection(o[1]))]
    reduced = quotient(graph, executed, lambda rank: axes.to_origin(rank, steps), axes.moved)
    if reduced is not None:  # every hop orbit has one hop a simulated rank sends: no loads
        # an EP group's all-to-all: its simulated members' pairs, one per orbit, no image load
        return RailSymmetry(ranks, {}, node_why, *reduced, pair_orbits={
            o[1]: present_pairs(o, simulated) for o in executed if o[0] == "ep"})
    counts = [size // step for size, step in zip(axes.sizes, steps)]
    if counts[0] * counts[1] * counts[2] * grid.world_size > MAX_IMAGE_ENTRIES:
        return None
    shifts = [axes.shift(grid.world_size, (i * steps[0], j * steps[1], k * steps[2]))
              for i, j, k in product(*map(range, counts))]
    loads = image_loads(graph, owners, stepwise, executed, shifts)
    if loads is None:
        return None
    return RailSymmetry(ranks, loads, node_why, pair_orbits={
        o[1]: pair_orbits(graph, o, shifts) for o in executed if o[0] == "ep"})


def _orbit_origin(axes: StageAxes, rank: int, steps: tuple[int, int, int]) -> bool:
    """`rank` is its orbit's representative: each coordinate below its axis's step."""
    node, within = divmod(rank % axes.per_stage, axes.block)
    group, tp = divmod(within, axes.tp)
    return tp < steps[0] and group < steps[1] and node < steps[2]


def pair_orbits(graph: nx.DiGraph, owner: Owner, shifts: list[tuple[int, ...]]) -> tuple:
    """An EP group's ordered pairs by orbit under the symmetry (`shifts`, the identity first):
    per orbit (src GPU, dst GPU, the binding links of the pair's images under every other
    shift). H acts freely, so an orbit's |H| pairs are distinct: those in this group are the
    images under its stabiliser, the rest the pairs of the groups it is mapped onto. One flow
    per orbit loading its images' links then loads every link as the group's flows and their
    images do in the full simulation (engine/collectives/all_to_all.py orbit_all_to_all)."""
    ranks, orbits, seen = owner[1], [], set()
    for src in ranks:
        for dst in ranks:
            if src == dst or (src, dst) in seen:
                continue
            images = [(shift[src], shift[dst]) for shift in shifts[1:]]
            seen.update(images)
            orbits.append((src, dst, tuple(e for a, b in images
                                           for e in _binding(hop_route(graph, a, b)))))
    return tuple(orbits)


def present_pairs(owner: Owner, simulated: set[int]) -> tuple:
    """Under the quotient, an EP group's pairs a simulated member sends, each (src GPU, dst GPU,
    no image links): one per orbit of the group's pairs (the quotient takes the group only where
    every member's shift to its orbit's simulated rank maps the group onto itself,
    shortcuts/quotient.py; H acts freely, so two such pairs are never in one orbit), its links
    mapped onto the orbit's (engine/network.py link_reps)."""
    ranks = owner[1]
    return tuple((a, b, ()) for a in ranks if a in simulated for b in ranks if b != a)


def image_loads(graph: nx.DiGraph, owners: list[Owner], stepwise: frozenset,
                executed: list[Owner], shifts: list[tuple[int, ...]]
                ) -> dict[Hop, tuple[Edge, ...]] | None:
    """Per hop of the `executed` owners' traffic, the binding links of its images (under one
    of `shifts` per other owner of its orbit); None where the orbits miss traffic that loads
    links or hold it twice."""
    loads: dict[Hop, tuple[Edge, ...]] = {}
    covered: set = set()
    for owner in executed:
        cosets = {}
        for shift in shifts:
            cosets.setdefault(_owner_key((owner[0], tuple(shift[r] for r in owner[1]))), shift)
        if covered & cosets.keys():
            return None  # two executed owners in one orbit: their images would count twice
        covered |= cosets.keys()
        others = [shift for key, shift in cosets.items() if key != _owner_key(owner)]
        # an EP group's pairs load through pair_orbits, its token-count ring's hops here
        for hop in owner_hops(graph, as_ring(owner) if owner[0] == "ep" else owner):
            extra = tuple(e for shift in others
                          for e in _binding(hop_route(graph, *_image_hop(shift, hop))))
            if loads.setdefault(hop, extra) != extra:
                return None
    loading = {_owner_key(o) for o in owners if o[0] == "p2p" or o[1] in stepwise}
    return loads if loading <= covered else None
