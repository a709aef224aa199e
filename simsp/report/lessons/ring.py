"""The ring lesson's model: one ring collective's every step (sends and holdings), the hop that
sets each step's time with the numbers of its formula, the channels with their rails and PXN
relays, and all-reduce against reduce-scatter + all-gather. It is rendered three ways: the text
of `simsp ring --explain` (ring_text.py), the teaching page (ring_page.py) and the slides
(ring_slides.py).

Steps and holdings come from engine/collectives/ring_plan.py; each step lasts as long as its
slowest hop of its slowest channel, the ring's step latency (NCCL's own, pipelined: docs/nccl.md)
+ bytes ÷ (link bandwidth × efficiency ÷ hops sharing the link), as
engine/collectives/ring_timing.py prices it (docs/MODEL.md#collectives,
#runtime-mechanisms).
"""

from simsp.cluster.topology import build_topology, hop_route
from simsp.scenario.config import Cluster
from simsp.engine.collectives import ring_timing
from simsp.engine.collectives.nccl_group import nccl_choice
from simsp.engine.collectives.nccl_tuning import RING
from simsp.engine.collectives.ring_plan import (ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, STEPS,
                                                apply_step, bytes_sent_per_rank, channel_rings,
                                                chunk_counts, initial_holdings, slice_counts)
from simsp.hardware.constants import LinkCalibration
from simsp.units import format_bytes


MAX_LESSON_RANKS = 16
NAMES = {ALL_REDUCE: "all-reduce", REDUCE_SCATTER: "reduce-scatter", ALL_GATHER: "all-gather"}
LINKS = {"nvlink": "NVLink", "ib": "InfiniBand"}


def microseconds(seconds: float) -> str:
    """Every time of the lesson, one unit: '575.58 µs'."""
    return f"{seconds * 1e6:,.2f} µs"


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------

def lesson_channels(graph, gpus: list[int]) -> list[dict]:
    """[{index, order (ring positions -> member), rail, via, hops}] of the group's NCCL channels;
    hops[p] is the link kind of position p's outgoing hop ('InfiniBand' if it leaves the node)."""
    channels = []
    for ch in channel_rings(list(gpus), graph.graph["gpus_per_node"]):
        n = len(ch.order)
        kinds = []
        for p in range(n):
            edges = hop_route(graph, gpus[ch.order[p]], gpus[ch.order[(p + 1) % n]], ch.via[p])
            kinds.append("InfiniBand" if any(graph.edges[e]["kind"] == "ib" for e in edges)
                         else "NVLink")
        channels.append({"index": ch.index, "order": list(ch.order), "rail": ch.rail,
                         "via": list(ch.via), "hops": kinds})
    return channels


def _link_loads(graph, gpus: list[int], channels) -> tuple[list, dict]:
    """Every channel's hop routes [channel][position] and how many hops cross each link."""
    routes = [[hop_route(graph, gpus[ch.order[p]], gpus[ch.order[(p + 1) % len(ch.order)]],
                         ch.via[p]) for p in range(len(ch.order))] for ch in channels]
    load: dict = {}
    for edge in (e for channel in routes for hop in channel for e in hop):
        load[edge] = load.get(edge, 0) + 1
    return routes, load


def step_derivations(collective: str, graph, gpus: list[int], nbytes: int, elem_bytes: int,
                     calibration: LinkCalibration) -> list[dict]:
    """For every step, the hop that sets its time (the slowest send of the slowest channel) and
    its formula's numbers: bytes, the bottleneck link's bandwidth, efficiency and sharing, the
    ring's step latency."""
    n = len(gpus)
    counts = chunk_counts(nbytes // elem_bytes, n)
    channels = channel_rings(list(gpus), graph.graph["gpus_per_node"])
    choice = nccl_choice(collective, graph, gpus, nbytes, calibration, RING)
    hops = ring_timing.channel_hops(graph, list(gpus), channels, calibration, choice)  # [ch][p]
    routes, load = _link_loads(graph, gpus, channels)
    slices = [[s * elem_bytes for s in slice_counts(counts, len(channels), ch.index)]
              for ch in channels]  # [ch][member] bytes of its slice of each chunk
    derivations = []
    for step in STEPS[collective](n):
        time_s, ch, send = max(((hops[ch.index][s.src][0] + slices[ch.index][ch.order[s.chunk]]
                                 / hops[ch.index][s.src][1], ch, s)
                                for ch in channels for s in step.sends), key=lambda c: c[0])
        derivations.append(_derivation(graph, gpus, ch, send, time_s, routes, load,
                                       slices[ch.index][ch.order[send.chunk]], calibration,
                                       hops[ch.index][send.src][0], choice))
    return derivations


def _derivation(graph, gpus, ch, send, time_s, routes, load, nbytes, calibration,
                latency_s, choice) -> dict:
    """One step's slowest hop: where it goes, over what, and its time as a formula (at the
    protocol NCCL picks, docs/nccl.md: its share of the link's rate, and the ring's pipelined
    step latency from NCCL's own per-step latencies)."""
    edges = routes[ch.index][send.src]
    bottleneck = min(edges, key=lambda e: graph.edges[e]["bandwidth_Bps"]
                     * calibration.efficiency(graph.edges[e]["kind"]) / load[e])
    kind = graph.edges[bottleneck]["kind"]
    bandwidth_GBps = graph.edges[bottleneck]["bandwidth_Bps"] / 1e9
    efficiency, sharing = calibration.efficiency(kind), load[bottleneck]
    fraction = choice.bandwidth_fraction
    shared = f" ÷ {sharing}" if sharing > 1 else ""
    protocol = f" × {fraction:.3g} {choice.protocol}" if fraction != 1.0 else ""
    latency = f"{microseconds(latency_s)} {choice.label()} step"
    formula = (f"{microseconds(time_s)} = {format_bytes(nbytes)} ÷ ({bandwidth_GBps:g} GB/s × "
               f"{efficiency:g}{shared}{protocol}) + {latency}")
    via = ch.via[send.src]
    return {"channel": ch.index, "src": gpus[ch.order[send.src]],
            "dst": gpus[ch.order[send.dst]], "via": via, "link": LINKS[kind], "bytes": nbytes,
            "bandwidth_GBps": bandwidth_GBps, "efficiency": efficiency, "sharing": sharing,
            "latency_s": latency_s, "protocol": choice.protocol, "protocol_fraction": fraction,
            "time_s": time_s, "formula": formula}


def _holdings(holdings) -> list[list[list[int]]]:
    """Holdings as JSON: [position][chunk] -> sorted contributing positions."""
    return [[sorted(cell) for cell in row] for row in holdings]


def lesson_steps(collective: str, n: int, chunk_bytes: list[int], derivations: list) -> list:
    """Every step: phase, index, sends [src, dst, chunk], bytes each rank sends, modelled time,
    the hop that sets it, and what every position holds afterwards."""
    holdings, out = initial_holdings(collective, n), []
    for step, hop in zip(STEPS[collective](n), derivations):
        holdings = apply_step(holdings, step)
        out.append({"phase": step.phase, "index": step.index,
                    "sends": [[s.src, s.dst, s.chunk] for s in step.sends],
                    "bytes_per_rank": max(chunk_bytes[s.chunk] for s in step.sends),
                    "time_s": hop["time_s"], "hop": hop, "holdings": _holdings(holdings)})
    return out


def comparison(graph, gpus: list[int], nbytes: int, elem_bytes: int,
               calibration: LinkCalibration) -> dict:
    """All-reduce against reduce-scatter + all-gather of the same S: bytes per rank and time."""
    n = len(gpus)
    chunk_bytes = [c * elem_bytes for c in chunk_counts(nbytes // elem_bytes, n)]
    times = {c: max(sum(channel) for channel in ring_timing.step_times(
        c, graph, gpus, nbytes, calibration, elem_bytes))
        for c in (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER)}  # the ring's steps, as the page
    base = {c: nccl_choice(c, graph, gpus, nbytes, calibration, RING).base_latency_s
            for c in (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER)}
    sent = {c: max(bytes_sent_per_rank(STEPS[c](n), chunk_bytes))
            for c in (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER)}
    return {"time_s": times, "base_latency_s": base, "bytes_sent_per_rank": sent, "steps": {
        ALL_REDUCE: 2 * (n - 1), REDUCE_SCATTER: n - 1, ALL_GATHER: n - 1}}


def call_time(collective: str, graph, gpus: list[int], nbytes: int,
              calibration: LinkCalibration, steps: list[dict]) -> dict:
    """The one derivation of the call's time and channels every view shows: NCCL's channels
    for the ring at this size (`nccl_channels`, the table's nch; their rings take the lesson's
    `channels` orders), the steps' sum, NCCL's base latency paid once per call, and their
    total `call_s`: `simsp ring`'s time when NCCL runs a ring (engine/collectives/nccl_tests.py);
    `nccl_algorithm` is what NCCL would pick at this size (the lesson always shows the ring)."""
    ring = nccl_choice(collective, graph, gpus, nbytes, calibration, RING)
    picked = nccl_choice(collective, graph, gpus, nbytes, calibration)
    steps_s = sum(step["time_s"] for step in steps)
    return {"nccl_channels": ring.nchannels, "protocol": ring.protocol, "steps_s": steps_s,
            "base_latency_s": ring.base_latency_s, "call_s": steps_s + ring.base_latency_s,
            "nccl_algorithm": picked.algorithm}


def channel_words(nch: int, orders: int) -> str:
    """`16 NCCL channels on 8 ring orders (2 channels per order)`: the table's nch and the
    rings simsp moves the bytes over, in the same words in the text, the page and the table
    (on one node every order crosses the same NVSwitch, so one order stands for them all)."""
    if nch >= orders and nch % orders == 0:
        share = f"{nch // orders} channel{'s' if nch // orders > 1 else ''} per order"
    else:
        share = f"the bytes spread over the orders at the rate of {nch} channels"
    return (f"{nch} NCCL channel{'s' if nch > 1 else ''} on {orders} ring "
            f"order{'s' if orders > 1 else ''} ({share})")


def call_times(compare: dict) -> dict:
    """{collective: seconds of one whole call}: its ring steps and NCCL's base latency."""
    return {kind: compare["time_s"][kind] + compare["base_latency_s"][kind]
            for kind in compare["time_s"]}


def call_note(data: dict) -> str:
    """Whether the `simsp ring` table times this call: yes when NCCL runs a ring at this size,
    else it times what NCCL runs (the lesson always shows the ring)."""
    if data["nccl_algorithm"] == RING:
        return "the simsp ring table's time"
    return (f"the ring shown here; NCCL would run a {data['nccl_algorithm']} at this size, "
            "which the simsp ring table times")


def one_node_step(collective: str, gpus_per_node: int, nbytes: int, elem_bytes: int,
                  calibration: LinkCalibration) -> dict:
    """The first step of the same collective and S on one node's GPUs: the 2-node page's
    contrast (a smaller chunk, split over channels and NICs, can make a 2-node step faster)."""
    gpus = list(range(gpus_per_node))
    graph = build_topology(Cluster(nodes=1, gpus_per_node=gpus_per_node))
    return step_derivations(collective, graph, gpus, nbytes, elem_bytes, calibration)[0]


def lesson_data(collective: str, graph, gpus: list[int], nbytes: int, elem_bytes: int = 4,
                calibration: LinkCalibration | None = None) -> dict:
    """Everything the text, the page and the slides show, JSON-ready."""
    calibration = calibration or LinkCalibration()
    n, per_node = len(gpus), graph.graph["gpus_per_node"]
    chunk_bytes = [c * elem_bytes for c in chunk_counts(nbytes // elem_bytes, n)]
    derivations = step_derivations(collective, graph, gpus, nbytes, elem_bytes, calibration)
    nodes = len({g // per_node for g in gpus})
    steps = lesson_steps(collective, n, chunk_bytes, derivations)
    data = {"collective": collective, "ranks": n, "gpus": list(gpus), "nodes": nodes,
            "gpus_per_node": per_node, "size_bytes": nbytes, "elem_bytes": elem_bytes,
            "chunk_bytes": chunk_bytes, "calibration": calibration.describe(),
            "channels": lesson_channels(graph, gpus),
            "start": _holdings(initial_holdings(collective, n)), "steps": steps,
            "compare": comparison(graph, gpus, nbytes, elem_bytes, calibration),
            **call_time(collective, graph, gpus, nbytes, calibration, steps)}
    if nodes > 1:
        data["one_node"] = one_node_step(collective, per_node, nbytes, elem_bytes, calibration)
    return data


def lesson_title(data: dict) -> str:
    """'Ring all-reduce of 1.00 MiB over 4 ranks (1 node)'."""
    return (f"Ring {NAMES[data['collective']]} of {format_bytes(data['size_bytes'])}"
            f" over {data['ranks']} ranks ({data['nodes']} node{'s' if data['nodes'] > 1 else ''})")


def hop_path(hop: dict) -> str:
    """'gpu7 → gpu0 (NVLink, PXN) → gpu8' for a relayed hop, 'gpu3 → gpu4' for a direct one."""
    if hop["via"] is None:
        return f"gpu{hop['src']} → gpu{hop['dst']}"
    return f"gpu{hop['src']} → gpu{hop['via']} (NVLink, PXN) → gpu{hop['dst']}"
