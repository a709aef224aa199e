"""The full simulation's quotient by a layout's rail symmetry: one hop per orbit, on one link per orbit.

H (shortcuts/rail_symmetry.py) acts freely on every stage's ranks and so on the links that can
bind (each is one GPU's NVLink port or NIC, up or down). The full simulation is H-invariant:
every flow's images move at its rate (the max-min fair allocation is unique, hence symmetric).
Max-min fair sharing then commutes with the quotient: a link stands for its orbit (the same
link of the orbit's simulated GPU), every flow orbit runs as the one flow its simulated rank
sends, and each orbit link carries, per flow orbit, the one image crossing it (freeness: a hop
crosses at most one link of a role, so one of an orbit's flows crosses a given link), as every
link of the orbit does in the full simulation. A ring group runs as its piece
(engine/collectives/ring_piece.py): the hops its simulated members send in every channel, one
per orbit of its hops. An EP group's all-to-all runs as the pairs its simulated members send
(one per orbit of its pairs, on the orbits' links; rail_symmetry.py present_pairs), its
token-count all-gather as its ring piece. docs/shortcuts.md, "Rings as their pieces".
"""

import math

import networkx as nx

from simsp.cluster.topology import gpu_name
from simsp.engine.collectives.ring_piece import RingPiece
from simsp.engine.collectives.ring_plan import channel_rings
from simsp.shortcuts.traffic import Edge, Owner


def _role(edge: Edge) -> tuple[bool, str]:
    """What a binding link is to its GPU: (leaves it, the kind of the far end)."""
    far = edge[1] if edge[0].startswith("gpu") else edge[0]
    return edge[0].startswith("gpu"), "nvswitch" if far.endswith("nvswitch") else "leaf"


def link_representatives(graph: nx.DiGraph, to_origin, moved) -> dict[Edge, Edge]:
    """Every binding link of a GPU -> the link of the same role of the simulated GPU in its
    orbit (`moved(gpu, to_origin(gpu))`: the one shift mapping it there, H acting freely). The
    binding links are the GPUs' own (NVLink port and NIC, each way: can_bind), so each GPU's
    orbit is worked out once for its four, not once per link of the graph."""
    by_role = {gpu: _gpu_links(graph, gpu) for gpu in _gpus(graph)}
    reps = {}
    for gpu, roles in by_role.items():
        origin = by_role[moved(gpu, to_origin(gpu))]
        reps.update((edge, origin[role]) for role, edge in roles.items())
    return reps


def _gpus(graph: nx.DiGraph) -> list[int]:
    """The GPUs the graph holds, in its node order."""
    return [int(name[3:]) for name in graph if name.startswith("gpu")]


def _gpu_links(graph: nx.DiGraph, gpu: int) -> dict[tuple[bool, str], Edge]:
    """The GPU's links by role (_role): out to, then in from, its NVSwitch and its leaf."""
    name = gpu_name(gpu)
    links = [(name, far) for far in graph.succ[name]] + [(far, name) for far in graph.pred[name]]
    return {_role(edge): edge for edge in links}


def ring_piece(group: tuple[int, ...], gpus_per_node: int, to_origin,
               moved) -> RingPiece | None:
    """The piece of a ring group: its hops sent by simulated members (every channel), each
    waiting on the executed hop whose image its predecessor's hop is (the hop moved by the
    shift taking its sender to its orbit's simulated rank, in the channel that shift maps its
    channel onto: _standing); None where that image is no hop of the ring."""
    gpus = list(group)
    n = len(gpus)
    hops = [[(gpus[ch.order[p]], gpus[ch.order[(p + 1) % n]], ch.via[p]) for p in range(n)]
            for ch in channel_rings(gpus, gpus_per_node)]  # [channel][ring position]
    at: dict[tuple, list] = {}  # hop -> its positions (channel, position): NCCL's rotated
    for c, channel in enumerate(hops):  # channels may repeat a node's hops
        for p, hop in enumerate(channel):
            at.setdefault(hop, []).append((c, p))
    executed = [pos for hop, positions in at.items() if not any(to_origin(hop[0]))
                for pos in positions]
    index = {position: i for i, position in enumerate(executed)}
    standing = _standing(hops, at, moved, {to_origin(hop[0]) for hop in at})
    source = {}  # every position -> the index of the executed one standing for it
    for hop, positions in at.items():
        for c, p in positions:
            stand = standing(hop, c, to_origin(hop[0]))
            if index.get(stand) is None:
                return None
            source[(c, p)] = index[stand]
    return RingPiece(tuple(executed), tuple(source[(c, (p - 1) % n)] for c, p in executed))


def _standing(hops: list[list[tuple]], at: dict, moved, shifts: set[tuple]):
    """(hop, its channel, shift) -> the position of the hop's image that stands for it: in the
    channel the shift maps the hop's channel onto, where it maps every channel onto one
    (rail shifts permute NCCL's rotated channels: channel c of GPUs 0-7 moved by one rail is
    channel c + 1), else as _in_channel picks it. `shifts`: every shift it will be asked."""
    maps = ChannelMaps(hops, moved, shifts)

    def stand(hop: tuple, channel: int, shift):
        image_hop = _moved_hop(hop, shift, moved)
        mapped = maps.channel_map(shift)
        if mapped is not None and mapped[channel] is not None:  # the image hop's first place
            return next(pos for pos in at[image_hop] if pos[0] == mapped[channel])
        return _in_channel(at.get(image_hop, []), channel)

    return stand


class ChannelMaps:
    """Per shift, the channel each channel of a ring maps onto: c itself where the shift keeps
    its hop set, else the one channel holding the image set (None: several, or none anywhere).
    Shifts are integer vectors that `moved` adds (StageAxes.moved: coordinates add modulo the
    axis sizes), so a shift's map of the ring's hop sets is the composition of its per-axis
    steps' maps (moved(moved(h, a), b) = moved(h, a + b)): per axis every multiple of the unit
    step (the gcd of `shifts` there) is one composition from the last, instead of moving every
    hop of every channel once per member's shift (channels x d² on a d-member ring). A
    composition only stands where every set it passes through is a hop set of the ring; else
    the shift's hops are moved, as before. docs/shortcuts.md, "Rings as their pieces"."""

    def __init__(self, hops: list[list[tuple]], moved, shifts: set[tuple]):
        self.moved = moved
        self.index: dict[frozenset, int] = {}  # a hop set -> its number
        self.holders: list[list[int]] = []  # [hop set] the channels holding it, in order
        self.class_of = []  # [channel] its hop set's number
        for c, channel in enumerate(hops):
            number = self.index.setdefault(frozenset(channel), len(self.index))
            if number == len(self.holders):
                self.holders.append([])
            self.holders[number].append(c)
            self.class_of.append(number)
        self.sets = list(self.index)  # [hop set] its hops
        axes = len(next(iter(shifts), ()))
        self.units = [math.gcd(*(abs(s[axis]) for s in shifts)) for axis in range(axes)]
        identity = tuple(range(len(self.sets)))
        self.along: list[dict] = [{0: identity} for _ in range(axes)]  # [axis] k -> set map
        self.onto: dict[tuple, list | None] = {}  # shift -> per channel the channel it maps onto

    def channel_map(self, shift: tuple) -> list | None:
        """Per channel the channel `shift` maps it onto (None where none is the one), or None
        where the shift maps some channel onto no channel."""
        if shift not in self.onto:
            images = self._set_map(shift)
            self.onto[shift] = None if None in images else [
                c if images[self.class_of[c]] == self.class_of[c]
                else self.holders[images[self.class_of[c]]][0]
                if len(self.holders[images[self.class_of[c]]]) == 1 else None
                for c in range(len(self.class_of))]
        return self.onto[shift]

    def _set_map(self, shift: tuple) -> tuple:
        """[hop set] the number of its image under `shift` (None: no hop set of the ring)."""
        composed = self.along[0][0]
        for axis, unit in enumerate(self.units):
            if shift[axis] % max(unit, 1):  # not on this axis's steps: move every hop
                return self._moved_sets(shift)
            step = self._along(axis, shift[axis] // unit if unit else 0)
            composed = _then(composed, step)
            if composed is None:
                return self._moved_sets(shift)
        return composed

    def _along(self, axis: int, k: int) -> tuple | None:
        """The set map of k unit steps along `axis`, composed from k - 1 steps and one (None
        where a step leaves the ring's hop sets)."""
        known = self.along[axis]
        sign = 1 if k > 0 else -1
        if sign not in known and k:
            known[sign] = self._moved_sets(tuple(sign * self.units[axis] if i == axis else 0
                                                 for i in range(len(self.units))))
        done = k
        while done not in known:
            done -= sign
        while done != k:
            known[done + sign] = _then(known[done], known[sign])
            done += sign
        return known[k]

    def _moved_sets(self, shift: tuple) -> tuple:
        """[hop set] the number of its image under `shift`, every hop moved."""
        return tuple(self.index.get(frozenset(_moved_hop(hop, shift, self.moved) for hop in hops))
                     for hops in self.sets)


def _then(first: tuple | None, second: tuple | None) -> tuple | None:
    """The set map of `first` then `second`; None unless both map every set onto a set."""
    if first is None or second is None or None in first or None in second:
        return None
    return tuple(second[image] for image in first)


def _moved_hop(hop: tuple, shift, moved) -> tuple:
    """The hop (src, dst, relay or None) moved by `shift`."""
    src, dst, via = hop
    return moved(src, shift), moved(dst, shift), None if via is None else moved(via, shift)


def _in_channel(image: list, channel: int):
    """The position of a hop's image that stands for it: the one in its own channel where the
    image hop repeats across channels, else the image's only position (None: ambiguous)."""
    same = [position for position in image if position[0] == channel]
    return same[0] if same else (image[0] if len(image) == 1 else None)


def _closed(group: tuple[int, ...], to_origin, moved) -> bool:
    """Every member's shift to its orbit's simulated rank maps the group onto itself: then the
    pairs the simulated members send stand for every pair of the group, one per orbit, and its
    all-to-all ends with theirs (an EP group under the quotient: rail_symmetry.py
    present_pairs)."""
    members = set(group)
    return all(moved(b, to_origin(a)) in members for a in group for b in group)


def quotient(graph: nx.DiGraph, executed: list[Owner], to_origin,
             moved) -> tuple[dict, dict] | None:
    """(link representatives, group -> its ring piece) for the executed ring groups, or None
    where a group has no piece (the caller then loads images instead). `to_origin(rank)`: the
    shift taking a rank to its orbit's simulated rank; `moved(rank, shift)`: its image."""
    pieces = {}
    for kind, ranks in executed:
        if kind == "ep" and not _closed(ranks, to_origin, moved):
            return None
        if kind == "p2p" or ranks in pieces:
            continue
        piece = ring_piece(ranks, graph.graph["gpus_per_node"], to_origin, moved)
        if piece is None:
            return None
        pieces[ranks] = piece
    return link_representatives(graph, to_origin, moved), pieces
