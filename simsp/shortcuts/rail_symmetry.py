"""One rank per stage where stages are alike only up to rail symmetry: the traffic of the groups
the representative run leaves out is loaded as images of the traffic it runs (docs/shortcuts.md).

A stage's t·d ranks are laid out on whole blocks of rails (B = min(t·d, GPUs per node)) and,
beyond one node, on N = t·d / B whole nodes. Three shifts move a stage onto itself: the TP rank
(tp -> tp + 1 inside every TP group), the TP group inside a block (by t rails) and the node
inside a stage. They commute, so they generate a group H of t·d elements acting on every
stage's ranks freely and transitively, and on the links that can bind (NVLink ports and NICs,
each one GPU's) alike. Where every shift maps every traffic owner (TP, DP, embedding group,
pipeline pair, EP group: its all-to-all's direct pairs, where every member sends alike:
shortcuts/representative.py experts_why_not_symmetric) onto an owner of the same kind, hop for hop with the same links' speeds and
latencies, and keeps which groups run step by step, the full simulation is H-invariant: the
image h(f) of a flow f moves at f's rate at every moment. The representative run executes the
groups holding its ranks; each of their flows then carries, besides its own links, the links of
its images under one h per other group of the orbit (the cosets of the group's stabiliser), so
every link is loaded as in the full simulation and max-min fair sharing (engine/fair_share.py)
gives every executed flow its full-simulation rate. Flows are equal across an orbit only when
the chunk slices are (engine/collectives/ring_plan.py chunk_counts); where they are not the images differ by
one element per slice.
"""

from dataclasses import dataclass, field
from itertools import product

import networkx as nx

from simsp.cluster.grid import RankGrid
from simsp.cluster.topology import hop_route
from simsp.engine.collectives.ring_plan import channel_rings
from simsp.shortcuts.traffic import Edge, Owner, can_bind

Hop = tuple[int, int, int | None]  # (src GPU, dst GPU, relaying GPU or None)
MAX_IMAGE_ENTRIES = 4_000_000  # |H| x ranks: the permutations this module keeps in memory


def owner_hops(graph: nx.DiGraph, owner: Owner) -> list[Hop]:
    """Every hop of an owner's traffic: a pair's one hop, an EP group's every ordered pair (its
    all-to-all's direct transfers, engine/collectives/all_to_all.py), or every ring position of
    every NCCL channel (engine/collectives/ring_plan.py channel_rings), as the transfers name
    them."""
    kind, ranks = owner
    if kind == "p2p":
        return [(ranks[0], ranks[1], None)]
    if kind == "ep":
        return [(a, b, None) for a in ranks for b in ranks if a != b]
    gpus = list(ranks)
    hops = []
    for channel in channel_rings(gpus, graph.graph["gpus_per_node"]):
        order, n = channel.order, len(channel.order)
        hops += [(gpus[order[i]], gpus[order[(i + 1) % n]], channel.via[i]) for i in range(n)]
    return hops


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
        t, groups, nodes = self.sizes
        a, b, c = steps
        image = []
        for rank in range(world_size):
            base, local = divmod(rank, self.per_stage)
            node, within = divmod(local, self.block)
            group, tp = divmod(within, t)
            image.append(base * self.per_stage + (node + c) % nodes * self.block
                         + (group + b) % groups * t + (tp + a) % t)
        return tuple(image)


def stage_axes(grid: RankGrid, gpus_per_node: int) -> StageAxes | None:
    """The stage's axes, or None where a stage does not sit on whole blocks of rails."""
    per_stage = grid.tp * grid.dp
    block = min(per_stage, gpus_per_node)
    if per_stage % block or block % grid.tp or gpus_per_node % block:
        return None
    return StageAxes(per_stage, block, grid.tp)


def symmetric_steps(graph: nx.DiGraph, axes: StageAxes, world_size: int, owners: list[Owner],
                    stepwise: frozenset) -> tuple[int, int, int]:
    """Per axis the shortest shift that is a symmetry (is_symmetry); an axis's size where none
    is (e.g. node shifts that would move a ring's hop across a leaf's boundary)."""
    steps = []
    for axis, size in enumerate(axes.sizes):
        step = size
        for candidate in (s for s in range(1, size) if size % s == 0):
            unit = tuple(candidate if i == axis else 0 for i in range(3))
            if is_symmetry(graph, axes.shift(world_size, unit), owners, stepwise):
                step = candidate
                break
        steps.append(step)
    return tuple(steps)


def _hop_signature(graph: nx.DiGraph, hop: Hop) -> tuple:
    """What a hop's flow meets on its way: every link's kind, speed and latency, in order."""
    return tuple((graph.edges[e]["kind"], graph.edges[e]["bandwidth_Bps"],
                  graph.edges[e]["latency_s"]) for e in hop_route(graph, *hop))


def _image_hop(shift: tuple[int, ...], hop: Hop) -> Hop:
    src, dst, via = hop
    return shift[src], shift[dst], None if via is None else shift[via]


def _owner_key(owner: Owner) -> tuple:
    """An owner whatever its ring's starting member (a pair keeps its direction)."""
    return owner[0], owner[1] if owner[0] == "p2p" else frozenset(owner[1])


def is_symmetry(graph: nx.DiGraph, shift: tuple[int, ...], owners: list[Owner],
                stepwise: frozenset) -> bool:
    """`shift` maps every owner onto an owner of its kind whose hops are its hops' images, each
    crossing links of the same speeds and latencies, and keeps who runs step by step."""
    by_key = {_owner_key(o): o for o in owners}
    for owner in owners:
        image = by_key.get(_owner_key((owner[0], tuple(shift[r] for r in owner[1]))))
        if image is None or (owner[1] in stepwise) != (image[1] in stepwise):
            return False
        hops = owner_hops(graph, owner)
        if sorted(_image_hop(shift, h) for h in hops) != sorted(owner_hops(graph, image)):
            return False
        if any(_hop_signature(graph, h) != _hop_signature(graph, _image_hop(shift, h))
               for h in hops):
            return False
    return True


def _binding(edges: tuple[Edge, ...]) -> tuple[Edge, ...]:
    """The links of a route that can bind (docs/shortcuts.md: leaf-spine links never do)."""
    return tuple(e for e in edges if can_bind(e))


@dataclass(frozen=True)
class RailSymmetry:
    """The ranks a representative run simulates (one per orbit of H on every stage) and, per
    hop they send, the links its images in the groups left out also load."""

    ranks: tuple[int, ...]
    loads: dict = field(compare=False, repr=False)
    # stepwise EP group -> its pairs' orbits (pair_orbits), each run as one flow
    pair_orbits: dict = field(compare=False, repr=False, default_factory=dict)


def rail_symmetry(graph: nx.DiGraph, grid: RankGrid, owners: list[Owner],
                  stepwise: frozenset) -> RailSymmetry | None:
    """The representative run by rail symmetry, or None where the layout is not so symmetric,
    where it keeps too many images, or where the orbits of the traffic it runs miss traffic
    that loads links (a pipeline pair, a stepwise group) or hold it twice."""
    axes = stage_axes(grid, graph.graph["gpus_per_node"])
    if axes is None:
        return None
    steps = symmetric_steps(graph, axes, grid.world_size, owners, stepwise)
    counts = [size // step for size, step in zip(axes.sizes, steps)]
    if counts[0] * counts[1] * counts[2] * grid.world_size > MAX_IMAGE_ENTRIES:
        return None
    shifts = [axes.shift(grid.world_size, (i * steps[0], j * steps[1], k * steps[2]))
              for i, j, k in product(*map(range, counts))]
    ranks = tuple(rank for rank in range(grid.world_size)
                  if _orbit_origin(axes, rank, steps))
    executed = [o for o in owners if (o[0] == "p2p" and o[1][0] in ranks) or
                (o[0] != "p2p" and o[1] in stepwise and set(ranks).intersection(o[1]))]
    loads = image_loads(graph, owners, stepwise, executed, shifts)
    if loads is None:
        return None
    return RailSymmetry(ranks, loads, {o[1]: pair_orbits(graph, o, shifts) for o in executed
                                       if o[0] == "ep"})


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
        for hop in owner_hops(graph, owner) if owner[0] != "ep" else ():  # ep: pair_orbits
            extra = tuple(e for shift in others
                          for e in _binding(hop_route(graph, *_image_hop(shift, hop))))
            if loads.setdefault(hop, extra) != extra:
                return None
    loading = {_owner_key(o) for o in owners if o[0] == "p2p" or o[1] in stepwise}
    return loads if loading <= covered else None
