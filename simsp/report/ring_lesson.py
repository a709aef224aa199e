"""The ring lesson: one model of a ring collective (every step's sends and holdings, the hop that
sets each step's time with the numbers of its formula, the channels with their rails and PXN
relays, all-reduce against reduce-scatter + all-gather), rendered three ways: the text of `simsp
ring --explain`, the teaching page (report/ring_lesson_page.py) and the slides.

Steps and holdings come from engine/collectives/ring_plan.py; each step lasts as long as its slowest hop of
its slowest channel, latency + bytes ÷ (link bandwidth × efficiency ÷ hops sharing the link), as
engine/collectives/ring_timing.py prices it (docs/MODEL.md#collectives, #runtime-mechanisms).
"""

import colorsys
import io
from pathlib import Path

import numpy as np

from simsp.cluster.topology import build_topology, hop_route
from simsp.scenario.config import Cluster
from simsp.engine.collectives import ring_timing
from simsp.engine.collectives.nccl_group import hop_latency_scale, nccl_choice
from simsp.engine.collectives.nccl_tuning import RING
from simsp.engine.collectives.ring_plan import (ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, STEPS, apply_step,
                                    bytes_sent_per_rank, channel_rings, chunk_counts,
                                    chunk_offsets, initial_holdings, slice_counts)
from simsp.hardware.constants import LinkCalibration
from simsp.io_out import write_file
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
    route's latency."""
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
    protocol NCCL picks, docs/nccl.md: its share of the link's rate and latency factor)."""
    edges = routes[ch.index][send.src]
    bottleneck = min(edges, key=lambda e: graph.edges[e]["bandwidth_Bps"]
                     * calibration.efficiency(graph.edges[e]["kind"]) / load[e])
    kind = graph.edges[bottleneck]["kind"]
    bandwidth_GBps = graph.edges[bottleneck]["bandwidth_Bps"] / 1e9
    efficiency, sharing = calibration.efficiency(kind), load[bottleneck]
    fraction, scale = choice.bandwidth_fraction, hop_latency_scale(graph, edges, choice)
    shared = f" ÷ {sharing}" if sharing > 1 else ""
    protocol = f" × {fraction:.3g} {choice.protocol}" if fraction != 1.0 else ""
    latency = (f"{microseconds(latency_s / scale)} × {scale:.3g} {choice.protocol}"
               if scale != 1.0 else microseconds(latency_s))
    formula = (f"{microseconds(time_s)} = {format_bytes(nbytes)} ÷ ({bandwidth_GBps:g} GB/s × "
               f"{efficiency:g}{shared}{protocol}) + {latency}")
    via = ch.via[send.src]
    return {"channel": ch.index, "src": gpus[ch.order[send.src]],
            "dst": gpus[ch.order[send.dst]], "via": via, "link": LINKS[kind], "bytes": nbytes,
            "bandwidth_GBps": bandwidth_GBps, "efficiency": efficiency, "sharing": sharing,
            "latency_s": latency_s, "protocol": choice.protocol, "protocol_fraction": fraction,
            "latency_scale": scale, "time_s": time_s, "formula": formula}


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
    data = {"collective": collective, "ranks": n, "gpus": list(gpus), "nodes": nodes,
            "gpus_per_node": per_node, "size_bytes": nbytes, "elem_bytes": elem_bytes,
            "chunk_bytes": chunk_bytes, "calibration": calibration.describe(),
            "channels": lesson_channels(graph, gpus),
            "start": _holdings(initial_holdings(collective, n)),
            "steps": lesson_steps(collective, n, chunk_bytes, derivations),
            "compare": comparison(graph, gpus, nbytes, elem_bytes, calibration)}
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


# ---------------------------------------------------------------------------------------------
# The text (`simsp ring --explain`)
# ---------------------------------------------------------------------------------------------

def lesson_text(data: dict) -> list[str]:
    """Every step of the ring: what each rank sends, receives, reduces and then holds, the step's
    modelled time with the hop that sets it, then the bytes and the AR = RS + AG time line."""
    collective, n = data["collective"], data["ranks"]
    steps = data["steps"]
    lines = _text_intro(data)
    lines += ["start"] + [f"  rank {p}: holds {_holds(row, n)}"
                          for p, row in enumerate(data["start"])]
    for overall, step in enumerate(steps):
        title = f"{step['phase']} step {step['index'] + 1}/{n - 1}"
        if collective == ALL_REDUCE:
            title += f"  (all_reduce step {overall + 1}/{len(steps)})"
        lines.append(title + f"  time {step['time_s'] * 1e6:.3f} us")
        lines.append(f"  slowest hop {_ascii(hop_path(step['hop']))}, channel "
                     f"{step['hop']['channel']}, {step['hop']['link']}: "
                     f"{_ascii(step['hop']['formula'])}")
        lines += [_rank_line(step, p, n) for p in range(n)]
    return lines + _text_summary(data) + _time_lines(data)


def _ascii(text: str) -> str:
    """The terminal text's spelling of the page's symbols."""
    return text.replace("µs", "us").replace("÷", "/").replace("×", "x").replace("→", "->")


def _text_intro(data: dict) -> list[str]:
    """The message, its chunks and the notation."""
    n, counts = data["ranks"], [b // data["elem_bytes"] for b in data["chunk_bytes"]]
    ring = " -> ".join(str(r) for r in range(n)) + " -> 0"
    chunks = ", ".join(f"c{c} = [{o}, {o + k})" for c, (o, k)
                       in enumerate(zip(chunk_offsets(counts), counts)))
    return [f"{data['collective']} of {data['size_bytes']} B ({sum(counts)} float elements) "
            f"over {n} ranks, ring {ring}",
            f"chunks (elements): {chunks}",
            "notation: cK=a+b: the rank's copy of chunk K holds the sum of ranks a and b's data;"
            " all = summed over every rank; - = not held"]


def _rank_line(step: dict, rank: int, n: int) -> str:
    """One rank at one step: send, receive, reduce or copy, and what it holds afterwards."""
    out = next(s for s in step["sends"] if s[0] == rank)
    into = next(s for s in step["sends"] if s[1] == rank)
    action = "reduce" if step["phase"] == REDUCE_SCATTER else "copy"
    return (f"  rank {rank}: send c{out[2]} to {out[1]}, recv c{into[2]} from {into[0]}, "
            f"{action} c{into[2]} | holds {_holds(step['holdings'][rank], n)}")


def _holds(row, n: int) -> str:
    """A rank's chunks in the cK=a+b notation."""
    def name(contributors) -> str:
        """'-', 'all', or the contributing ranks joined by '+'."""
        if not contributors:
            return "-"
        if len(contributors) == n and n > 1:
            return "all"
        return "+".join(str(r) for r in sorted(contributors))
    return " ".join(f"c{c}={name(who)}" for c, who in enumerate(row))


def _text_summary(data: dict) -> list[str]:
    """Bytes each rank sent, and for all-reduce how it splits into its two phases."""
    collective, n, nbytes = data["collective"], data["ranks"], data["size_bytes"]
    sent = bytes_sent_per_rank(STEPS[collective](n), data["chunk_bytes"])
    if collective != ALL_REDUCE:
        return [f"{n - 1} steps; bytes sent per rank {sent} ((n-1)/n*S = "
                f"{(n - 1) * nbytes / n:g})"]
    first = bytes_sent_per_rank(STEPS[REDUCE_SCATTER](n), data["chunk_bytes"])
    second = bytes_sent_per_rank(STEPS[ALL_GATHER](n), data["chunk_bytes"])
    return [f"all_reduce = reduce_scatter (steps 1-{n - 1}) then all_gather (steps {n}-"
            f"{2 * (n - 1)}): 2(n-1) = {2 * (n - 1)} steps",
            f"bytes sent per rank {sent} = reduce_scatter {first} + all_gather {second} "
            f"(2(n-1)/n*S = {2 * (n - 1) * nbytes / n:g})"]


def _time_lines(data: dict) -> list[str]:
    """Channels, and the all-reduce's time against reduce-scatter + all-gather."""
    compare = data["compare"]
    ar, rs, ag = (compare["time_s"][c] + compare["base_latency_s"][c]
                  for c in (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER))  # whole calls
    channels, lines = len(data["channels"]), []
    if channels > 1:
        lines.append(f"runs as {channels} channels (NCCL rings, one per rail), each carrying a "
                     f"1/{channels} slice of every chunk; the plan above is each channel's in "
                     f"ring positions (its GPU order: the channel table below); a step's time "
                     f"is its slowest channel's")
    lines.append(f"time: all_reduce {ar * 1e6:.3f} us = reduce_scatter {rs * 1e6:.3f} us + "
                 f"all_gather {ag * 1e6:.3f} us ({(rs + ag) * 1e6:.3f} us, difference "
                 f"{(ar - rs - ag) * 1e6:+.3f} us): the same 2(n-1) steps and bytes; each call "
                 f"pays NCCL's base latency once "
                 f"({compare['base_latency_s'][ALL_REDUCE] * 1e6:.3f} us for the all-reduce), "
                 f"so as two calls RS + AG pay it twice")
    return lines


# ---------------------------------------------------------------------------------------------
# The slides (matplotlib, Agg): one PNG per step and one comparing AR with RS + AG
# ---------------------------------------------------------------------------------------------

def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or None when matplotlib is missing
    (the slides are drawn with pyplot; the run report uses drawing.new_figure)."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def pyplot_png(plt, fig) -> bytes:
    """A pyplot figure as PNG bytes with no varying metadata, then closed."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def cell_color(chunk: int, held: int, n: int, gather: bool) -> tuple:
    """The chunk's hue; darker the more ranks it sums (white when not held). As the page."""
    if held == 0:
        return (1.0, 1.0, 1.0)
    light = 0.55 if gather else 0.90 - 0.48 * (held - 1) / max(n - 1, 1)
    return colorsys.hls_to_rgb(chunk / n, light, 0.65)


def _ring(ax, data: dict, step: dict | None) -> None:
    """Ranks on a circle (colour: node), channel 0's hops, and this step's sends as arrows."""
    n, channel = data["ranks"], data["channels"][0]
    angles = np.pi / 2 - 2 * np.pi * np.arange(n) / n  # (n,) clockwise from the top, as the page
    xy = np.stack([np.cos(angles), np.sin(angles)], axis=1)  # (n, 2)
    position = {data["gpus"][m]: p for p, m in enumerate(channel["order"])}
    _ring_hops(ax, channel, xy, position)
    _ring_sends(ax, channel, xy, position, step["sends"] if step else [])
    for p in range(n):
        node = data["gpus"][channel["order"][p]] // data["gpus_per_node"]
        ax.scatter(*xy[p], s=520, color="#fde9d9" if node % 2 else "#dde8f6",
                   edgecolors="#34495e", zorder=2)
        ax.text(*xy[p], f"r{channel['order'][p]}", ha="center", va="center", fontsize=9,
                zorder=3)
    ax.set_xlim(-1.3, 1.3)
    ax.set_ylim(-1.3, 1.3)
    ax.set_aspect("equal")
    ax.axis("off")


def _ring_hops(ax, channel: dict, xy: np.ndarray, position: dict) -> None:
    """NVLink hops grey, InfiniBand hops red dashed, a PXN-relayed hop drawn as its NVLink leg
    (dotted) to the relaying GPU, then its InfiniBand leg from that GPU's NIC."""
    n = len(xy)
    for p in range(n):
        a, b = xy[p], xy[(p + 1) % n]
        via = channel["via"][p]
        if via is not None:  # NVLink to the relay, then the relay's NIC across
            r = xy[position[via]]
            ax.plot([a[0], 0.55 * (a[0] + r[0]), r[0]], [a[1], 0.55 * (a[1] + r[1]), r[1]],
                    color="#7f8c8d", linewidth=1.5, linestyle=":", zorder=1)
            a = r
        ib = channel["hops"][p] == "InfiniBand"
        if ib:  # each direction of a NIC-to-NIC leg beside the other
            normal = np.array([-(b - a)[1], (b - a)[0]]) / np.linalg.norm(b - a)  # (2,)
            a, b = a + 0.025 * normal, b + 0.025 * normal
        ax.plot([a[0], b[0]], [a[1], b[1]], color="#d62728" if ib else "#9aa5b1",
                linestyle="--" if ib else "-", linewidth=3 if ib else 1.5, zorder=1)


def _ring_sends(ax, channel: dict, xy: np.ndarray, position: dict, sends: list) -> None:
    """This step's sends as chunk-coloured arrows, a relayed one through its relay."""
    n = len(xy)
    for src, dst, chunk in sends:
        a, b = 0.78 * xy[src], 0.78 * xy[dst]
        color = colorsys.hls_to_rgb(chunk / n, 0.4, 0.65)
        if channel["via"][src] is not None:  # relayed: to the relay first (PXN), then across
            relay = 0.78 * xy[position[channel["via"][src]]]
            ax.plot([a[0], relay[0]], [a[1], relay[1]], color=color, linewidth=2)
            a = relay
        ax.annotate("", xy=b, xytext=a, arrowprops={"arrowstyle": "-|>", "linewidth": 2,
                    "color": color})
        ax.text(*(0.62 * (xy[src] + xy[dst]) / 2), f"c{chunk}", color=color, fontsize=8,
                ha="center", va="center")


def _grid(ax, data: dict, holdings: list, received: list) -> None:
    """The rank x chunk grid: coloured cells, 'all' where a chunk sums every rank."""
    from matplotlib.patches import Rectangle
    n, gather = data["ranks"], data["collective"] == ALL_GATHER
    image = np.array([[cell_color(c, len(holdings[p][c]), n, gather) for c in range(n)]
                      for p in range(n)])  # (n, n, 3) RGB
    ax.imshow(image, interpolation="nearest")
    for p in range(n):
        for c in range(n):
            held = len(holdings[p][c])
            text = "" if held == 0 else ("all" if held == n and not gather else str(held))
            dark = held and sum(image[p, c]) < 1.6
            ax.text(c, p, text, ha="center", va="center", fontsize=7 if n > 8 else 9,
                    color="white" if dark else "black")
    for _src, dst, chunk in received:  # the cells that just received a chunk
        ax.add_patch(Rectangle((chunk - 0.5, dst - 0.5), 1, 1, fill=False, edgecolor="black",
                               linewidth=2.5))
    ax.set_xticks(range(n), [f"c{c}" for c in range(n)], fontsize=7)
    ax.set_yticks(range(n), [f"r{data['channels'][0]['order'][p]}" for p in range(n)],
                  fontsize=7)
    ax.set_xlabel("chunk")


def _slide_legend(fig, data: dict) -> None:
    """What the lines, the shades and the outlines mean, under both panels."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    pale, dark = cell_color(0, 1, data["ranks"], False), cell_color(0, data["ranks"],
                                                                     data["ranks"], False)
    handles = [Line2D([], [], color="#9aa5b1", linewidth=1.5, label="NVLink hop"),
               Patch(facecolor=pale, edgecolor="#999", label="own data only"),
               Patch(facecolor=dark, edgecolor="#999", label="summed over all ranks"),
               Patch(facecolor="white", edgecolor="black", linewidth=2.5,
                     label="just received")]
    if data["nodes"] > 1:
        handles[1:1] = [Line2D([], [], color="#d62728", linestyle="--", linewidth=3,
                               label="InfiniBand hop"),
                        Line2D([], [], color="#7f8c8d", linestyle=":", linewidth=1.5,
                               label="PXN: NVLink to the GPU on the rail's NIC")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8,
               frameon=False)


def step_slide(data: dict, k: int) -> bytes | None:
    """Slide k: the state after step k (k = 0: the start), with its time derived."""
    plt = pyplot()
    if plt is None:
        return None
    step = data["steps"][k - 1] if k else None
    fig, (ring, grid) = plt.subplots(1, 2, figsize=(11, 5.8))
    _ring(ring, data, step)
    _grid(grid, data, step["holdings"] if step else data["start"], step["sends"] if step else [])
    if step:
        done = sum(s["time_s"] for s in data["steps"][:k])
        title = (f"{NAMES[step['phase']]} step {step['index'] + 1}/{data['ranks'] - 1}: each "
                 f"rank sends {format_bytes(step['bytes_per_rank'])} (total "
                 f"{microseconds(done)})\nslowest hop {hop_path(step['hop'])}, "
                 f"{step['hop']['link']}: {step['hop']['formula']}")
    else:
        title = f"{NAMES[data['collective']]} of {format_bytes(data['size_bytes'])}: the start"
    fig.suptitle(title, fontsize=11)
    _slide_legend(fig, data)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return pyplot_png(plt, fig)


def comparison_slide(data: dict) -> bytes | None:
    """Bars: all-reduce vs reduce-scatter then all-gather (time in µs), with a legend and the
    bytes per rank."""
    plt = pyplot()
    if plt is None:
        return None
    t, sent = data["compare"]["time_s"], data["compare"]["bytes_sent_per_rank"]
    fig, ax = plt.subplots(figsize=(11, 3.4))
    ax.barh([1], [t[ALL_REDUCE] * 1e6], color="#8172b2", height=0.5, label="all-reduce")
    ax.barh([0], [t[REDUCE_SCATTER] * 1e6], color="#4c72b0", height=0.5,
            label="reduce-scatter")
    ax.barh([0], [t[ALL_GATHER] * 1e6], left=[t[REDUCE_SCATTER] * 1e6], color="#55a868",
            height=0.5, label="all-gather")
    ax.set_yticks([0, 1], [f"reduce-scatter + all-gather\n"
                           f"{format_bytes(sent[REDUCE_SCATTER] + sent[ALL_GATHER])}/rank",
                           f"all-reduce\n{format_bytes(sent[ALL_REDUCE])}/rank"])
    ax.set_xlabel("modelled time (µs)")
    ax.set_title("All-reduce = reduce-scatter + all-gather: same steps, same bytes")
    ax.legend(loc="center right", fontsize=8)  # in the gap between the two bars
    fig.tight_layout()
    return pyplot_png(plt, fig)


def write_slides(data: dict, out_dir) -> list[Path]:
    """step_00.png ... step_NN.png and compare.png in `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    slides = [(f"step_{k:02d}.png", step_slide(data, k)) for k in range(len(data["steps"]) + 1)]
    slides.append(("compare.png", comparison_slide(data)))
    for name, png in slides:
        if png is not None:
            write_file(out / name, png)
    return [out / name for name, png in slides if png is not None]
