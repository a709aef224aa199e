"""The pipeline schedule as a Gantt chart (schedule.png): one row per stage, steps on top,
transfers below; the whole iteration, then a zoom on the pipeline fill. Its inputs (each stage's
intervals by kind, the zoom window) are taken from the run here too.

Level of detail honest to the pixel: a panel whose steps are at least MIN_BAR_PX wide draws each
bar (white edges between them, as a bar chart does); a denser one, where bars are narrower than
the edges that would separate them, is painted as one image whose every pixel column shows the
exact share of its time each kind takes (pixel_coverage). Either way the cost is a few numpy
passes over the spans, not one matplotlib artist per bar.
"""

import numpy as np

from simsp.report.run.step_kinds import paired_steps, step_kind

from simsp.report.run.figures.drawing import add_axes_in, new_figure, png_bytes, time_unit
from simsp.report.run.figures.pixels import draw_pixels, painted_shares
from simsp.report.run.figures.stage_ticks import stage_ticks


GANTT_COLORS = {"forward": "#4c72b0", "backward": "#55a868", "weight gradient": "#937860",
                "F&B pair": "#da8bc3", "recompute": "#dd8452", "transfer": "#8172b2",
                "wait": "#d9d9d9", "DP communication": "#c44e52"}
# weight gradient: W steps (docs/schedules.md); F&B pair: the F, B and W of DualPipe's pairs
# (docs/dualpipe.md); the trace's colours by kind: report/run/step_kinds.py
STEP_KIND_NAMES = {"F": "forward", "B": "backward", "W": "weight gradient", "F&B": "F&B pair"}
OPTIONAL = ("weight gradient", "F&B pair")  # in the legend only when the schedule has them
LANES = {"forward": (0.0, 0.62), "backward": (0.0, 0.62), "weight gradient": (0.0, 0.62),
         "F&B pair": (0.0, 0.62), "wait": (0.0, 0.62),
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
    """{kind: (n, 2) [start_s, end_s]} of one stage: forward, backward, W and F&B pair steps,
    recompute, pipeline transfers, DP communication, and waits (gaps between consecutive
    steps)."""
    steps = run.results.steps.get(rank, [])
    paired = paired_steps(run, rank)
    kinds = [step_kind(kind, mb, chunk, paired) for kind, mb, chunk, _, _ in steps]
    _, _, _, begins, ends = zip(*steps) if steps else ((),) * 5  # transposed once
    kind_of = np.array(kinds, dtype=object)  # (n,) "F", "B", "W" or "F&B"
    bounds = np.column_stack([np.array(begins, dtype=float), np.array(ends, dtype=float)])
    order = np.argsort(bounds[:, 0], kind="stable")
    kind_of, bounds = kind_of[order], bounds[order]  # (n,), (n, 2) by start
    gaps = np.column_stack([bounds[:-1, 1], bounds[1:, 0]])  # (n - 1, 2)
    out = {name: bounds[kind_of == kind] for kind, name in STEP_KIND_NAMES.items()}
    out["wait"] = gaps[gaps[:, 1] > gaps[:, 0]]
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


def _schedule_legend(fig, stages: list) -> None:
    """A swatch per kind along the bottom edge (W steps' and F&B pairs' only when the schedule
    has them)."""
    from matplotlib.patches import Patch
    present = {k for k in OPTIONAL if any(len(stage[k]) for stage in stages)}
    handles = [Patch(facecolor=c, edgecolor="white", label=k) for k, c in GANTT_COLORS.items()
               if k not in OPTIONAL or k in present]
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
    _schedule_legend(fig, stages)
    return png_bytes(fig)
