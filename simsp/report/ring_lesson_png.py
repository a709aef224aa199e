"""The ring lesson as slides: one PNG per step (the ring with this step's sends, and the rank x
chunk grid), and one comparing all-reduce with reduce-scatter + all-gather (matplotlib, Agg)."""

import colorsys
from pathlib import Path

import numpy as np

from simsp.engine.ring_plan import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from simsp.io_out import write_file
from simsp.report.figures import png_bytes, pyplot
from simsp.units import format_bytes, format_seconds

NAMES = {ALL_REDUCE: "all-reduce", REDUCE_SCATTER: "reduce-scatter", ALL_GATHER: "all-gather"}


def cell_color(chunk: int, held: int, n: int, gather: bool) -> tuple:
    """The chunk's hue; darker the more ranks it sums (white when not held). As the page."""
    if held == 0:
        return (1.0, 1.0, 1.0)
    light = 0.55 if gather else 0.90 - 0.48 * (held - 1) / max(n - 1, 1)
    return colorsys.hls_to_rgb(chunk / n, light, 0.65)


def _ring(ax, data: dict, step: dict | None) -> None:
    """Ranks on a circle, InfiniBand hops red dashed, this step's sends as chunk-coloured arrows."""
    n, channel = data["ranks"], data["channels"][0]
    angles = np.pi / 2 - 2 * np.pi * np.arange(n) / n  # (n,) clockwise from the top, as the page
    xy = np.stack([np.cos(angles), np.sin(angles)], axis=1)  # (n, 2)
    for p in range(n):
        a, b = xy[p], xy[(p + 1) % n]
        ib = channel["hops"][p] == "InfiniBand"
        ax.plot([a[0], b[0]], [a[1], b[1]], color="#d62728" if ib else "#9aa5b1",
                linestyle="--" if ib else "-", linewidth=3 if ib else 1.5, zorder=1)
    for src, dst, chunk in (step["sends"] if step else []):
        a, b = 0.78 * xy[src], 0.78 * xy[dst]
        color = colorsys.hls_to_rgb(chunk / n, 0.4, 0.65)
        ax.annotate("", xy=b, xytext=a, arrowprops={"arrowstyle": "-|>", "linewidth": 2,
                    "color": color})
        ax.text(*(0.62 * (xy[src] + xy[dst]) / 2), f"c{chunk}", color=color, fontsize=8,
                ha="center", va="center")
    for p in range(n):
        ax.scatter(*xy[p], s=520, color="#dde8f6", edgecolors="#34495e", zorder=2)
        ax.text(*xy[p], f"r{channel['order'][p]}", ha="center", va="center", fontsize=9,
                zorder=3)
    ax.set_xlim(-1.3, 1.3)
    ax.set_ylim(-1.3, 1.3)
    ax.set_aspect("equal")
    ax.axis("off")


def _grid(ax, data: dict, holdings: list, received: list) -> None:
    """The rank x chunk grid: coloured cells, 'all' where a chunk sums every rank."""
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
        ax.add_patch(plt_rectangle(chunk, dst))
    ax.set_xticks(range(n), [f"c{c}" for c in range(n)], fontsize=7)
    ax.set_yticks(range(n), [f"r{data['channels'][0]['order'][p]}" for p in range(n)],
                  fontsize=7)
    ax.set_xlabel("chunk")


def plt_rectangle(col: int, row: int):
    """A black outline around one grid cell."""
    from matplotlib.patches import Rectangle
    return Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2.5)


def step_slide(data: dict, k: int) -> bytes | None:
    """Slide k: the state after step k (k = 0: the start)."""
    plt = pyplot()
    if plt is None:
        return None
    step = data["steps"][k - 1] if k else None
    fig, (ring, grid) = plt.subplots(1, 2, figsize=(11, 5.4))
    _ring(ring, data, step)
    _grid(grid, data, step["holdings"] if step else data["start"], step["sends"] if step else [])
    if step:
        done = sum(s["time_s"] for s in data["steps"][:k])
        title = (f"{NAMES[step['phase']]} step {step['index'] + 1}/{data['ranks'] - 1}: each "
                 f"rank sends {format_bytes(step['bytes_per_rank'])}, "
                 f"{format_seconds(step['time_s'])} (total {format_seconds(done)})")
    else:
        title = f"{NAMES[data['collective']]} of {format_bytes(data['size_bytes'])}: the start"
    fig.suptitle(title)
    fig.tight_layout()
    return png_bytes(plt, fig)


def comparison_slide(data: dict) -> bytes | None:
    """Bars: all-reduce vs reduce-scatter then all-gather (time), with the bytes per rank."""
    plt = pyplot()
    if plt is None:
        return None
    t, sent = data["compare"]["time_s"], data["compare"]["bytes_sent_per_rank"]
    fig, ax = plt.subplots(figsize=(11, 3.2))
    ax.barh([1], [t[ALL_REDUCE] * 1e6], color="#8172b2", height=0.5)
    ax.barh([0], [t[REDUCE_SCATTER] * 1e6], color="#4c72b0", height=0.5)
    ax.barh([0], [t[ALL_GATHER] * 1e6], left=[t[REDUCE_SCATTER] * 1e6], color="#55a868",
            height=0.5)
    ax.set_yticks([0, 1], [f"reduce-scatter + all-gather\n"
                           f"{format_bytes(sent[REDUCE_SCATTER] + sent[ALL_GATHER])}/rank",
                           f"all-reduce\n{format_bytes(sent[ALL_REDUCE])}/rank"])
    ax.set_xlabel("modelled time (µs)")
    ax.set_title("All-reduce = reduce-scatter + all-gather: same steps, same bytes")
    fig.tight_layout()
    return png_bytes(plt, fig)


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
