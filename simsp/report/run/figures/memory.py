"""Memory over one iteration: memory_stages.png for every pipeline stage, memory.png for the
first and the last, stacked by category, the capacity dashed.

Sections: every stage (small multiples of stacked step areas, each stage's peak in its title;
drawn into one inch-scaled Axes, report/run/figures/panels.py's small multiples: one polygon
collection per category over all the panels, so the cost grows with the number of stages by a
few milliseconds each), and memory.png (the first and the last stage).
"""

from pathlib import Path

import numpy as np

from simsp.io_out import write_file
from simsp.report.run.figures.drawing import (add_axes_in, memory_unit, new_figure, png_bytes,
                                              stacked_step_polygons, time_unit)
from simsp.report.run.figures.panels import (GRID, PanelGrid, frames, grid_segments, label_axes,
                                             new_sheet, nice_ticks, panel_titles, tick_labels,
                                             tick_segments)
from simsp.report.run.figures.inputs import memory_figures_of
from simsp.units import GiB, KiB, MiB


# ---------------------------------------------------------------------------------------------
# Memory of every stage
# ---------------------------------------------------------------------------------------------


COLORS = {"weights": "#4c72b0", "gradients": "#55a868", "optimizer": "#8172b2",
          "activations": "#c44e52", "temporaries": "#dd8452", "held_for_wgrad": "#ccb974",
          "communication": "#937860"}
MEMORY_POINTS = 600  # per stage panel: the downsampling keeps each bucket's max, so the peak
COLS = 4
HEADROOM = 1.08  # the y range over the larger of the highest peak and the capacity


def stage_polygons(memory, end_s: float, y_top: float, columns: list[int]) -> np.ndarray | None:
    """(k, m, 2): one stage's (StageMemory) stacked areas of the k categories at `columns`
    (MemoryFigures.columns), time / end_s and bytes / y_top (each in [0, 1]), the last state
    held to the end of the iteration; None without memory events."""
    times, state = memory.timeline(MEMORY_POINTS)  # (n,), (n, 7)
    if not len(times):
        return None
    times = np.append(times, max(end_s, times[-1]))  # (n + 1,)
    state = np.vstack([state, state[-1:]])[:, columns] / y_top  # (n + 1, k)
    return stacked_step_polygons(times / (end_s or 1.0), state)


def _stage_areas(ax, grid: PanelGrid, inputs, y_top: float) -> None:
    """One PolyCollection per drawn category (MemoryFigures) holding its area in every panel."""
    from matplotlib.collections import PolyCollection
    by_category = [[] for _ in inputs.categories]
    for panel, memory in enumerate(inputs.memory):
        polygons = stage_polygons(memory, inputs.end_s, y_top, inputs.columns())
        for c, outline in enumerate(() if polygons is None else polygons):
            by_category[c].append(grid.place(outline[:, 0], outline[:, 1], panel))
    for category, outlines in zip(inputs.categories, by_category):
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


def stages_legend_handles(categories: tuple[str, ...]) -> list:
    """The every-stage figure's legend: a swatch per drawn category, then the capacity line."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    handles = [Patch(color=COLORS[c], label=c) for c in categories]
    return handles + [Line2D([], [], color="black", linestyle="--", linewidth=1,
                             label="capacity")]


def _stages_legend(fig, grid: PanelGrid, categories: tuple[str, ...]) -> None:
    """Category swatches and the capacity line, centred under the figure title."""
    handles = stages_legend_handles(categories)
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
    _stage_areas(ax, grid, inputs, y_top)
    _decor(ax, grid, capacity / y_top, ticks)
    panel_titles(ax, grid, [_title(memory, units) for memory in stages])
    label_axes(ax, grid, ticks[0], ticks[1], (f"time ({units[1][0]})", units[0][0]))
    fig.suptitle(f"Memory over one iteration, every pipeline stage: {inputs.label}",
                 y=1 - 0.08 / grid.height, va="top")
    _stages_legend(fig, grid, inputs.categories)
    return png_bytes(fig)


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


def _plot_areas(ax, times: np.ndarray, layers: np.ndarray, categories: tuple[str, ...]) -> None:
    """The stacked areas of `layers` (n, k), a column for each of the k `categories`, over `times`
    (n,), each value held until the next time."""
    ax.stackplot(times, layers.T, step="post", linewidth=0,
                 colors=[COLORS[c] for c in categories])


def _draw(ax, memory, title: str, inputs, units) -> None:
    """One stage's panel (StageMemory) of MemoryFigures `inputs`: stacked areas of the drawn
    categories, capacity (when in sight), peak marker and title."""
    end_s = inputs.end_s
    (mem, scale), (tu, tscale) = units
    times, state = memory.times, memory.state
    if len(times) == 0:
        ax.set_title(title + " (no memory events)")
        return
    if end_s > times[-1]:  # hold the last state to the end of the iteration
        times, state = np.append(times, end_s), np.vstack([state, state[-1:]])
    _plot_areas(ax, times / tscale, state[:, inputs.columns()] / scale,  # held until the next
                inputs.categories)
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


def plot_legend_handles(categories: tuple[str, ...], axes) -> list:
    """memory.png's legend: a swatch per drawn category, then the first panel's capacity line
    and peak marker."""
    from matplotlib.patches import Patch
    handles = [Patch(color=COLORS[c], label=c) for c in categories]
    for ax in axes[:1]:
        handles += ax.get_legend_handles_labels()[0]
    return handles


def _plot_legend(fig, axes, categories: tuple[str, ...]) -> None:
    """Category swatches, the capacity line and the peak marker along the top edge."""
    handles = plot_legend_handles(categories, axes)
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
        _draw(ax, memory, f"{inputs.name}: stage {memory.stage} (rank {memory.rank})", inputs,
              units)
        ax.set_xlim(0, end_s / units[1][1] or None)
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=False)
    axes[-1].set_xlabel(f"time ({units[1][0]})")
    _plot_legend(fig, axes, inputs.categories)
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
