"""The figures of the run report, as PNG bytes: the pipeline schedule (a Gantt chart), memory
over the iteration for every stage and for the first and last, memory by category at each
stage's peak, and the exposed-time bars.

Sections: memory timelines (a rank's bytes per category after each change, downsampled with
the peak kept; the trace's memory counters read them too), the schedule chart, the per-stage
memory panels, the figures' inputs (plain numbers and arrays another process can draw from:
report/painter.py), memory.png, and the figures of the report. Everything is drawn with the
machinery of report/drawing.py.
"""

from dataclasses import dataclass
from pathlib import Path
from weakref import finalize

import numpy as np

from simsp.engine.memory import CATEGORIES, sort_log
from simsp.io_out import write_file
from simsp.metrics import stage_ranks
from simsp.report.drawing import (GRID, PanelGrid, add_axes_in, draw_pixels, frames, grid_segments,
                                  label_axes, memory_unit, new_figure, new_sheet, nice_ticks,
                                  painted_shares, panel_titles, png_bytes,
                                  stacked_step_polygons, stage_ticks, tick_labels, tick_segments,
                                  time_unit)
from simsp.units import GiB, KiB, MiB


# ---------------------------------------------------------------------------------------------
# Memory timelines
# ---------------------------------------------------------------------------------------------
#
# A rank's memory over time from its ledger: bytes per category after each change, downsampled.
#
# Shared by the Chrome trace's memory counter and the memory plots, so all show the exact peak:
# beyond a point budget the timeline keeps each time bucket's highest and lowest state. A ledger's
# timeline at MAX_MEMORY_POINTS is computed once (kept beside the ledger until it changes); smaller
# budgets downsample that one again, which keeps the peak too.

MAX_MEMORY_POINTS = 2000  # per rank
_FINEST: dict = {}  # id(ledger) -> (records, times, state) while that ledger lives


def memory_timeline(log, max_points: int = MAX_MEMORY_POINTS):
    """A ledger (or a list of MemEvents) -> (times_s, bytes per category (n, 6) int64), at most
    `max_points` rows.

    The log is read in time order (stable, ties in recording order, as the ledger's summary
    does). Beyond `max_points` changes, the timeline is split into (max_points - 2) // 2 equal
    time buckets that each keep their highest and lowest state, plus the first and last, so the
    maximum of the total is exactly the ledger's peak."""
    if not hasattr(log, "records") or max_points > MAX_MEMORY_POINTS:
        return _timeline(log, max_points)
    return coarser(*_finest(log), max_points)


def coarser(times: np.ndarray, state: np.ndarray, max_points: int):
    """A timeline (times (n,), state (n, 6)) at most `max_points` rows long, each time bucket's
    highest and lowest state kept (the peak stays exact)."""
    if len(times) <= max_points:
        return times, state
    keep = _downsample(times, state.sum(axis=1), max_points)
    return times[keep], state[keep]


def _finest(ledger) -> tuple[np.ndarray, np.ndarray]:
    """The ledger's timeline at MAX_MEMORY_POINTS, computed once per state of its log."""
    count, key = len(ledger.records), id(ledger)
    cached = _FINEST.get(key)
    if cached is None:
        finalize(ledger, _FINEST.pop, key, None)  # forget it with the ledger
    if cached is None or cached[0] != count:
        times, state = _timeline(ledger, MAX_MEMORY_POINTS)
        times.flags.writeable = state.flags.writeable = False  # shared: callers only read
        cached = _FINEST[key] = (count, times, state)
    return cached[1], cached[2]


def _timeline(log, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """memory_timeline computed from the whole log."""
    records = log.records if hasattr(log, "records") else list(log)
    if not records:
        return np.zeros(0), np.zeros((0, len(CATEGORIES)), dtype=np.int64)
    times, codes, deltas, _ = log.sorted_log() if hasattr(log, "records") else sort_log(
        records, CATEGORIES)
    total = np.cumsum(deltas)  # (n,) bytes in use after each change
    keep = _downsample(times, total, max_points)  # (m,)
    return times[keep], state_at(codes, deltas, keep)


def state_at(codes: np.ndarray, deltas: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """(m, 6) int64: bytes per category after each kept change (`keep`, sorted, ending at the
    last change), from the changes' category `codes` (n,) and byte `deltas` (n,).

    Each change is summed into the segment that ends at the next kept change (np.bincount; its
    float64 sums of whole bytes are exact below 2**53 bytes), then the segments run-summed."""
    starts = np.zeros(len(codes), dtype=np.int64)  # (n,) 1 where a new segment begins
    starts[keep[:-1] + 1] = 1
    segment = np.cumsum(starts)  # (n,)
    width = len(CATEGORIES)
    sums = np.bincount(segment * width + codes, weights=deltas, minlength=len(keep) * width)
    return np.cumsum(np.rint(sums).astype(np.int64).reshape(len(keep), width), axis=0)


def _downsample(times: np.ndarray, total: np.ndarray, max_points: int) -> np.ndarray:
    """Indices to keep: all if few enough, else each time bucket's max and min (and the ends).

    The first maximum and first minimum of each bucket, so the choice is deterministic."""
    n = len(times)
    if n <= max_points:
        return np.arange(n)
    buckets = max(1, (max_points - 2) // 2)
    span = times[-1] - times[0]
    ids = np.zeros(n, dtype=np.int64) if span <= 0 else np.minimum(
        ((times - times[0]) / span * buckets).astype(np.int64), buckets - 1)
    new_bucket = np.r_[True, ids[1:] != ids[:-1]]
    starts, bucket = np.flatnonzero(new_bucket), np.cumsum(new_bucket) - 1
    keep = [[0, n - 1]]
    for reduce in (np.maximum, np.minimum):
        hits = np.flatnonzero(total == reduce.reduceat(total, starts)[bucket])
        keep.append(hits[np.r_[True, bucket[hits][1:] != bucket[hits][:-1]]])
    return np.unique(np.concatenate(keep))


# ---------------------------------------------------------------------------------------------
# The schedule chart
# ---------------------------------------------------------------------------------------------
#
# The pipeline schedule as a Gantt chart: one row per stage, steps on top, transfers below; the
# whole iteration, then a zoom on the pipeline fill.
#
# Level of detail honest to the pixel: a panel whose steps are at least MIN_BAR_PX wide draws each
# bar (white edges between them, as a bar chart does); a denser one, where bars are narrower than
# the edges that would separate them, is painted as one image whose every pixel column shows the
# exact share of its time each kind takes (pixel_coverage). Either way the cost is a few numpy
# passes over the spans, not one matplotlib artist per bar.

GANTT_COLORS = {"forward": "#4c72b0", "backward": "#55a868", "recompute": "#dd8452",
                "transfer": "#8172b2", "wait": "#d9d9d9", "DP communication": "#c44e52"}
LANES = {"forward": (0.0, 0.62), "backward": (0.0, 0.62), "wait": (0.0, 0.62),
         "recompute": (0.0, 0.62), "transfer": (0.66, 0.26), "DP communication": (0.66, 0.26)}
MIN_BAR_PX = 3.0  # median step narrower than this: paint pixel shares instead of bars
WIDTH, LEFT, RIGHT = 13.0, 0.85, 0.2  # inches
TOP, MIDDLE, BOTTOM = 0.4, 0.75, 0.9  # inches: title; whole's ticks + zoom title; ticks + legend


def replayed(run) -> bool:
    """Meta-mode layer templates: replayed layer steps keep one merged span per track, so
    recompute is only inside the backward bars (the first, recorded layer alone has detail)."""
    return run.inputs.shortcuts.templates


def stage_spans(run, ranks: list[int]) -> dict[int, list]:
    """{rank: [Span]} of the tracks the chart shows (pipeline and DP communication, compute for
    recompute), for `ranks`, in recording order: one pass over the trace."""
    out = {rank: [] for rank in ranks}
    for span in run.inputs.world.trace.spans:
        if span.rank in out and span.track in ("pp_comm", "dp_comm", "compute"):
            out[span.rank].append(span)
    return out


def stage_intervals(run, rank: int, spans: list) -> dict[str, np.ndarray]:
    """{kind: (n, 2) [start_s, end_s]} of one stage: forward and backward steps, recompute,
    pipeline transfers, DP communication, and waits (gaps between consecutive steps)."""
    steps = run.results.steps.get(rank, [])
    kinds, _, _, begins, ends = zip(*steps) if steps else ((),) * 5  # transposed once
    forward = np.array(kinds, dtype=object) == "F"  # (n,)
    bounds = np.column_stack([np.array(begins, dtype=float), np.array(ends, dtype=float)])
    order = np.argsort(bounds[:, 0], kind="stable")
    forward, bounds = forward[order], bounds[order]  # (n,), (n, 2) by start
    gaps = np.column_stack([bounds[:-1, 1], bounds[1:, 0]])  # (n - 1, 2)
    out = {"forward": bounds[forward], "backward": bounds[~forward],
           "wait": gaps[gaps[:, 1] > gaps[:, 0]]}
    out.update(_span_kinds(spans, detailed=not replayed(run)))
    return {kind: out[kind] for kind in GANTT_COLORS}


def _span_kinds(spans: list, detailed: bool) -> dict[str, np.ndarray]:
    """{kind: (n, 2) [start_s, end_s]}: transfers, DP communication and (when the run kept
    per-op detail) recompute, from one stage's spans."""
    picked = {"recompute": [], "transfer": [], "DP communication": []}
    for span in spans:
        if span.track == "pp_comm":
            picked["transfer"].append((span.start_s, span.end_s))
        elif span.track == "dp_comm":
            picked["DP communication"].append((span.start_s, span.end_s))
        elif detailed and span.args.get("phase") == "recompute":
            picked["recompute"].append((span.start_s, span.end_s))
    return {k: np.array(v, dtype=float).reshape(-1, 2) for k, v in picked.items()}


def clip(intervals: np.ndarray, window: tuple[float, float]) -> np.ndarray:
    """(m, 2): the parts of `intervals` (n, 2) inside `window`; those outside are dropped."""
    inside = (intervals[:, 1] > window[0]) & (intervals[:, 0] < window[1])
    return np.clip(intervals[inside], window[0], window[1])


def zoom_window(run, first_rank: int) -> tuple[float, float]:
    """The pipeline fill: from 0 to a little after stage 0's first backward step begins."""
    steps = run.results.steps.get(first_rank, [])
    first_b = min((begin for kind, *_, begin, _ in steps if kind == "B"), default=0.0)
    end_s = max(run.results.end_s.values(), default=0.0)
    return 0.0, min(end_s, 1.35 * first_b) or end_s or 1.0


def median_bar_px(stages: list[dict], window: tuple[float, float], width_px: float) -> float:
    """The median width in pixels of the forward and backward steps inside `window`."""
    steps = [clip(s[k], window) for s in stages for k in ("forward", "backward")]
    widths = np.diff(np.vstack(steps + [np.zeros((0, 2))]), axis=1)  # (n, 1)
    if not len(widths):
        return np.inf
    return float(np.median(widths)) * width_px / (window[1] - window[0])


# ---------------------------------------------------------------- bars

def bar_outlines(intervals: np.ndarray, row: int, lane: tuple, tscale: float) -> np.ndarray:
    """(n, 4, 2): rectangles of `intervals` (n, 2 seconds) in `row`'s lane, x in time units."""
    offset, height = lane
    x0, x1 = intervals[:, 0] / tscale, intervals[:, 1] / tscale  # (n,)
    y0 = np.full(len(intervals), row + offset - 0.45)  # (n,)
    y1 = y0 + height
    return np.stack([np.column_stack(c) for c in ((x0, y0), (x1, y0), (x1, y1), (x0, y1))],
                    axis=1)


def draw_bars(ax, stages: list[dict], window: tuple, tscale: float) -> None:
    """Every bar inside `window`: one PolyCollection per kind over all stages."""
    from matplotlib.collections import PolyCollection
    for kind, color in GANTT_COLORS.items():
        outlines = [bar_outlines(clip(s[kind], window), row, LANES[kind], tscale)
                    for row, s in enumerate(stages)]
        bars = np.concatenate(outlines + [np.zeros((0, 4, 2))])  # (n, 4, 2)
        ax.add_collection(PolyCollection(bars, facecolors=color, edgecolors="white",
                                         linewidths=0.3), autolim=False)


# ---------------------------------------------------------------- pixel shares

def _rgb(color: str) -> np.ndarray:
    """(3,) floats in [0, 1] of a '#rrggbb' colour."""
    return np.array([int(color[i:i + 2], 16) for i in (1, 3, 5)]) / 255.0


def lane_strip(stage: dict, kinds: list[str], edges: np.ndarray) -> np.ndarray:
    """(w, 3): the colour of each pixel column of one lane: the kinds' shares (painted in
    order, later on top) mixed over white."""
    shares = painted_shares([stage[k] for k in kinds], edges)  # (k, w)
    colors = np.array([_rgb(GANTT_COLORS[k]) for k in kinds]).reshape(-1, 3)  # (k, 3)
    return shares.T @ colors + (1.0 - shares.sum(axis=0))[:, None]


def paint_shares(ax, stages: list[dict], window: tuple, tscale: float, width_px: int) -> None:
    """The panel a pixel column at a time: one image, a pixel per display pixel, whose lanes'
    columns are coloured by the share of their time each kind takes (white between lanes)."""
    edges = np.linspace(window[0], window[1], width_px + 1)  # (w + 1,) seconds
    height_px = max(1, int(round(ax.bbox.height)))
    rows_per_unit = height_px / len(stages)  # image rows per stage row (y is in stage rows)
    image = np.full((height_px, width_px, 3), 255, dtype=np.uint8)  # (h, w, 3) white
    for row, stage in enumerate(stages):
        for offset, height in sorted(set(LANES.values())):
            kinds = [k for k in GANTT_COLORS if LANES[k] == (offset, height)]
            strip = np.round(lane_strip(stage, kinds, edges) * 255).astype(np.uint8)  # (w, 3)
            top = (row + offset - 0.45 + 0.5) * rows_per_unit  # image row of the lane's top
            image[int(round(top)):int(round(top + height * rows_per_unit))] = strip
    draw_pixels(ax, image)


# ---------------------------------------------------------------- figure

def draw_panel(ax, stages: list[dict], window: tuple, tscale: float, width_px: int) -> None:
    """One panel: a row per stage over `window` (seconds), bars or pixel shares."""
    if median_bar_px(stages, window, width_px) >= MIN_BAR_PX:
        draw_bars(ax, stages, window, tscale)
    else:
        paint_shares(ax, stages, window, tscale, width_px)
    stage_ticks(ax, "y", [f"stage {s}" for s in range(len(stages))])
    ax.set_ylim(len(stages) - 0.5, -0.5)
    ax.set_xlim(window[0] / tscale, window[1] / tscale)


def _schedule_panels(fig) -> tuple:
    """The whole-iteration and zoom Axes (fixed margins) and their width in pixels."""
    height = (fig.get_size_inches()[1] - TOP - MIDDLE - BOTTOM) / 2
    whole = add_axes_in(fig, LEFT, BOTTOM + height + MIDDLE, RIGHT, TOP)
    zoom = add_axes_in(fig, LEFT, BOTTOM, RIGHT, TOP + height + MIDDLE)
    return whole, zoom, int(round((WIDTH - LEFT - RIGHT) * fig.dpi))


def _schedule_legend(fig) -> None:
    """A swatch per kind along the bottom edge."""
    from matplotlib.patches import Patch
    handles = [Patch(facecolor=c, edgecolor="white", label=k) for k, c in GANTT_COLORS.items()]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8,
               frameon=False)


def schedule_gantt(inputs) -> bytes | None:
    """The pipeline schedule of every stage (ScheduleFigure): the whole iteration,
    then a zoom on the pipeline fill; None without matplotlib."""
    stages = list(inputs.schedule)
    fig = new_figure(WIDTH, 2.2 + 0.75 * len(stages))
    if fig is None:
        return None
    unit, tscale = time_unit(inputs.end_s)
    whole, zoom, width_px = _schedule_panels(fig)
    draw_panel(whole, stages, (0.0, inputs.end_s or 1.0), tscale, width_px)
    whole.set_title(f"Pipeline schedule: {inputs.label}")
    window = inputs.zoom
    draw_panel(zoom, stages, window, tscale, width_px)
    zoom.set_title(f"Zoom: the pipeline fill (first {window[1] / tscale:.3g} {unit})",
                   fontsize=10)
    zoom.set_xlabel(f"time ({unit})")
    _schedule_legend(fig)
    return png_bytes(fig)


# ---------------------------------------------------------------------------------------------
# Memory of every stage
# ---------------------------------------------------------------------------------------------
#
# Memory over one iteration for every pipeline stage: small multiples of stacked step areas
# (bytes per category), the capacity dashed, each stage's peak in its title.
#
# Drawn into one inch-scaled Axes (report/drawing.py, small multiples): one polygon collection
# per category over all the
# panels, so the cost grows with the number of stages by a few milliseconds each.

COLORS = {"weights": "#4c72b0", "gradients": "#55a868", "optimizer": "#8172b2",
          "activations": "#c44e52", "temporaries": "#dd8452", "communication": "#937860"}
MEMORY_POINTS = 600  # per stage panel: the downsampling keeps each bucket's max, so the peak
COLS = 4
HEADROOM = 1.08  # the y range over the larger of the highest peak and the capacity


def stage_polygons(memory, end_s: float, y_top: float) -> np.ndarray | None:
    """(6, m, 2): one stage's (StageMemory) stacked category areas, time / end_s
    and bytes / y_top (each in [0, 1]), the last state held to the end of the iteration; None
    without memory events."""
    times, state = memory.timeline(MEMORY_POINTS)  # (n,), (n, 6)
    if not len(times):
        return None
    times = np.append(times, max(end_s, times[-1]))  # (n + 1,)
    state = np.vstack([state, state[-1:]]) / y_top  # (n + 1, 6)
    return stacked_step_polygons(times / (end_s or 1.0), state)


def _stage_areas(ax, grid: PanelGrid, stages: tuple, end_s: float, y_top: float) -> None:
    """One PolyCollection per category holding that category's area in every panel."""
    from matplotlib.collections import PolyCollection
    by_category = [[] for _ in CATEGORIES]
    for panel, memory in enumerate(stages):
        polygons = stage_polygons(memory, end_s, y_top)
        for c, outline in enumerate(() if polygons is None else polygons):
            by_category[c].append(grid.place(outline[:, 0], outline[:, 1], panel))
    for category, outlines in zip(CATEGORIES, by_category):
        ax.add_collection(PolyCollection(outlines, facecolors=COLORS[category], linewidths=0,
                                         zorder=1), autolim=False)


def _decor(ax, grid: PanelGrid, capacity: float, ticks: tuple) -> None:
    """Frames, grid lines, tick marks and each panel's dashed capacity line (relative units)."""
    from matplotlib.collections import LineCollection, PolyCollection
    (xs, _), (ys, _) = ticks
    ax.add_collection(LineCollection(grid_segments(grid, xs, ys), **GRID), autolim=False)
    ax.add_collection(PolyCollection(frames(grid), facecolors="none", edgecolors="black",
                                     linewidths=0.8, zorder=2.5), autolim=False)
    ax.add_collection(LineCollection(tick_segments(grid, xs, ys), colors="black",
                                     linewidths=0.8), autolim=False)
    line = grid_segments(grid, [], [capacity])  # (panels, 2, 2)
    ax.add_collection(LineCollection(line, colors="black", linestyles="--", linewidths=1,
                                     zorder=2), autolim=False)


def _ticks(end_s: float, y_top: float, units: tuple) -> tuple:
    """((relative x, labels), (relative y, labels)) in the display units."""
    (_, scale), (_, tscale) = units
    x_values = nice_ticks(end_s / tscale, 6)
    y_values = nice_ticks(y_top / scale, 5)
    return ((x_values / (end_s / tscale or 1.0), tick_labels(x_values)),
            (y_values / (y_top / scale), tick_labels(y_values)))


def _title(memory, units) -> tuple[str, str]:
    """(text, colour) of one panel: stage, rank and peak; red when out of memory."""
    (name, scale), _ = units
    text = (f"stage {memory.stage} (rank {memory.rank}): peak "
            f"{memory.peak_total / scale:.1f} {name}" + (", OUT OF MEMORY" if memory.oom else ""))
    return text, "#b00020" if memory.oom else "black"


def _stages_legend(fig, grid: PanelGrid) -> None:
    """Category swatches and the capacity line, centred under the figure title."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    handles = [Patch(color=COLORS[c], label=c) for c in CATEGORIES]
    handles.append(Line2D([], [], color="black", linestyle="--", linewidth=1, label="capacity"))
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, 1 - 0.42 / grid.height))


def memory_over_time(inputs) -> bytes | None:
    """Small multiples: memory over time of every pipeline stage (MemoryFigures),
    capacity dashed; None without matplotlib."""
    stages, end_s = inputs.memory, inputs.end_s
    capacity = stages[0].capacity_bytes
    y_top = max(max(m.peak_total for m in stages), capacity) * HEADROOM
    units = (memory_unit(y_top / HEADROOM), time_unit(end_s))
    grid = PanelGrid(len(stages), min(COLS, len(stages)))
    fig = new_figure(grid.width, grid.height)
    if fig is None:
        return None
    ax = new_sheet(fig, grid)
    ticks = _ticks(end_s, y_top, units)
    _stage_areas(ax, grid, stages, end_s, y_top)
    _decor(ax, grid, capacity / y_top, ticks)
    panel_titles(ax, grid, [_title(memory, units) for memory in stages])
    label_axes(ax, grid, ticks[0], ticks[1], (f"time ({units[1][0]})", units[0][0]))
    fig.suptitle(f"Memory over one iteration, every pipeline stage: {inputs.label}",
                 y=1 - 0.08 / grid.height, va="top")
    _stages_legend(fig, grid)
    return png_bytes(fig)


# ---------------------------------------------------------------------------------------------
# The figures' inputs
# ---------------------------------------------------------------------------------------------
#
# What the run report's figures show, taken from a finished run as plain numbers and numpy
# arrays, so that another process can draw them from these alone (report/painter.py).
#
# Each field is what the drawing code used to read from the run itself: a stage's memory
# timeline (memory timelines, exact peak), its summary's peak, and its schedule intervals
# (stage_intervals, the schedule chart); the figures are the same bytes whichever process
# draws them.

@dataclass(frozen=True)
class StageMemory:
    """One pipeline stage's memory (its tp 0, dp 0 rank): the finest timeline and its peak."""

    stage: int
    rank: int
    times: np.ndarray  # (n,) seconds of each kept change, n <= MAX_MEMORY_POINTS
    state: np.ndarray  # (n, 6) int64 bytes per category after each change
    peak_total: int  # bytes at the stage's peak
    peak_time_s: float
    oom: bool  # the stage ran out of memory
    capacity_bytes: int

    def timeline(self, max_points: int) -> tuple[np.ndarray, np.ndarray]:
        """(times (m,), state (m, 6)), m <= max_points, the peak kept (memory_timeline)."""
        return coarser(self.times, self.state, max_points)


@dataclass(frozen=True)
class MemoryFigures:
    """Inputs of the memory-over-time figures: every stage (memory_stages.png) and the first
    and last (memory.png)."""

    name: str  # the scenario's run name
    label: str  # the variant in a few words (summary_md.variant_label)
    end_s: float  # the iteration's end
    memory: tuple[StageMemory, ...]  # in stage order


@dataclass(frozen=True)
class ScheduleFigure:
    """Inputs of the pipeline schedule (schedule.png)."""

    label: str
    end_s: float
    schedule: tuple[dict, ...]  # per stage {kind: (n, 2) [start_s, end_s]}
    zoom: tuple[float, float]  # the pipeline fill's window, seconds
    replayed: bool  # meta-mode layer templates: recompute only inside backward bars


def stage_memory(run, stage: int, rank: int) -> StageMemory:
    """One stage's memory inputs from its rank's ledger."""
    ledger = run.inputs.world.ranks[rank].ledger
    times, state = memory_timeline(ledger)  # (n,), (n, 6)
    summary = ledger.summary()
    return StageMemory(stage, rank, times, state, summary.peak_total, summary.peak_time_s,
                       summary.oom is not None, ledger.capacity_bytes)


def memory_figures_of(run, label: str) -> MemoryFigures:
    """The memory figures' inputs from a finished run."""
    memory = tuple(stage_memory(run, s, r) for s, r in enumerate(stage_ranks(run)))
    return MemoryFigures(run.inputs.sc.run.name, label, _end_s(run), memory)


def schedule_figure_of(run, label: str) -> ScheduleFigure:
    """The schedule's inputs from a finished run."""
    ranks = stage_ranks(run)
    spans = stage_spans(run, ranks)
    return ScheduleFigure(label, _end_s(run),
                          tuple(stage_intervals(run, r, spans[r]) for r in ranks),
                          zoom_window(run, ranks[0]), replayed(run))


def _end_s(run) -> float:
    """When the iteration ends: its last rank's end."""
    return max(run.results.end_s.values(), default=0.0)


# ---------------------------------------------------------------------------------------------
# memory.png: the first and the last stage
# ---------------------------------------------------------------------------------------------
#
# Memory over one iteration, stacked by category, for the first and the last pipeline stage (PNG).
#
# Optional: needs matplotlib (`pip install simsp[plot]`); without it write_memory_plot returns None.
# Reads the same downsampled ledger timeline as the Chrome trace, so the drawn peak is exact.
# Matplotlib's object API with fixed margins; the areas are stackplot's (post steps).

PANEL_IN, TOP_IN, GAP_IN, BOTTOM_IN = 3.6, 0.55, 0.55, 0.55  # panel pitch; margins (inches)


def plotted_stages(stages: tuple) -> list:
    """Stage 0 and the last stage of `stages` (StageMemory, in stage order)."""
    return [stages[i] for i in sorted({0, len(stages) - 1})]


def _unit(nbytes: float) -> tuple[str, int]:
    """The largest binary unit not above `nbytes` (GiB for paper models, KiB for toys)."""
    return next(((n, v) for n, v in (("GiB", GiB), ("MiB", MiB)) if nbytes >= v), ("KiB", KiB))


def _plot_areas(ax, times: np.ndarray, layers: np.ndarray) -> None:
    """The stacked category areas of `layers` (n, 6) over `times` (n,), each value held until
    the next time."""
    ax.stackplot(times, layers.T, step="post", linewidth=0,
                 colors=[COLORS[c] for c in CATEGORIES])


def _draw(ax, memory, title: str, end_s: float, units) -> None:
    """One stage's panel (StageMemory): stacked areas, capacity (when in sight),
    peak marker and title."""
    (mem, scale), (tu, tscale) = units
    times, state = memory.times, memory.state
    if len(times) == 0:
        ax.set_title(title + " (no memory events)")
        return
    if end_s > times[-1]:  # hold the last state to the end of the iteration
        times, state = np.append(times, end_s), np.vstack([state, state[-1:]])
    _plot_areas(ax, times / tscale, state / scale)  # each state holds until the next event
    capacity = memory.capacity_bytes
    top = memory.peak_total
    if capacity <= 4 * memory.peak_total:  # the capacity line only when it is in sight
        ax.axhline(capacity / scale, color="black", linestyle="--", linewidth=1,
                   label="capacity")
        top = max(top, capacity)
    ax.plot([memory.peak_time_s / tscale], [memory.peak_total / scale], marker="v",
            color="black", linestyle="none", label="peak")
    verdict = ", OUT OF MEMORY" if memory.oom else ""
    ax.set_title(f"{title}: peak {memory.peak_total / scale:.2f} {mem} at "
                 f"{memory.peak_time_s / tscale:.3f} {tu} (capacity {capacity / GiB:.0f} GiB)"
                 f"{verdict}")
    ax.set_ylabel(mem)
    ax.set_ylim(0, top / scale * 1.05)
    ax.grid(True, alpha=0.3)


def _plot_panels(fig, count: int) -> list:
    """`count` Axes stacked top to bottom with fixed margins, sharing the time axis."""
    left, right = 0.8, 0.25
    height = (fig.get_size_inches()[1] - TOP_IN - BOTTOM_IN - (count - 1) * GAP_IN) / count
    axes = []
    for i in range(count):
        bottom = BOTTOM_IN + (count - 1 - i) * (height + GAP_IN)
        top = fig.get_size_inches()[1] - bottom - height
        axes.append(add_axes_in(fig, left, bottom, right, top))
    return axes


def _plot_legend(fig, axes) -> None:
    """Category swatches, the capacity line and the peak marker along the top edge."""
    from matplotlib.patches import Patch
    handles = [Patch(color=COLORS[c], label=c) for c in CATEGORIES]
    for ax in axes[:1]:
        handles += ax.get_legend_handles_labels()[0]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8,
               frameon=False)


def memory_plot_png(inputs) -> bytes | None:
    """memory.png of the first and last stage (MemoryFigures); None without
    matplotlib."""
    panels = plotted_stages(inputs.memory)
    fig = new_figure(11, TOP_IN + BOTTOM_IN + PANEL_IN * len(panels) - GAP_IN)
    if fig is None:
        return None
    end_s = inputs.end_s
    units = (_unit(max(memory.peak_total for memory in panels)), time_unit(end_s))
    axes = _plot_panels(fig, len(panels))
    for ax, memory in zip(axes, panels):
        _draw(ax, memory, f"{inputs.name}: stage {memory.stage} (rank {memory.rank})", end_s,
              units)
        ax.set_xlim(0, end_s / units[1][1] or None)
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=False)
    axes[-1].set_xlabel(f"time ({units[1][0]})")
    _plot_legend(fig, axes)
    return png_bytes(fig)  # fixed metadata: the same run gives the same bytes


def write_memory_plot(run, path) -> Path | None:
    """Write memory.png of `run` to `path` and return it; None (nothing written) without
    matplotlib."""
    png = memory_plot_png(memory_figures_of(run, ""))
    if png is None:
        return None
    path = Path(path)
    write_file(path, png)
    return path


# ---------------------------------------------------------------------------------------------
# The figures of the report
# ---------------------------------------------------------------------------------------------
#
# The pictures of the run report (matplotlib's object API on the Agg canvas), as PNG bytes.
#
# Memory over time for every pipeline stage (memory_stages: small multiples, capacity marked),
# the pipeline schedule as a Gantt chart (the schedule chart), exposed time per stage as stacked
# bars, and
# memory by category at each stage's peak. Every PNG is a deterministic function of the run:
# fixed size, dpi, margins and metadata.


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


def memory_at_peak_bars(metrics: dict, capacity_bytes: int, label: str) -> bytes | None:
    """Memory by category at each stage's peak moment, with the capacity line."""
    fig, ax = bar_figure(3.8)
    if fig is None:
        return None
    rows = stage_memory_rows(metrics)
    top = max(max(r["peak_bytes"] for r in rows), capacity_bytes)
    unit, scale = memory_unit(top)
    columns = [(c, COLORS[c], [r["at_peak_bytes"].get(c, 0) / scale for r in rows])
               for c in CATEGORIES]
    _stacked_bars(ax, columns, len(rows))
    ax.axhline(capacity_bytes / scale, color="black", linestyle="--", linewidth=1,
               label="capacity")
    ax.set_ylim(0, top / scale * 1.1)
    ax.set_ylabel(unit)
    _bar_legend(fig, ax, 7)
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


MEMORY_CAPTION = ("Memory over one iteration for every pipeline stage (stacked by category; "
                  "dashed line: capacity).")
SCHEDULE_CAPTION = ("Pipeline schedule: forward and backward steps, recompute, waits for input "
                    "(grey), and pipeline transfers and DP communication below each row. Where "
                    "steps are narrower than a few pixels, each pixel column is coloured by the "
                    "share of its time each kind takes.")
REPLAYED_NOTE = (" Recompute is drawn inside the backward bars here: meta mode's replayed layer "
                 "templates keep no per-op detail (--no-shortcuts shows it).")


def capacity_of(run) -> int:
    """Device memory in bytes, as stage 0's ledger has it."""
    return run.inputs.world.ranks[stage_ranks(run)[0]].ledger.capacity_bytes


def _drawn(made: list) -> list[tuple[str, str, bytes]]:
    """The (name, caption, png) figures that were drawn (png None: no matplotlib)."""
    return [(name, caption, png) for name, caption, png in made if png is not None]


def memory_pictures(inputs) -> list[tuple[str, str, bytes]]:
    """[memory_stages.png] from MemoryFigures: one painter job (report/painter.py;
    memory.png, from the same inputs, is another: memory_plot_png)."""
    return _drawn([("memory_stages.png", MEMORY_CAPTION, memory_over_time(inputs))])


def schedule_pictures(inputs) -> list[tuple[str, str, bytes]]:
    """[schedule.png] from ScheduleFigure: one painter job."""
    caption = SCHEDULE_CAPTION + (REPLAYED_NOTE if inputs.replayed else "")
    return _drawn([("schedule.png", caption, schedule_gantt(inputs))])


def metric_figures(metrics: dict, capacity: int, label: str) -> list[tuple[str, str, bytes]]:
    """The figures drawn from the metrics (and the device's `capacity` in bytes): exposed time,
    memory at each stage's peak, and the switches tried against an out-of-memory."""
    made = [("exposed.png", "Exposed time per stage: communication that no compute hid, and "
             "pipeline waits.", exposed_time_bars(metrics, label)),
            ("memory_at_peak.png", "Memory by category at each stage's peak moment.",
             memory_at_peak_bars(metrics, capacity, label))]
    explanation = metrics.get("oom_explanation")
    if explanation:
        made.append(("oom_switches.png", "Out of memory: the worst-stage peak of each candidate "
                     "switch, each from its own simulated iteration (green fits).",
                     switch_bars(explanation, label)))
    return _drawn(made)
