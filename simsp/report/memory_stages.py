"""Memory over one iteration for every pipeline stage: small multiples of stacked step areas
(bytes per category), the capacity dashed, each stage's peak in its title.

Drawn into one inch-scaled Axes (panel_grid): one polygon collection per category over all the
panels, so the cost grows with the number of stages by a few milliseconds each.
"""

import numpy as np

from simsp.engine.memory import CATEGORIES
from simsp.report.canvas import new_figure, png_bytes
from simsp.report.panel_grid import (GRID, PanelGrid, frames, grid_segments, label_axes,
                                     new_sheet, nice_ticks, panel_titles, tick_labels,
                                     tick_segments)
from simsp.report.stacked_steps import stacked_step_polygons
from simsp.report.plot_units import memory_unit, time_unit

COLORS = {"weights": "#4c72b0", "gradients": "#55a868", "optimizer": "#8172b2",
          "activations": "#c44e52", "temporaries": "#dd8452", "communication": "#937860"}
MEMORY_POINTS = 600  # per stage panel: the downsampling keeps each bucket's max, so the peak
COLS = 4
HEADROOM = 1.08  # the y range over the larger of the highest peak and the capacity


def stage_polygons(memory, end_s: float, y_top: float) -> np.ndarray | None:
    """(6, m, 2): one stage's (figure_inputs.StageMemory) stacked category areas, time / end_s
    and bytes / y_top (each in [0, 1]), the last state held to the end of the iteration; None
    without memory events."""
    times, state = memory.timeline(MEMORY_POINTS)  # (n,), (n, 6)
    if not len(times):
        return None
    times = np.append(times, max(end_s, times[-1]))  # (n + 1,)
    state = np.vstack([state, state[-1:]]) / y_top  # (n + 1, 6)
    return stacked_step_polygons(times / (end_s or 1.0), state)


def _areas(ax, grid: PanelGrid, stages: tuple, end_s: float, y_top: float) -> None:
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


def _legend(fig, grid: PanelGrid) -> None:
    """Category swatches and the capacity line, centred under the figure title."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    handles = [Patch(color=COLORS[c], label=c) for c in CATEGORIES]
    handles.append(Line2D([], [], color="black", linestyle="--", linewidth=1, label="capacity"))
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, 1 - 0.42 / grid.height))


def memory_over_time(inputs) -> bytes | None:
    """Small multiples: memory over time of every pipeline stage (figure_inputs.MemoryFigures),
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
    _areas(ax, grid, stages, end_s, y_top)
    _decor(ax, grid, capacity / y_top, ticks)
    panel_titles(ax, grid, [_title(memory, units) for memory in stages])
    label_axes(ax, grid, ticks[0], ticks[1], (f"time ({units[1][0]})", units[0][0]))
    fig.suptitle(f"Memory over one iteration, every pipeline stage: {inputs.label}",
                 y=1 - 0.08 / grid.height, va="top")
    _legend(fig, grid)
    return png_bytes(fig)
