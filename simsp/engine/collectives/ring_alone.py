"""A ring collective alone on its links: its exact time and stats, cheaply.

Alone, a ring whose links each carry at most one of its hops drains every hop at a constant
rate, so the closed form (engine/collectives/ring_timing.py: every step as long as its slowest hop) is the
step-by-step time: the max-plus recurrence of the ring's per-rank dataflow grows by the slowest
hop each step. A ring whose channels share a link (NCCL's rail channels on one NVLink port,
docs/shortcuts.md) is not so: where the hops sharing a port have unequal latencies the channels
drift out of step and the port carries one channel's bytes while another waits out its latency,
which the closed form cannot see. Such a ring is run step by step, alone in a private
simulation, and callers keep its stats for every later call of the same collective on the same
group and size. Where its channels and nodes are alike (every node holds the group's members at
the same GPUs, every chunk slice is equal) the symmetry makes that simulation small: channel c
is channel 0 rotated by c members inside every node, so every NVLink port of a node carries one
copy of each of channel 0's hops of that node, and every node's piece of the ring behaves as the
first node's. One node's m positions of channel 0, all on one NVLink port each way and its
crossing hop on its NICs, run step by step, give the time of all k x n positions (the max-min
rates of the two problems are equal: the fair allocation is unique, hence symmetric).
"""

from collections.abc import Mapping
from dataclasses import replace

import networkx as nx
import simpy

from simsp.cluster.topology import above_leaves, hop_route
from simsp.engine.collectives.ring import (DEFAULT_ELEM_BYTES, RING_COLLECTIVES, CollectiveStats,
                                      element_count)
from simsp.engine.collectives.nccl_group import nccl_choice, wire_bytes
from simsp.engine.collectives.nccl_tuning import RING
from simsp.engine.network import Network
from simsp.engine.collectives.ring_plan import ALL_REDUCE, Channel, channel_rings, members_by_node
from simsp.engine.collectives.hop_rings import ring_phase
from simsp.engine.collectives.step_trains import lone_hop_steps
from simsp.engine.collectives.ring_timing import channel_hops, closed_form_stats, collective_time
from simsp.hardware.constants import LinkCalibration

Edge = tuple[str, str]


def channel_routes(graph: nx.DiGraph, gpus: list[int],
                   channels: list[Channel]) -> list[list[tuple[Edge, ...]]]:
    """[channel][ring position] the links of the hop from that position to the next."""
    return [[hop_route(graph, gpus[ch.order[i]], gpus[ch.order[(i + 1) % len(ch.order)]],
                       ch.via[i]) for i in range(len(ch.order))] for ch in channels]


def shares_a_link(graph: nx.DiGraph, gpus: list[int]) -> bool:
    """Do two hops of this group's ring (of one channel or of two) cross one link that can
    bind? Links above the leaves cannot where hardware/fabric.py uplinks_can_bind says so
    (leaves and pod spines at 1:1: each bundle carries as much as the links below it, which
    every route through it also crosses); on any other fabric they are counted."""
    uplinks_never_bind = not uplinks_can_bind(graph)
    seen: set[Edge] = set()
    channels = channel_rings(list(gpus), graph.graph["gpus_per_node"])
    for routes in channel_routes(graph, list(gpus), channels):
        for edges in routes:
            for edge in edges:
                if uplinks_never_bind and above_leaves(edge):
                    continue
                if edge in seen:
                    return True
                seen.add(edge)
    return False


def uplinks_can_bind(graph: nx.DiGraph) -> str:
    """Why a link above the graph's leaves can bind ("" where none can: hardware/fabric.py)."""
    fabric = graph.graph.get("fabric")
    return "" if fabric is None else fabric.uplinks_can_bind(graph.graph["nodes"])


def alone_time(collective: str, graph: nx.DiGraph, gpus: list[int], nbytes: int,
               calibration: LinkCalibration | None = None, elem_bytes: int = DEFAULT_ELEM_BYTES,
               stepwise_max_ranks: int | None = None) -> float:
    """Seconds for a collective alone on its links, run as NCCL picks it: a tree all-reduce in
    closed form (ring_timing.tree_time), a ring as alone_stats times it."""
    choice = nccl_choice(collective, graph, list(gpus), nbytes, calibration)
    if choice.algorithm != RING:
        return collective_time(collective, graph, list(gpus), nbytes, calibration, elem_bytes)
    return alone_stats(collective, graph, gpus, nbytes, calibration, elem_bytes,
                       stepwise_max_ranks).time_s


def alone_stats(collective: str, graph: nx.DiGraph, gpus: list[int], nbytes: int,
                calibration: LinkCalibration | None = None,
                elem_bytes: int = DEFAULT_ELEM_BYTES,
                stepwise_max_ranks: int | None = None) -> CollectiveStats:
    """What the ring does alone on its links, starting at 0: the closed form where no link
    carries two of its hops (exact, O(n log n)), else the ring run step by step: one node's
    piece of one channel where the symmetry allows (segment_time), one channel where only
    the channels are alike (channel_segment), else all of it (up to
    `stepwise_max_ranks` ranks; above, the closed form: an upper bound, docs/shortcuts.md)."""
    closed = closed_form_stats(collective, graph, list(gpus), nbytes, calibration, elem_bytes)
    if not shares_a_link(graph, gpus):
        return closed
    calibration = calibration or LinkCalibration()
    # a node's or a channel's piece stands for the rest only where no link above the leaves
    # binds (the pieces load none of the other nodes' uplink traffic): else the whole ring
    segment = None if uplinks_can_bind(graph) else (
        node_segment(graph, list(gpus), calibration, collective, nbytes, elem_bytes)
        or channel_segment(graph, list(gpus), calibration, collective, nbytes, elem_bytes))
    if segment is not None:
        end_s = segment_time(graph, calibration, collective, len(gpus), segment)
        return replace(closed, end_s=end_s,
                       channels=tuple(replace(c, end_s=end_s) for c in closed.channels))
    if stepwise_max_ranks is not None and len(gpus) > stepwise_max_ranks:
        return closed
    env = simpy.Environment()
    network = Network(env, graph, calibration)
    ring = env.process(RING_COLLECTIVES[collective](env, network, list(gpus), None, nbytes,
                                                    elem_bytes))
    env.run()
    return ring.value[1]


Hop = tuple[tuple[Edge, ...], float, float]  # (links, latency_s, wire bytes per step)


def node_segment(graph: nx.DiGraph, gpus: list[int], calibration: LinkCalibration,
                 collective: str, nbytes: int, elem_bytes: int, slowest_latency: bool = False,
                 one_per_node: bool = False,
                 twins: Mapping[int, int] | None = None,
                 present: frozenset[int] | None = None) -> tuple[float, list[Hop]] | None:
    """NCCL's base latency and channel 0's hops from the first node's m members on that node's
    links (every intra hop and the crossing hop's relay leg on the first member's NVLink port,
    the crossing hop then on its rail's NIC), where the ring is that symmetric: its channels
    alike (_alike_channel) and equal latencies at every node's like positions. None where it
    is not (`slowest_latency`: unequal latencies allowed, each like position taking its
    slowest, e.g. the spine hop of a ring across a leaf boundary: an approximation,
    docs/shortcuts.md; `one_per_node`: a ring of one member per node too, its piece the one
    crossing hop on the first member's own NIC, up and down: _lone_member_hop)."""
    alike = _alike_channel(graph, gpus, calibration, collective, nbytes, elem_bytes,
                           one_per_node)
    if alike is None:
        return None
    base_s, by_node, latencies, routes, chunk = alike
    m, n = len(by_node[0]), len(gpus)
    if any(latencies[p] != latencies[p % m] for p in range(n)):
        if not slowest_latency:
            return None
        latencies = [max(latencies[q] for q in range(p % m, n, m)) for p in range(n)]
    if m == 1:  # NICs at both ends (piece_divisor)
        return base_s, _lone_member_hops(graph, gpus, twins, present, routes, latencies[0], chunk)
    return base_s, _node_hops(graph, gpus, by_node[0], 0, latencies, routes, chunk)


def _lone_member_hops(graph: nx.DiGraph, gpus: list[int], twins: Mapping[int, int] | None,
                      present: frozenset[int] | None, routes: list[tuple[Edge, ...]],
                      latency_s: float, chunk: float) -> list[Hop]:
    """A ring of one member per node as its first member's hop (_lone_member_hop); or, where
    its members are placed unlike (`twins`: member -> the first placed as it is, FSDP replicas
    across a leaf boundary, shortcuts/representative.py fsdp_replicas), one hop per simulated
    member (`present`: the first of each kind), from its NIC up to the next simulated
    member's NIC down, in ring order: every simulated NIC carries one hop up and one down, as
    each NIC of the full ring does, and meets its own replica's pipeline sends, the images of
    its kind's (docs/shortcuts.md, "The audit of the mirror")."""
    order = channel_rings(gpus, graph.graph["gpus_per_node"])[0].order  # position -> member
    gpu_at = [gpus[member] for member in order]  # [position]
    if not twins or present is None or len({twins.get(g, g) for g in gpu_at}) < 2:
        return [_lone_member_hop(routes, latency_s, chunk)]
    run = [p for p, gpu in enumerate(gpu_at) if gpu in present]  # simulated positions
    return [((routes[p][0], routes[q - 1][-1]), latency_s, chunk)
            for p, q in zip(run, run[1:] + run[:1])]


def _lone_member_hop(routes: list[tuple[Edge, ...]], latency_s: float, chunk: float) -> Hop:
    """A ring of one member per node as its first member's hop: on that member's NIC up (the
    hop it sends) and down (the hop it receives, the image of the one the next member
    receives), which is where the node's other traffic (its pipeline sends) meets the ring;
    the links above the leaves never bind where pieces run (hardware/fabric.py)."""
    return (routes[0][0], routes[-1][-1]), latency_s, chunk


def channel_segment(graph: nx.DiGraph, gpus: list[int], calibration: LinkCalibration,
                    collective: str, nbytes: int,
                    elem_bytes: int) -> tuple[float, list[Hop]] | None:
    """NCCL's base latency and all n hops of channel 0, each node's on that node's first
    member's NVLink port (its crossing hop then on its rail's NICs), where the channels are
    alike but the nodes need not be (e.g. a ring across a leaf boundary, whose spine hops are
    slower): channel c is channel 0 rotated by c members inside every node, so every NVLink
    port of node k carries one copy of each of channel 0's hops of node k, and channel 0 alone
    on those ports runs as every channel does (the max-min rates of the two problems are equal:
    the fair allocation is unique, hence symmetric). None where the channels are not alike."""
    alike = _alike_channel(graph, gpus, calibration, collective, nbytes, elem_bytes)
    if alike is None:
        return None
    base_s, by_node, latencies, routes, chunk = alike
    m = len(by_node[0])
    hops: list[Hop] = []
    for node, members in enumerate(by_node):
        hops += _node_hops(graph, gpus, members, node * m, latencies, routes, chunk)
    return base_s, hops


def _alike_channel(graph: nx.DiGraph, gpus: list[int], calibration: LinkCalibration,
                   collective: str, nbytes: int, elem_bytes: int,
                   one_per_node: bool = False) -> tuple | None:
    """(NCCL's base latency, members by node, channel 0's hop latencies [position], its hops'
    links [position], a chunk's wire bytes) where the channels are alike: >= 2 nodes holding
    >= 2 members each (or, `one_per_node`, 1) at the same GPUs, one channel per member, equal
    chunk slices; else None."""
    divisor = piece_divisor(graph, gpus, one_per_node)
    count = element_count(nbytes, elem_bytes)
    if divisor is None or count % divisor:
        return None
    by_node = members_by_node(gpus, graph.graph["gpus_per_node"])
    channels = channel_rings(gpus, graph.graph["gpus_per_node"])
    m, n = len(by_node[0]), len(gpus)
    choice = nccl_choice(collective, graph, gpus, nbytes, calibration, RING)
    latencies = [latency for latency, _rate in channel_hops(graph, gpus, channels[:1],
                                                            calibration, choice)[0]]
    routes = channel_routes(graph, gpus, channels[:1])[0]  # [position] links of its hop
    chunk = wire_bytes(count // (n * m) * elem_bytes, choice)
    return choice.base_latency_s, by_node, latencies, routes, chunk


def piece_divisor(graph: nx.DiGraph, gpus: list[int], one_per_node: bool = False) -> int | None:
    """n·m, what every chunk's element count must divide by for the ring to run as one node's
    piece of one channel (_alike_channel, node_segment), where its group allows it: >= 2 nodes
    holding m >= 2 members each (or, `one_per_node`, 1, the crossing hop then leaving and
    entering through NICs) at the same GPUs, so one channel per member; else None. It depends
    on the group alone, so a check of many sizes works it out once (shortcuts/check.py)."""
    per_node = graph.graph["gpus_per_node"]
    by_node = members_by_node(gpus, per_node)
    shapes = {tuple(gpus[member] % per_node for member in members) for members in by_node}
    m, n = len(by_node[0]), len(gpus)
    if len(by_node) < 2 or m < 2 - one_per_node or len(shapes) != 1:
        return None  # m < 2: one member per node, no NVLink port to stand for the node
    if m == 1:
        channel = channel_rings(gpus, per_node)[0]
        order = channel.order
        hop = _lone_member_hop([hop_route(graph, gpus[order[p]], gpus[order[(p + 1) % n]],
                                          channel.via[p]) for p in (0, n - 1)], 0.0, 0.0)
        if not all(any(end.startswith("leaf") for end in edge) for edge in hop[0]):
            return None
    return n * m


def _node_hops(graph: nx.DiGraph, gpus: list[int], members: list[int], first: int,
               latencies: list[float], routes: list[tuple[Edge, ...]], chunk: float) -> list[Hop]:
    """One node's m hops of channel 0 (positions first .. first + m - 1), on its first
    member's NVLink port; the last, crossing to the next node, then on its rail's NICs."""
    port = hop_route(graph, gpus[members[0]], gpus[members[1]])
    up, down = port[0], port[-1]  # the first member's NVLink uplink and downlink
    last = first + len(members) - 1  # the node's crossing position
    crossing = (up, down) + tuple(e for e in routes[last] if graph.edges[e]["kind"] == "ib")
    hops = [((up, down), latencies[p], chunk) for p in range(first, last)]
    return hops + [(crossing, latencies[last], chunk)]


def segment_time(graph: nx.DiGraph, calibration: LinkCalibration, collective: str, n: int,
                 segment: tuple[float, list[Hop]]) -> float:
    """The ring's time alone, from one node's piece of one channel run step by step (ring
    position m-1 sends to position 0: the next node's, which behaves as this one's): NCCL's
    base latency, then each phase's n-1 steps, every position sending one chunk per step and
    going on when its own and its predecessor's are delivered (engine/collectives/ring.py)."""
    env = simpy.Environment()
    network = Network(env, graph, calibration)
    process = env.process(segment_run(env, network, collective, n, segment))
    env.run()
    return process.value


def segment_run(env: simpy.Environment, network: Network, collective: str, n: int,
                segment: tuple[float, list[Hop]]):
    """Base latency, then the phases one after another (a phase ends when every position has
    its last chunk, as _run_channels waits for every channel): a process body, on a private
    network (segment_time) or on one shared with the group's other collectives."""
    base_s, hops = segment
    if base_s > 0:
        yield env.timeout(base_s)
    phases = 2 if collective == ALL_REDUCE else 1
    if len(hops) == 1:  # one position: its steps one after another, phase after phase
        yield from lone_hop_steps(env, network, hops[0], phases * (n - 1))
        return env.now
    for _phase in range(phases):  # in arithmetic while its links allow (hop_rings.py)
        yield from ring_phase(env, network, hops, n - 1)
    return env.now
