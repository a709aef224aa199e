"""Memory over one iteration, stacked by category, for the first and the last pipeline stage (PNG).

Optional: needs matplotlib (`pip install simsp[plot]`); without it write_memory_plot returns None.
Reads the same downsampled ledger timeline as the Chrome trace, so the drawn peak is exact.
"""

from pathlib import Path

import numpy as np

from simsp.engine.ledger import CATEGORIES
from simsp.report.memory_timeline import memory_timeline
from simsp.units import GiB, KiB, MiB

COLORS = {"weights": "#4c72b0", "gradients": "#55a868", "optimizer": "#8172b2",
          "activations": "#c44e52", "temporaries": "#dd8452", "communication": "#937860"}


def _pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or None when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plotted_ranks(run) -> list[tuple[int, int]]:
    """[(stage, rank)] for stage 0 and the last stage (the tp 0, dp 0 rank of each)."""
    last = run.sc.parallel.pp - 1
    return [(pp, run.rank_of(0, 0, pp)) for pp in sorted({0, last})]


def _unit(nbytes: float) -> tuple[str, int]:
    """The largest binary unit not above `nbytes` (GiB for paper models, KiB for toys)."""
    return next(((n, v) for n, v in (("GiB", GiB), ("MiB", MiB)) if nbytes >= v), ("KiB", KiB))


def _time_unit(seconds: float) -> tuple[str, float]:
    return next(((n, v) for n, v in (("s", 1.0), ("ms", 1e-3)) if seconds >= v), ("us", 1e-6))


def _draw(ax, ledger, title: str, end_s: float, units) -> None:
    (mem, scale), (tu, tscale) = units
    times, state = memory_timeline(ledger)
    if len(times) == 0:
        ax.set_title(title + " (no memory events)")
        return
    if end_s > times[-1]:  # hold the last state to the end of the iteration
        times, state = np.append(times, end_s), np.vstack([state, state[-1:]])
    # A step plot: each state holds until the next event.
    ax.stackplot(times / tscale, (state / scale).T, labels=CATEGORIES, step="post",
                 colors=[COLORS[c] for c in CATEGORIES], linewidth=0)
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


def write_memory_plot(run, path) -> Path | None:
    """Write the PNG to `path` and return it; None (nothing written) without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return None
    panels = plotted_ranks(run)
    end_s = max(run.end_s.values(), default=0.0)
    ledgers = [run.world.ranks[rank].ledger for _, rank in panels]
    units = (_unit(max(ledger.peak_total for ledger in ledgers)), _time_unit(end_s))
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 3.6 * len(panels)), squeeze=False,
                             sharex=True)
    for ax, (stage, rank), ledger in zip(axes[:, 0], panels, ledgers):
        _draw(ax, ledger, f"{run.sc.run.name}: stage {stage} (rank {rank})", end_s, units)
    axes[-1, 0].set_xlim(0, end_s / units[1][1] or None)  # shared by every panel
    axes[-1, 0].set_xlabel(f"time ({units[1][0]})")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path = Path(path)
    # Fixed metadata: the same run gives the same bytes.
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path
