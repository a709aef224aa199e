"""Memory over one iteration, stacked by category, for the first and the last pipeline stage (PNG).

Optional: needs matplotlib (`pip install simsp[plot]`); without it write_memory_plot returns None.
Reads the same downsampled ledger timeline as the Chrome trace, so the drawn peak is exact.
Matplotlib's object API with fixed margins; the areas are numpy-built polygons (stacked_steps).
"""

from pathlib import Path

import numpy as np

from simsp.engine.ledger import CATEGORIES
from simsp.io_out import write_file
from simsp.report.canvas import add_axes_in, new_figure, png_bytes
from simsp.report.memory_stages import COLORS
from simsp.report.figure_inputs import memory_figures_of
from simsp.report.plot_units import time_unit
from simsp.report.stacked_steps import stacked_step_polygons
from simsp.units import GiB, KiB, MiB

PANEL_IN, TOP_IN, GAP_IN, BOTTOM_IN = 3.6, 0.55, 0.55, 0.55  # panel pitch; margins (inches)


def plotted_stages(stages: tuple) -> list:
    """Stage 0 and the last stage of `stages` (figure_inputs.StageMemory, in stage order)."""
    return [stages[i] for i in sorted({0, len(stages) - 1})]


def _unit(nbytes: float) -> tuple[str, int]:
    """The largest binary unit not above `nbytes` (GiB for paper models, KiB for toys)."""
    return next(((n, v) for n, v in (("GiB", GiB), ("MiB", MiB)) if nbytes >= v), ("KiB", KiB))


def _areas(ax, times: np.ndarray, layers: np.ndarray) -> None:
    """The stacked category areas of `layers` (n, 6) over `times` (n,), a polygon each."""
    from matplotlib.collections import PolyCollection
    ax.add_collection(PolyCollection(stacked_step_polygons(times, layers), linewidths=0,
                                     facecolors=[COLORS[c] for c in CATEGORIES]))


def _draw(ax, memory, title: str, end_s: float, units) -> None:
    """One stage's panel (figure_inputs.StageMemory): stacked areas, capacity (when in sight),
    peak marker and title."""
    (mem, scale), (tu, tscale) = units
    times, state = memory.times, memory.state
    if len(times) == 0:
        ax.set_title(title + " (no memory events)")
        return
    if end_s > times[-1]:  # hold the last state to the end of the iteration
        times, state = np.append(times, end_s), np.vstack([state, state[-1:]])
    _areas(ax, times / tscale, state / scale)  # each state holds until the next event
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


def _panels(fig, count: int) -> list:
    """`count` Axes stacked top to bottom with fixed margins, sharing the time axis."""
    left, right = 0.8, 0.25
    height = (fig.get_size_inches()[1] - TOP_IN - BOTTOM_IN - (count - 1) * GAP_IN) / count
    axes = []
    for i in range(count):
        bottom = BOTTOM_IN + (count - 1 - i) * (height + GAP_IN)
        top = fig.get_size_inches()[1] - bottom - height
        axes.append(add_axes_in(fig, left, bottom, right, top))
    return axes


def _legend(fig, axes) -> None:
    """Category swatches, the capacity line and the peak marker along the top edge."""
    from matplotlib.patches import Patch
    handles = [Patch(color=COLORS[c], label=c) for c in CATEGORIES]
    for ax in axes[:1]:
        handles += ax.get_legend_handles_labels()[0]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8,
               frameon=False)


def memory_plot_png(inputs) -> bytes | None:
    """memory.png of the first and last stage (figure_inputs.MemoryFigures); None without
    matplotlib."""
    panels = plotted_stages(inputs.memory)
    fig = new_figure(11, TOP_IN + BOTTOM_IN + PANEL_IN * len(panels) - GAP_IN)
    if fig is None:
        return None
    end_s = inputs.end_s
    units = (_unit(max(memory.peak_total for memory in panels)), time_unit(end_s))
    axes = _panels(fig, len(panels))
    for ax, memory in zip(axes, panels):
        _draw(ax, memory, f"{inputs.name}: stage {memory.stage} (rank {memory.rank})", end_s,
              units)
        ax.set_xlim(0, end_s / units[1][1] or None)
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=False)
    axes[-1].set_xlabel(f"time ({units[1][0]})")
    _legend(fig, axes)
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
