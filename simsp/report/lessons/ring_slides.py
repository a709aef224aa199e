"""The ring lesson as slides (`simsp ring --png DIR`; matplotlib, Agg): one PNG per step and one
comparing all-reduce with reduce-scatter + all-gather."""

import colorsys
import io
from pathlib import Path

import numpy as np

from simsp.engine.collectives.ring_plan import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from simsp.io_out import write_file
from simsp.report.lessons.ring import NAMES, call_times, hop_path, microseconds
from simsp.units import format_bytes


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
        call = (f"; + base latency {microseconds(data['base_latency_s'])} = one call "
                f"{microseconds(data['call_s'])}" if k == len(data["steps"]) else "")
        title = (f"{NAMES[step['phase']]} step {step['index'] + 1}/{data['ranks'] - 1}: each "
                 f"rank sends {format_bytes(step['bytes_per_rank'])} (steps so far "
                 f"{microseconds(done)}{call})\nslowest hop {hop_path(step['hop'])}, "
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
    t, sent = call_times(data["compare"]), data["compare"]["bytes_sent_per_rank"]
    fig, ax = plt.subplots(figsize=(11, 3.4))
    ax.barh([1], [t[ALL_REDUCE] * 1e6], color="#8172b2", height=0.5, label="all-reduce")
    ax.barh([0], [t[REDUCE_SCATTER] * 1e6], color="#4c72b0", height=0.5,
            label="reduce-scatter")
    ax.barh([0], [t[ALL_GATHER] * 1e6], left=[t[REDUCE_SCATTER] * 1e6], color="#55a868",
            height=0.5, label="all-gather")
    ax.set_yticks([0, 1], [f"reduce-scatter + all-gather\n"
                           f"{format_bytes(sent[REDUCE_SCATTER] + sent[ALL_GATHER])}/rank",
                           f"all-reduce\n{format_bytes(sent[ALL_REDUCE])}/rank"])
    ax.set_xlabel("modelled time of whole calls (µs): the steps and NCCL's base latency, once "
                  "per call")
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
