"""An all-to-all's hops per link in closed form: O(members) links, not O(members²) routes.

Every ordered pair (a, b) of an EP group sends directly (shortcuts/traffic.py owner_routes) on
its route (cluster/topology.py _structural_route). Of that route only the first and the last
link can bind (shortcuts/traffic.py can_bind: the rest touch a spine): a's NVLink port up and
b's down where a and b share a node, else a's NIC up and b's down (the leaf of b's rail and
unit). So a's port carries one hop per peer on its node, a's NIC one per peer off it, and the
same down for b: counts that need one link per member and kind, not one route per pair (the
links named from the GPUs' own, shortcuts/route_ends.py).
docs/shortcuts.md, "The traffic and its links"; tests/test_a2a_links.py takes the pair-by-pair
listing as its oracle, link order included (the clash order names a refusal's first link).
"""

import networkx as nx

from simsp.shortcuts.route_ends import hop_ends

Edge = tuple[str, str]


def all_to_all_links(graph: nx.DiGraph, ranks: tuple[int, ...]) -> list[tuple[Edge, int]]:
    """(link, hops) for every link that can bind under the all-to-all of `ranks` (rank r on
    GPU r), in the order the pair-by-pair listing (a over ranks, then b) first crosses it."""
    per_node, segment = graph.graph["gpus_per_node"], hop_ends(graph).segment
    nodes = [rank // per_node for rank in ranks]  # shape (members,)
    members: dict[int, list[int]] = {}  # node -> its members' indices, in order
    for index, node in enumerate(nodes):
        members.setdefault(node, []).append(index)
    first_off = next((i for i, node in enumerate(nodes) if node != nodes[0]), None)
    events = []  # ((row, column, 0 up | 1 down), link, hops): the pair that first crosses it
    for index, node in enumerate(nodes):
        mates = [i for i in members[node][:2] if i != index]  # its first peer on its node
        same = len(members[node]) - 1
        first_away = 0 if node != nodes[0] else first_off  # its first peer off its node
        for peer, hops in ((mates[0] if same else None, same),
                           (first_away, len(ranks) - 1 - same)):
            if hops:  # peer: the first to send to it and the first it sends to, of this kind
                up = segment(ranks[index], ranks[peer])[0]
                down = segment(ranks[peer], ranks[index])[1]
                events += [((index, peer, 0), up, hops), ((peer, index, 1), down, hops)]
    return [(link, hops) for _, link, hops in sorted(events)]
