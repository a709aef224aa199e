"""Memory over one iteration, stacked by category, for the first and the last pipeline stage (PNG).

Optional: needs matplotlib (`pip install simsp[plot]`); without it write_memory_plot returns None.
Reads the same downsampled ledger timeline as the Chrome trace, so the drawn peak is exact.
Matplotlib's object API with fixed margins; the areas are numpy-built polygons (stacked_steps).
"""

from pathlib import Path

import numpy as np

from simsp.engine.ledger import CATEGORIES
from simsp.report.canvas import add_axes_in, new_figure, png_bytes
from simsp.report.memory_stages import COLORS
from simsp.report.memory_timeline import memory_timeline
from simsp.report.stacked_steps import stacked_step_polygons
from simsp.units import GiB, KiB, MiB

PANEL_IN, TOP_IN, GAP_IN, BOTTOM_IN = 3.6, 0.55, 0.55, 0.55  # panel pitch; margins (inches)


def plotted_ranks(run) -> list[tuple[int, int]]:
    """[(stage, rank)] for stage 0 and the last stage (the tp 0, dp 0 rank of each)."""
    last = run.sc.parallel.pp - 1
    return [(pp, run.rank_of(0, 0, pp)) for pp in sorted({0, last})]


def _unit(nbytes: float) -> tuple[str, int]:
    """The largest binary unit not above `nbytes` (GiB for paper models, KiB for toys)."""
    return next(((n, v) for n, v in (("GiB", GiB), ("MiB", MiB)) if nbytes >= v), ("KiB", KiB))


def _time_unit(seconds: float) -> tuple[str, float]:
    """s, ms or us for the time axis."""
    return next(((n, v) for n, v in (("s", 1.0), ("ms", 1e-3)) if seconds >= v), ("us", 1e-6))


def _areas(ax, times: np.ndarray, layers: np.ndarray) -> None:
    """The stacked category areas of `layers` (n, 6) over `times` (n,), a polygon each."""
    from matplotlib.collections import PolyCollection
    ax.add_collection(PolyCollection(stacked_step_polygons(times, layers), linewidths=0,
                                     facecolors=[COLORS[c] for c in CATEGORIES]))


def _draw(ax, ledger, title: str, end_s: float, units) -> None:
    """One stage's panel: stacked areas, capacity (when in sight), peak marker and title."""
    (mem, scale), (tu, tscale) = units
    times, state = memory_timeline(ledger)
    if len(times) == 0:
        ax.set_title(title + " (no memory events)")
        return
    if end_s > times[-1]:  # hold the last state to the end of the iteration
        times, state = np.append(times, end_s), np.vstack([state, state[-1:]])
    _areas(ax, times / tscale, state / scale)  # each state holds until the next event
    summary, capacity = ledger.summary(), ledger.capacity_bytes
    top = summary.peak_total
    if capacity <= 4 * summary.peak_total:  # the capacity line only when it is in sight
        ax.axhline(capacity / scale, color="black", linestyle="--", linewidth=1,
                   label="capacity")
        top = max(top, capacity)
    ax.plot([summary.peak_time_s / tscale], [summary.peak_total / scale], marker="v",
            color="black", linestyle="none", label="peak")
    verdict = ", OUT OF MEMORY" if summary.oom else ""
    ax.set_title(f"{title}: peak {summary.peak_total / scale:.2f} {mem} at "
                 f"{summary.peak_time_s / tscale:.3f} {tu} (capacity {capacity / GiB:.0f} GiB)"
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


def write_memory_plot(run, path) -> Path | None:
    """Write the PNG to `path` and return it; None (nothing written) without matplotlib."""
    panels = plotted_ranks(run)
    fig = new_figure(11, TOP_IN + BOTTOM_IN + PANEL_IN * len(panels) - GAP_IN)
    if fig is None:
        return None
    end_s = max(run.end_s.values(), default=0.0)
    ledgers = [run.world.ranks[rank].ledger for _, rank in panels]
    units = (_unit(max(ledger.peak_total for ledger in ledgers)), _time_unit(end_s))
    axes = _panels(fig, len(panels))
    for ax, (stage, rank), ledger in zip(axes, panels, ledgers):
        _draw(ax, ledger, f"{run.sc.run.name}: stage {stage} (rank {rank})", end_s, units)
        ax.set_xlim(0, end_s / units[1][1] or None)
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=False)
    axes[-1].set_xlabel(f"time ({units[1][0]})")
    _legend(fig, axes)
    path = Path(path)
    path.write_bytes(png_bytes(fig))  # fixed metadata: the same run gives the same bytes
    return path
