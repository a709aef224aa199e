"""The what-if pictures (PNG), readable at 10 rows and at 1,000: the best N as labelled bars
(time, and where the time went), every row as one point of time against peak memory with the
winner and the Pareto front named, and peak memory as a distribution. Input: the results table,
already ranked best first (simsp.report.whatif.ranked)."""

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)
import numpy as np  # noqa: E402

from simsp.io_out import write_file  # noqa: E402
from simsp.units import GiB  # noqa: E402

TOP_BARS = 15  # rows named in the bar charts: the best, whatever the table's length
FRONT_LABELS = 8  # Pareto points named beside the winner
LABEL_CHARS = 88


def _save(fig, path: Path, whole: bool = False) -> Path:
    """Fixed metadata, so the same table gives the same bytes; `whole`: the canvas grows to
    every artist (labels placed beside the axes)."""
    fig.tight_layout()
    buffer = io.BytesIO()  # then written whole by simsp/io_out.py: never through a planted link
    fig.savefig(buffer, format="png", dpi=90, metadata={"Software": None},
                bbox_inches="tight" if whole else None)
    plt.close(fig)
    write_file(path, buffer.getvalue())
    return path


def _short(text: str) -> str:
    """A label of at most LABEL_CHARS characters."""
    text = str(text)
    return text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 1] + "…"


def _labels(frame) -> list[str]:
    """`#index variant` labels, matching the report's table."""
    return [_short(f"#{i} {v}") for i, v in zip(frame["index"], frame["variant"])]


def _fits(frame) -> np.ndarray:
    """(n,) whether each row fits (headroom ≥ 0 when known, else not out of memory)."""
    if "fits" in frame:
        return frame["fits"].fillna(False).astype(bool).to_numpy()
    return ~frame["oom"].astype(bool).to_numpy()


def pareto_front(times: np.ndarray, peaks: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats in both time and peak (n,) -> (k,) sorted by time."""
    order = np.lexsort((peaks, times))  # (n,) by time, then peak
    front, best_peak = [], np.inf
    for i in order:
        if peaks[i] < best_peak:
            front.append(i)
            best_peak = peaks[i]
    return np.array(front, dtype=int)


def plot_top(frame, path: Path, objective: str) -> Path:
    """The best TOP_BARS rows as horizontal bars of iteration time, best on top, each named;
    MFU and tokens/s per GPU written at the bar's end; rows that do not fit in red."""
    top = frame.head(TOP_BARS)
    fig, ax = plt.subplots(figsize=(13, 1.2 + 0.38 * len(top)))
    y = np.arange(len(top))[::-1]  # (k,) best at the top
    colors = np.where(_fits(top), "#4c72b0", "#c44e52")
    times = top["iteration_time_s"].to_numpy(dtype=float)  # (k,)
    ax.barh(y, times, color=colors)
    ax.set_yticks(y, _labels(top), fontsize=8)
    for yi, t, mfu, per_gpu in zip(y, times, top["mfu"], top["tokens_per_s"] / top["gpus"]):
        ax.text(t, yi, f" {t:.3g} s, MFU {mfu:.1%}, {per_gpu:,.0f} tok/s/GPU", va="center",
                fontsize=7)
    ax.set_xlim(0, times.max() * 1.45)
    shown = f"best {len(top)} of {len(frame)}" if len(frame) > len(top) else f"all {len(top)}"
    ax.set(xlabel="iteration time (s)",
           title=f"{shown} by {objective} (red: does not fit in memory less the reserve)")
    return _save(fig, path)


def plot_pareto(frame, path: Path) -> Path:
    """Every row as a point of iteration time against peak memory; the usable memory as a line;
    the Pareto front of the rows that fit drawn and its points named, the winner in bold."""
    fig, ax = plt.subplots(figsize=(14, 6))
    fits = _fits(frame)
    peaks = frame["peak_bytes_max"].to_numpy(dtype=float) / GiB  # (n,)
    times = frame["iteration_time_s"].to_numpy(dtype=float)  # (n,)
    small = 12 if len(frame) <= 100 else 5
    ax.scatter(peaks[fits], times[fits], s=small, color="#4c72b0", label="fits")
    ax.scatter(peaks[~fits], times[~fits], s=small, marker="x", color="#c44e52",
               label="does not fit")
    ax.axvline(frame["capacity_bytes"].max() / GiB, color="black", linestyle="--",
               label="GPU capacity")
    if "memory_reserve_bytes" in frame and frame["memory_reserve_bytes"].notna().any():
        usable = (frame["capacity_bytes"] - frame["memory_reserve_bytes"]).max() / GiB
        ax.axvline(usable, color="grey", linestyle=":", label="capacity less reserve")
    _draw_front(ax, frame[fits], peaks[fits], times[fits])
    ax.set(xlabel="peak memory, busiest stage (GiB)", ylabel="iteration time (s)",
           title=f"time vs memory, {len(frame)} configurations")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside: no point hidden
    return _save(fig, path, whole=True)


def _draw_front(ax, fitting, peaks: np.ndarray, times: np.ndarray) -> None:
    """The front as a step line; the winner (fastest that fits) and front points named, each
    label on its own row of a column beside the axes (under the legend), so no label overlaps
    another or hides a point, whatever the number of rows."""
    if not len(fitting):
        return
    front = pareto_front(times, peaks)  # (k,) by time
    order = front[np.argsort(peaks[front])]
    ax.step(peaks[order], times[order], where="post", color="#55a868", label="Pareto front")
    named = list(front[:FRONT_LABELS])
    span = times.max() - times.min() or times.max() or 1.0
    for slot, i in enumerate(named):
        label = fitting["variant"].iloc[i]
        winner = slot == 0
        text = _short(f"{'winner: ' if winner else ''}#{fitting['index'].iloc[i]} {label}")
        ax.annotate(text, (peaks[i], times[i]), xycoords="data", fontsize=7,
                    fontweight="bold" if winner else "normal",
                    xytext=(1.02, 0.04 + 0.055 * slot), textcoords="axes fraction", ha="left",
                    va="center",
                    arrowprops={"arrowstyle": "-", "color": "#999999", "lw": 0.6})
    ax.scatter(peaks[front[0]], times[front[0]], s=80, facecolors="none", edgecolors="black")
    ax.set_ylim(times.min() - 0.05 * span, None)


def plot_memory(frame, path: Path) -> Path:
    """Peak memory of the busiest stage as a histogram over the rows (fits / not stacked), with
    the capacity and the usable memory."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    fits = _fits(frame)
    peaks = frame["peak_bytes_max"].to_numpy(dtype=float) / GiB  # (n,)
    capacity = frame["capacity_bytes"].max() / GiB
    edges = np.linspace(0, max(capacity, peaks.max()) * 1.02, 41)  # (41,) GiB
    ax.hist([peaks[fits], peaks[~fits]], bins=edges, stacked=True,
            color=["#4c72b0", "#c44e52"], label=["fits", "does not fit"])
    ax.axvline(capacity, color="black", linestyle="--", label="GPU capacity")
    if "memory_reserve_bytes" in frame and frame["memory_reserve_bytes"].notna().any():
        usable = (frame["capacity_bytes"] - frame["memory_reserve_bytes"]).max() / GiB
        ax.axvline(usable, color="grey", linestyle=":", label="capacity less reserve")
    ax.set(xlabel="peak memory, busiest stage (GiB)", ylabel="configurations",
           title=f"peak memory over {len(frame)} configurations")
    ax.legend(fontsize=8)
    return _save(fig, path)


def exposed_kinds(frame) -> list[str]:
    """`exposed_<kind>_s` columns, one per kind of exposed time other than compute itself."""
    return [c for c in frame.columns if c.startswith("exposed_") and c.endswith("_s")
            and c not in ("exposed_comm_s", "exposed_compute_s")]


def plot_exposed(frame, path: Path) -> Path:
    """Where the best rows' time goes beyond compute, stacked per row: the pipeline bubble,
    time × bubble fraction (the idle share, metrics.timing.bubble), then each kind of exposed
    communication."""
    top = frame.head(TOP_BARS)
    fig, ax = plt.subplots(figsize=(14, 1.4 + 0.38 * len(top)))
    y = np.arange(len(top))[::-1]  # (k,) best at the top
    time = top["iteration_time_s"].to_numpy(dtype=float)  # (k,)
    left = time * top["bubble_fraction"].to_numpy(dtype=float)  # (k,)
    ax.barh(y, left, color="#bbbbbb", label="bubble")
    for column in (c for c in exposed_kinds(top) if not c.endswith("_wait_s")):  # waits: bubble
        values = top[column].fillna(0.0).to_numpy(dtype=float)  # (k,)
        ax.barh(y, values, left=left, label=column[len("exposed_"):-2])
        left = left + values
    ax.set_yticks(y, _labels(top), fontsize=8)
    ax.set(xlabel="seconds per iteration (busiest stage)",
           title="bubble and exposed communication of the best rows")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def write_plots(frame, out: Path, objective: str = "time") -> list[Path]:
    """The four pictures, from the rows that simulated (errors have no numbers), best first."""
    done = frame[frame["status"] != "error"].reset_index(drop=True)
    if done.empty:
        return []
    return [plot_top(done, out / "top.png", objective), plot_pareto(done, out / "pareto.png"),
            plot_memory(done, out / "memory.png"), plot_exposed(done, out / "exposed.png")]
