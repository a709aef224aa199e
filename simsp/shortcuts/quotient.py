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
per orbit of its hops. docs/shortcuts.md, "Rings as their pieces".
"""

import networkx as nx

from simsp.engine.collectives.ring_piece import RingPiece
from simsp.engine.collectives.ring_plan import channel_rings
from simsp.shortcuts.traffic import Edge, Owner, can_bind, gpu_of_link

Hop = tuple[int, int, int | None]  # (src GPU, dst GPU, relaying GPU or None)


def _role(edge: Edge) -> tuple[bool, str]:
    """What a binding link is to its GPU: (leaves it, the kind of the far end)."""
    far = edge[1] if edge[0].startswith("gpu") else edge[0]
    return edge[0].startswith("gpu"), "nvswitch" if far.endswith("nvswitch") else "leaf"


def link_representatives(graph: nx.DiGraph, simulated: set[int],
                         shifts: list[tuple[int, ...]]) -> dict[Edge, Edge]:
    """Every binding link of a GPU -> the link of the same role of the simulated GPU in its
    orbit (the shift mapping that GPU to it is unique: H acts freely)."""
    rep_of = {shift[rank]: rank for shift in shifts for rank in simulated}  # GPU -> orbit's
    by_role: dict[int, dict] = {}
    for edge in graph.edges:
        if can_bind(edge):
            by_role.setdefault(gpu_of_link(edge), {})[_role(edge)] = edge
    return {edge: by_role[rep_of[gpu]][role] for gpu, roles in by_role.items()
            if gpu in rep_of for role, edge in roles.items()}


def ring_piece(group: tuple[int, ...], gpus_per_node: int, simulated: set[int],
               shifts: list[tuple[int, ...]]) -> RingPiece | None:
    """The piece of a ring group: its hops sent by simulated members (every channel), each
    waiting on the executed hop whose image its predecessor's hop is; None where some hop of
    the ring is no executed hop's image under exactly one of them."""
    gpus = list(group)
    channels = channel_rings(gpus, gpus_per_node)
    n = len(gpus)
    hops = {(gpus[ch.order[p]], gpus[ch.order[(p + 1) % n]], ch.via[p]): (c, p)
            for c, ch in enumerate(channels) for p in range(n)}  # hop -> (channel, position)
    executed = [position for hop, position in hops.items() if hop[0] in simulated]
    index = {position: i for i, position in enumerate(executed)}
    source: dict[tuple[int, int], int] = {}  # every position -> executed one standing for it
    by_position = {position: hop for hop, position in hops.items()}
    for i, position in enumerate(executed):
        src, dst, via = by_position[position]
        for shift in shifts:
            image = hops.get((shift[src], shift[dst], None if via is None else shift[via]))
            if image is not None and source.setdefault(image, i) != i:
                return None
    if len(source) != len(hops):
        return None
    return RingPiece(tuple(executed), tuple(source[(c, (p - 1) % n)] for c, p in executed))


def quotient(graph: nx.DiGraph, executed: list[Owner], simulated: set[int],
             shifts: list[tuple[int, ...]]) -> tuple[dict, dict] | None:
    """(link representatives, group -> its ring piece) for the executed ring groups, or None
    where a group has no piece (the caller then loads images instead)."""
    pieces = {}
    for kind, ranks in executed:
        if kind == "p2p" or ranks in pieces:
            continue
        piece = ring_piece(ranks, graph.graph["gpus_per_node"], simulated, shifts)
        if piece is None:
            return None
        pieces[ranks] = piece
    return link_representatives(graph, simulated, shifts), pieces
