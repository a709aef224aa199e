"""Memory over one iteration, stacked by category, for the first and the last pipeline stage (PNG).

Optional: needs matplotlib (`pip install simsp[plot]`); without it write_memory_plot returns None.
Reads the same downsampled ledger timeline as the Chrome trace, so the drawn peak is exact.
"""

from pathlib import Path

from simsp.engine.ledger import CATEGORIES
from simsp.report.chrome_trace import memory_timeline
from simsp.units import GiB

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


def _draw(ax, ledger, capacity_bytes: int, title: str) -> None:
    times, state = memory_timeline(ledger.events)
    if len(times) == 0:
        ax.set_title(title + " (no memory events)")
        return
    # A step plot: each state holds until the next event.
    ax.stackplot(times, (state / GiB).T, labels=CATEGORIES, step="post",
                 colors=[COLORS[c] for c in CATEGORIES], linewidth=0)
    peak = ledger.summary()
    ax.axhline(capacity_bytes / GiB, color="black", linestyle="--", linewidth=1,
               label=f"capacity {capacity_bytes / GiB:.0f} GiB")
    ax.plot([peak.peak_time_s], [peak.peak_total / GiB], marker="v", color="black",
            linestyle="none", label=f"peak {peak.peak_total / GiB:.2f} GiB")
    ax.set_title(title)
    ax.set_ylabel("GiB")
    ax.set_xlim(times[0], times[-1])
    ax.set_ylim(0, max(capacity_bytes, peak.peak_total) / GiB * 1.05)
    ax.grid(True, alpha=0.3)


def write_memory_plot(run, path) -> Path | None:
    """Write the PNG to `path` and return it; None (nothing written) without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return None
    panels = plotted_ranks(run)
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 3.6 * len(panels)), squeeze=False)
    for ax, (stage, rank) in zip(axes[:, 0], panels):
        ledger = run.world.ranks[rank].ledger
        _draw(ax, ledger, ledger.capacity_bytes, f"{run.sc.run.name}: stage {stage} (rank {rank})")
    axes[-1, 0].set_xlabel("time (s)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path = Path(path)
    # Fixed metadata: the same run gives the same bytes.
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path
