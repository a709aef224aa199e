"""The pictures of the run report (matplotlib, Agg backend), as PNG bytes.

Memory over time for every pipeline stage (small multiples, capacity marked), the pipeline
schedule as a Gantt chart, exposed time per stage as stacked bars, and memory by category at each
stage's peak. Every PNG is a deterministic function of the run: fixed size, dpi and metadata.
"""

import io

import numpy as np

from simsp.engine.ledger import CATEGORIES
from simsp.report.chrome_trace import memory_timeline
from simsp.units import GiB, MiB

COLORS = {"weights": "#4c72b0", "gradients": "#55a868", "optimizer": "#8172b2",
          "activations": "#c44e52", "temporaries": "#dd8452", "communication": "#937860"}
GANTT_COLORS = {"forward": "#4c72b0", "backward": "#55a868", "recompute": "#dd8452",
                "transfer": "#8172b2", "wait": "#d9d9d9", "DP communication": "#c44e52"}
EXPOSED_TRACKS = (("tp_comm", "TP comm", "#4c72b0"), ("pp_comm", "pipeline comm", "#8172b2"),
                  ("pp_wait", "pipeline wait", "#bbbbbb"), ("dp_comm", "DP comm", "#c44e52"))
MEMORY_POINTS = 600  # per stage panel: the downsampling keeps each bucket's max, so the peak


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or None when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def png_bytes(plt, fig) -> bytes:
    """The figure as PNG bytes with no varying metadata (the same run gives the same bytes)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def memory_unit(nbytes: float) -> tuple[str, int]:
    """GiB for paper models, MiB for the toys."""
    return ("GiB", GiB) if nbytes >= GiB else ("MiB", MiB)


def time_unit(seconds: float) -> tuple[str, float]:
    """s, ms or us for the time axis."""
    return next(((n, v) for n, v in (("s", 1.0), ("ms", 1e-3)) if seconds >= v), ("us", 1e-6))


def stage_ranks(run) -> list[int]:
    """The tp 0, dp 0 rank of each pipeline stage, in stage order."""
    return [run.rank_of(0, 0, pp) for pp in range(run.sc.parallel.pp)]


def _grid(plt, panels: int, cols: int, height: float, width: float = 13.0):
    """A figure of `panels` axes in rows of `cols` (unused axes hidden), sharing both axes."""
    rows = -(-panels // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width, 0.9 + height * rows), squeeze=False,
                             sharex=True, sharey=True)
    for ax in axes.flat[panels:]:
        ax.set_visible(False)
    return fig, axes


# ---------------------------------------------------------------- memory over time

def _memory_panel(ax, ledger, end_s: float, units, title: str) -> None:
    """One stage's memory over time, stacked by category, with its capacity and peak."""
    (_, scale), (_, tscale) = units
    times, state = memory_timeline(ledger.events, MEMORY_POINTS)  # (n,), (n, 6)
    if len(times):
        times, state = np.append(times, end_s), np.vstack([state, state[-1:]])
        ax.stackplot(times / tscale, (state / scale).T, step="post", linewidth=0,
                     colors=[COLORS[c] for c in CATEGORIES], labels=CATEGORIES)
    ax.axhline(ledger.capacity_bytes / scale, color="black", linestyle="--", linewidth=1,
               label="capacity")
    summary = ledger.summary()
    ax.set_title(f"{title}: peak {summary.peak_total / scale:.1f} {units[0][0]}"
                 + (", OUT OF MEMORY" if summary.oom else ""), fontsize=9,
                 color="#b00020" if summary.oom else "black")
    ax.grid(True, alpha=0.3)


def memory_over_time(run, label: str) -> bytes | None:
    """Small multiples: memory over time of every pipeline stage, capacity dashed."""
    plt = pyplot()
    if plt is None:
        return None
    ranks = stage_ranks(run)
    ledgers = [run.world.ranks[rank].ledger for rank in ranks]
    end_s = max(run.end_s.values(), default=0.0)
    top = max(max(g.peak_total for g in ledgers), ledgers[0].capacity_bytes)
    units = (memory_unit(top), time_unit(end_s))
    cols = min(4, len(ranks))
    fig, axes = _grid(plt, len(ranks), cols, 1.9)
    for ax, (stage, rank), ledger in zip(axes.flat, enumerate(ranks), ledgers):
        _memory_panel(ax, ledger, end_s, units, f"stage {stage} (rank {rank})")
    axes[0, 0].set_ylim(0, top / units[0][1] * 1.08)
    for ax in axes[:, 0]:
        ax.set_ylabel(units[0][0])
    for ax in axes[-1, :]:
        ax.set_xlabel(f"time ({units[1][0]})")
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.suptitle(f"Memory over one iteration, every pipeline stage: {label}", y=0.995)
    fig.legend(handles, names, loc="upper center", ncol=len(names), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 0.965))
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return png_bytes(plt, fig)


# ---------------------------------------------------------------- the schedule

def gantt_intervals(run, rank: int) -> dict[str, list[tuple[float, float]]]:
    """{kind: [(start_s, duration_s)]} of one stage: forward and backward steps, recompute,
    pipeline transfers, DP communication, and waits (gaps between consecutive steps)."""
    steps = sorted(run.steps.get(rank, []), key=lambda s: s[3])
    out = {k: [] for k in GANTT_COLORS}
    for kind, _mb, _chunk, begin, end in steps:
        out["forward" if kind == "F" else "backward"].append((begin, end - begin))
    for (*_, _, prev_end), (*_, begin, _) in zip(steps, steps[1:]):
        if begin > prev_end:
            out["wait"].append((prev_end, begin - prev_end))
    for span in run.world.trace.spans_of(rank):
        if span.track == "compute" and span.args.get("phase") == "recompute":
            out["recompute"].append((span.start_s, span.duration_s))
        elif span.track == "pp_comm":
            out["transfer"].append((span.start_s, span.duration_s))
        elif span.track == "dp_comm":
            out["DP communication"].append((span.start_s, span.duration_s))
    return out


LANES = {"forward": (0.0, 0.62), "backward": (0.0, 0.62), "wait": (0.0, 0.62),
         "recompute": (0.0, 0.62), "transfer": (0.66, 0.26), "DP communication": (0.66, 0.26)}


def _draw_gantt(ax, intervals: list[dict], tscale: float, window: tuple[float, float]) -> None:
    """One Gantt panel: a row per stage over `window` (seconds)."""
    for stage, by_kind in enumerate(intervals):
        for kind, spans in by_kind.items():
            offset, height = LANES[kind]
            bars = [(s / tscale, d / tscale) for s, d in spans]
            ax.broken_barh(bars, (stage + offset - 0.45, height), facecolors=GANTT_COLORS[kind],
                           edgecolor="white", linewidth=0.3, label=kind if stage == 0 else None)
    ax.set_yticks(range(len(intervals)), [f"stage {s}" for s in range(len(intervals))])
    ax.set_ylim(len(intervals) - 0.5, -0.5)
    ax.set_xlim(window[0] / tscale, window[1] / tscale)


def zoom_window(run) -> tuple[float, float]:
    """The pipeline fill: from 0 to a little after stage 0's first backward step begins."""
    steps = run.steps.get(stage_ranks(run)[0], [])
    first_b = min((begin for kind, *_, begin, _ in steps if kind == "B"), default=0.0)
    end_s = max(run.end_s.values(), default=0.0)
    return 0.0, min(end_s, 1.35 * first_b) or end_s or 1.0


def schedule_gantt(run, label: str) -> bytes | None:
    """The pipeline schedule: one row per stage, steps on top, transfers below them; the whole
    iteration, then a zoom on the pipeline fill."""
    plt = pyplot()
    if plt is None:
        return None
    ranks = stage_ranks(run)
    intervals = [gantt_intervals(run, rank) for rank in ranks]
    end_s = max(run.end_s.values(), default=0.0)
    unit, tscale = time_unit(end_s)
    fig, (whole, zoom) = plt.subplots(2, 1, figsize=(13, 2.2 + 0.75 * len(ranks)))
    _draw_gantt(whole, intervals, tscale, (0.0, end_s or 1.0))
    whole.set_title(f"Pipeline schedule: {label}")
    window = zoom_window(run)
    _draw_gantt(zoom, intervals, tscale, window)
    zoom.set_title(f"Zoom: the pipeline fill (first {window[1] / tscale:.3g} {unit})",
                   fontsize=10)
    zoom.set_xlabel(f"time ({unit})")
    handles, names = whole.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(names), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return png_bytes(plt, fig)


# ---------------------------------------------------------------- bars per stage

def _stacked_bars(ax, columns: list[tuple[str, str, list[float]]], stages: int) -> None:
    """Stacked vertical bars, one per stage; `columns` = [(label, colour, values per stage)]."""
    bottom = np.zeros(stages)  # (stages,)
    for label, color, values in columns:
        ax.bar(range(stages), values, bottom=bottom, color=color, label=label, width=0.7)
        bottom += np.asarray(values, dtype=float)
    ax.set_xticks(range(stages), [str(s) for s in range(stages)])
    ax.set_xlabel("pipeline stage")
    ax.grid(True, axis="y", alpha=0.3)


def exposed_time_bars(metrics: dict, label: str) -> bytes | None:
    """Exposed communication and pipeline wait per stage, stacked by track."""
    plt = pyplot()
    if plt is None:
        return None
    exposed = metrics["exposed_comm_s_per_stage"]
    unit, scale = time_unit(max((sum(e.values()) for e in exposed), default=0.0))
    columns = [(name, color, [e.get(key, 0.0) / scale for e in exposed])
               for key, name, color in EXPOSED_TRACKS]
    fig, ax = plt.subplots(figsize=(13, 3.6))
    _stacked_bars(ax, columns, len(exposed))
    ax.set_ylabel(unit)
    ax.legend(fontsize=8, ncol=4, loc="upper right")
    ax.set_title(f"Exposed time per stage (communication no compute hid, and waits): {label}")
    fig.tight_layout()
    return png_bytes(plt, fig)


def stage_memory_rows(metrics: dict) -> list[dict]:
    """The tp 0, dp 0 rank of each stage from the metrics, in stage order."""
    rows = [r for r in metrics["ranks"] if r["tp"] == 0 and r["dp"] == 0]
    return sorted(rows, key=lambda r: r["pp"])


def memory_at_peak_bars(metrics: dict, capacity_bytes: int, label: str) -> bytes | None:
    """Memory by category at each stage's peak moment, with the capacity line."""
    plt = pyplot()
    if plt is None:
        return None
    rows = stage_memory_rows(metrics)
    top = max(max(r["peak_bytes"] for r in rows), capacity_bytes)
    unit, scale = memory_unit(top)
    columns = [(c, COLORS[c], [r["at_peak_bytes"].get(c, 0) / scale for r in rows])
               for c in CATEGORIES]
    fig, ax = plt.subplots(figsize=(13, 3.8))
    _stacked_bars(ax, columns, len(rows))
    ax.axhline(capacity_bytes / scale, color="black", linestyle="--", linewidth=1,
               label="capacity")
    ax.set_ylim(0, top / scale * 1.1)
    ax.set_ylabel(unit)
    ax.legend(fontsize=8, ncol=7, loc="upper center", bbox_to_anchor=(0.5, -0.18),
              frameon=False)
    ax.set_title(f"Memory by category at each stage's peak: {label}")
    fig.tight_layout()
    return png_bytes(plt, fig)


def switch_bars(explanation: dict, label: str) -> bytes | None:
    """Out of memory: each candidate switch's verified worst-stage peak against the capacity."""
    plt = pyplot()
    tried = [s for s in explanation["switches"] if s["valid"]]
    if plt is None or not tried:
        return None
    capacity = tried[0]["capacity_bytes"]
    fig, ax = plt.subplots(figsize=(13, 0.9 + 0.45 * len(tried)))
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
    fig.tight_layout()
    return png_bytes(plt, fig)


def report_figures(run, metrics: dict, label: str) -> list[tuple[str, str, bytes]]:
    """[(file name, caption, PNG bytes)] of the run report, in reading order (none without
    matplotlib)."""
    capacity = run.world.ranks[stage_ranks(run)[0]].ledger.capacity_bytes
    made = [("memory_stages.png", "Memory over one iteration for every pipeline stage "
             "(stacked by category; dashed line: capacity).", memory_over_time(run, label)),
            ("schedule.png", "Pipeline schedule: forward and backward steps, recompute, waits "
             "for input (grey), and pipeline transfers and DP communication below each row.",
             schedule_gantt(run, label)),
            ("exposed.png", "Exposed time per stage: communication that no compute hid, and "
             "pipeline waits.", exposed_time_bars(metrics, label)),
            ("memory_at_peak.png", "Memory by category at each stage's peak moment.",
             memory_at_peak_bars(metrics, capacity, label))]
    explanation = metrics.get("oom_explanation")
    if explanation:
        made.append(("oom_switches.png", "Out of memory: the worst-stage peak of each candidate "
                     "switch, each from its own simulated iteration (green fits).",
                     switch_bars(explanation, label)))
    return [(name, caption, png) for name, caption, png in made if png is not None]
