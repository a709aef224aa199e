"""The what-if pictures (PNG): Pareto front of time against peak memory, MFU per variant,
per-stage peak memory per variant, exposed communication per variant. Input: the results table."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)
import numpy as np  # noqa: E402

from simsp.units import GiB  # noqa: E402


def _save(fig, path: Path) -> Path:
    """Fixed metadata, so the same table gives the same bytes."""
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
    return path


def _labels(frame) -> list[str]:


    """`#index` labels, matching the report's table."""
    return [f"#{i}" for i in frame["index"]]


def pareto_front(times: np.ndarray, peaks: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats in both time and peak (n,) -> (k,) sorted by time."""
    order = np.lexsort((peaks, times))  # (n,) by time, then peak
    front, best_peak = [], np.inf
    for i in order:
        if peaks[i] < best_peak:
            front.append(i)
            best_peak = peaks[i]
    return np.array(front, dtype=int)


def plot_pareto(frame, path: Path) -> Path:
    """Iteration time against peak memory; OOM rows marked; the GPU capacity as a line."""
    fig, ax = plt.subplots(figsize=(8, 5))
    fits = frame[~frame["oom"].astype(bool)]
    ooms = frame[frame["oom"].astype(bool)]
    ax.scatter(fits["peak_bytes_max"] / GiB, fits["iteration_time_s"], label="fits", color="#4c72b0")
    ax.scatter(ooms["peak_bytes_max"] / GiB, ooms["iteration_time_s"], marker="x", color="#c44e52",
               label="out of memory")
    front = pareto_front(fits["iteration_time_s"].to_numpy(), fits["peak_bytes_max"].to_numpy())
    if len(front):
        best = fits.iloc[front].sort_values("peak_bytes_max")
        ax.step(best["peak_bytes_max"] / GiB, best["iteration_time_s"], where="post",
                color="#55a868", label="Pareto front")
    ax.axvline(frame["capacity_bytes"].max() / GiB, color="black", linestyle="--", label="capacity")
    for label, x, y in zip(_labels(frame), frame["peak_bytes_max"] / GiB, frame["iteration_time_s"]):
        ax.annotate(label, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set(xlabel="peak memory, busiest stage (GiB)", ylabel="iteration time (s)",
           title="time vs memory")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_mfu(frame, path: Path) -> Path:
    """MFU of each variant (OOM bars hatched)."""
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(frame)), 4))
    colors = ["#c44e52" if oom else "#4c72b0" for oom in frame["oom"].astype(bool)]
    ax.bar(_labels(frame), 100 * frame["mfu"], color=colors)
    ax.set(ylabel="MFU (%)", title="model FLOPs utilisation (red: out of memory)")
    ax.tick_params(axis="x", labelsize=7, rotation=90)
    return _save(fig, path)


def stage_columns(frame, stem: str) -> list[str]:
    """`stem_stage0`, `stem_stage1`, ... present in the table, in stage order."""
    found = [c for c in frame.columns if c.startswith(f"{stem}_stage") and c[len(stem) + 6:].isdigit()]
    return sorted(found, key=lambda c: int(c[len(stem) + 6:]))


def plot_stage_memory(frame, path: Path) -> Path:
    """Peak memory of every pipeline stage, one line per variant, with the capacity."""
    fig, ax = plt.subplots(figsize=(8, 5))
    columns = stage_columns(frame, "peak_bytes")
    for label, (_, row) in zip(_labels(frame), frame.iterrows()):
        values = row[columns].to_numpy(dtype=float) / GiB  # (stages,) NaN beyond this layout's p
        ax.plot(np.arange(len(columns)), values, marker="o", markersize=3, label=label)
    ax.axhline(frame["capacity_bytes"].max() / GiB, color="black", linestyle="--", label="capacity")
    ax.set_xticks(np.arange(len(columns)))
    ax.set(xlabel="pipeline stage", ylabel="peak memory (GiB)", title="peak memory per stage")
    ax.legend(fontsize=6, ncol=4)
    return _save(fig, path)


def exposed_kinds(frame) -> list[str]:
    """`exposed_<kind>_s` columns, one per kind of communication."""
    return [c for c in frame.columns if c.startswith("exposed_") and c.endswith("_s")
            and c != "exposed_comm_s"]


def plot_exposed(frame, path: Path) -> Path:
    """Exposed time per variant, stacked: the pipeline bubble, time / (1 + bubble fraction) short
    of the iteration (N21 §2.2.1), then each kind of exposed communication (busiest stage each)."""
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(frame)), 4))
    time = frame["iteration_time_s"].to_numpy(dtype=float)  # (variants,)
    bottom = time - time / (1 + frame["bubble_fraction"].to_numpy(dtype=float))  # (variants,)
    ax.bar(_labels(frame), bottom, label="bubble", color="#bbbbbb")
    for column in exposed_kinds(frame):
        values = frame[column].fillna(0.0).to_numpy(dtype=float)  # (variants,)
        ax.bar(_labels(frame), values, bottom=bottom, label=column[len("exposed_"):-2])
        bottom += values
    ax.set(ylabel="exposed time (s)", title="bubble and exposed communication by kind")
    ax.tick_params(axis="x", labelsize=7, rotation=90)
    ax.legend(fontsize=8)
    return _save(fig, path)


def write_plots(frame, out: Path) -> list[Path]:
    """The four pictures of the report, from the rows that simulated (errors have no numbers)."""
    done = frame[frame["status"] != "error"].reset_index(drop=True)
    if done.empty:
        return []
    return [plot_pareto(done, out / "pareto.png"), plot_mfu(done, out / "mfu.png"),
            plot_stage_memory(done, out / "stage_memory.png"),
            plot_exposed(done, out / "exposed.png")]
