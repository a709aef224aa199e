"""The run report's bar charts, drawn from the metrics: exposed time per stage (exposed.png),
memory by category at each stage's peak (memory_at_peak.png) and, out of memory, the switches
tried (oom_switches.png). Matplotlib's object API on the Agg canvas, fixed size, dpi, margins
and metadata: the same metrics give the same bytes.
"""

import numpy as np

from simsp.report.run.figures.drawing import (add_axes_in, memory_unit, new_figure, png_bytes,
                                              time_unit)
from simsp.report.run.figures.stage_ticks import stage_ticks
from simsp.report.run.figures.memory import COLORS
from simsp.report.run.shown_categories import report_categories
from simsp.units import GiB


EXPOSED_TRACKS = (("tp_comm", "TP comm", "#4c72b0"), ("pp_transfer", "pipeline transfer", "#8172b2"),
                  ("pp_comm", "pipeline comm", "#8172b2"), ("pp_wait", "pipeline wait", "#bbbbbb"),
                  ("dp_comm", "DP comm", "#c44e52"), ("cp_comm", "CP comm", "#55a868"))
BUSY_KEYS = ("compute", "optimizer")  # time at work, not exposed
BAR_MARGINS = (0.8, 0.9, 0.2, 0.4)  # inches: left, bottom (ticks, label, legend), right, top


def bar_figure(height_in: float):
    """(figure, axes) for a stage bar chart, fixed margins; (None, None) without matplotlib."""
    fig = new_figure(13.0, height_in)
    if fig is None:
        return None, None
    return fig, add_axes_in(fig, *BAR_MARGINS)


# ---------------------------------------------------------------- bars per stage

def column_rectangles(x: np.ndarray, bottom: np.ndarray, top: np.ndarray,
                      width: float) -> np.ndarray:
    """(n, 4, 2): upright bars of `width` centred on `x` (n,), from `bottom` to `top` (n,)."""
    left, right = x - width / 2, x + width / 2
    corners = [(left, bottom), (right, bottom), (right, top), (left, top)]
    return np.stack([np.column_stack(c) for c in corners], axis=1)


def _stacked_bars(ax, columns: list[tuple[str, str, list[float]]], stages: int) -> None:
    """Stacked vertical bars, one per stage; `columns` = [(label, colour, values per stage)]:
    one PolyCollection per column, limits set here."""
    from matplotlib.collections import PolyCollection
    x = np.arange(stages, dtype=float)  # (stages,)
    bottom = np.zeros(stages)  # (stages,)
    for label, color, values in columns:
        top = bottom + np.asarray(values, dtype=float)
        ax.add_collection(PolyCollection(column_rectangles(x, bottom, top, 0.7), label=label,
                                         facecolors=color, linewidths=0), autolim=False)
        bottom = top
    ax.set_xlim(-0.7, stages - 0.3)
    stage_ticks(ax, "x", [str(s) for s in range(stages)], title="pipeline stage")
    ax.grid(True, axis="y", alpha=0.3)


def exposed_tracks(exposed: list[dict]) -> list[tuple[str, str, str]]:
    """(key, label, colour) of every exposed track present, known ones first."""
    keys = {k for e in exposed for k in e} - set(BUSY_KEYS)
    known = [t for t in EXPOSED_TRACKS if t[0] in keys]
    extra = sorted(keys - {t[0] for t in EXPOSED_TRACKS})
    return known + [(k, k, color) for k, color in zip(extra, ("#937860", "#dd8452", "#da8bc3"))]


def _bar_legend(fig, ax, columns: int) -> None:
    """The bar chart's legend in one row along the bottom edge."""
    handles, names = ax.get_legend_handles_labels()
    fig.legend(handles, names, fontsize=8, ncol=columns, loc="lower center", frameon=False)


def exposed_time_bars(metrics: dict, label: str) -> bytes | None:
    """Exposed communication and pipeline wait per stage, stacked by track."""
    fig, ax = bar_figure(3.6)
    if fig is None:
        return None
    exposed = metrics.get("exposed_s_per_stage") or metrics["exposed_comm_s_per_stage"]
    tracks = exposed_tracks(exposed)
    top = max((sum(e.get(k, 0.0) for k, _, _ in tracks) for e in exposed), default=0.0)
    unit, scale = time_unit(top)
    columns = [(name, color, [e.get(key, 0.0) / scale for e in exposed])
               for key, name, color in tracks]
    _stacked_bars(ax, columns, len(exposed))
    ax.set_ylim(0, top / scale * 1.1 or 1.0)
    ax.set_ylabel(unit)
    _bar_legend(fig, ax, len(columns))
    ax.set_title(f"Exposed time per stage (communication no compute hid, and waits): {label}")
    return png_bytes(fig)


def stage_memory_rows(metrics: dict) -> list[dict]:
    """The tp 0, dp 0 rank of each stage from the metrics, in stage order."""
    rows = [r for r in metrics["ranks"] if r["tp"] == 0 and r["dp"] == 0]
    return sorted(rows, key=lambda r: r["pp"])


def memory_at_peak_columns(metrics: dict, rows: list[dict], scale: float) -> list:
    """[(category, colour, bytes / scale at each of `rows`' peak)] of the categories the report
    shows (held_for_wgrad only where the run holds some: shown_categories.py)."""
    return [(c, COLORS[c], [r["at_peak_bytes"].get(c, 0) / scale for r in rows])
            for c in report_categories(metrics)]


def memory_at_peak_bars(metrics: dict, capacity_bytes: int, label: str) -> bytes | None:
    """Memory by category at each stage's peak moment, with the capacity line."""
    fig, ax = bar_figure(3.8)
    if fig is None:
        return None
    rows = stage_memory_rows(metrics)
    top = max(max(r["peak_bytes"] for r in rows), capacity_bytes)
    unit, scale = memory_unit(top)
    columns = memory_at_peak_columns(metrics, rows, scale)
    _stacked_bars(ax, columns, len(rows))
    ax.axhline(capacity_bytes / scale, color="black", linestyle="--", linewidth=1,
               label="capacity")
    ax.set_ylim(0, top / scale * 1.1)
    ax.set_ylabel(unit)
    _bar_legend(fig, ax, len(columns) + 1)
    ax.set_title(f"Memory by category at each stage's peak: {label}")
    return png_bytes(fig)


def switch_bars(explanation: dict, label: str) -> bytes | None:
    """Out of memory: each candidate switch's verified worst-stage peak against the capacity."""
    tried = [s for s in explanation["switches"] if s["valid"]]
    fig = new_figure(13, 0.9 + 0.45 * len(tried)) if tried else None
    if fig is None:
        return None
    capacity = tried[0]["capacity_bytes"]
    ax = fig.add_subplot()
    peaks = [s["peak_bytes"] / GiB for s in tried]
    colors = ["#55a868" if s["fits"] else "#c44e52" for s in tried]
    ax.barh(range(len(tried)), peaks, color=colors, height=0.6)
    for y, (s, peak) in enumerate(zip(tried, peaks)):
        ax.text(peak, y, f" {peak:.1f} GiB, iteration {s['iteration_time_s']:.2f} s",
                va="center", fontsize=8)
    ax.set_xlim(0, max(max(peaks), capacity / GiB) * 1.3)
    ax.axvline(capacity / GiB, color="black", linestyle="--", linewidth=1, label="capacity")
    ax.set_yticks(range(len(tried)), [s["switch"] for s in tried])
    ax.invert_yaxis()
    ax.set_xlabel("worst-stage peak memory (GiB), each from its own simulated iteration")
    ax.set_title(f"Switches tried against the out-of-memory: {label}")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()  # the switch names' width is not known in advance; a few bars only
    return png_bytes(fig)
