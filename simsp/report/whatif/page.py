"""The what-if page against a baseline: whatif.md and one self-contained whatif.html with a
conclusion per variant, the vs-baseline table, the exposure side by side, the ranking by the
user's objective, the command of each variant, and charts labelled by variant name."""

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)
import numpy as np  # noqa: E402

from simsp.io_out import markdown_text, write_file  # noqa: E402
from simsp.report.html import figure, page, to_html  # noqa: E402
from simsp.report.whatif.comparison import (OBJECTIVES, baseline_line,  # noqa: E402
                                            busiest_stage, change, conclusion, exposure,
                                            kinds_of)
from simsp.units import GiB  # noqa: E402


def _delta(new, old, digits: str = ".1%") -> str:
    """`+3.2%` (relative change)."""
    return format(change(new, old), "+" + digits)


def comparison_table(rows: list[dict], base: dict) -> list[str]:
    """Each variant's time, tokens/s, per GPU, MFU, peak memory and cost, each with its change
    against the baseline in brackets."""
    lines = ["| variant | GPUs | time (s) | tokens/s | tokens/s per GPU | MFU | peak (GiB) | "
             "headroom (GiB) | GPU-hours per 1M tokens |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        if row["status"] == "error":
            lines.append(f"| {markdown_text(row['variant'])} | | invalid | | | | | | |")
            continue
        mfu_points = 100 * (row["mfu"] - base["mfu"])
        lines.append(
            f"| {markdown_text(row['variant'])} | {row['gpus']} | {row['iteration_time_s']:.4g} "
            f"({_delta(row['iteration_time_s'], base['iteration_time_s'])}) | "
            f"{row['tokens_per_s']:,.0f} ({_delta(row['tokens_per_s'], base['tokens_per_s'])}) | "
            f"{row['tokens_per_s_per_gpu']:,.1f} "
            f"({_delta(row['tokens_per_s_per_gpu'], base['tokens_per_s_per_gpu'])}) | "
            f"{row['mfu']:.1%} ({mfu_points:+.1f} pts) | {row['peak_bytes_max'] / GiB:.1f} "
            f"({(row['peak_bytes_max'] - base['peak_bytes_max']) / GiB:+.1f}) | "
            f"{row['headroom_bytes'] / GiB:.1f} | {row['gpu_hours_per_million_tokens']:.4g} "
            f"({_delta(row['gpu_hours_per_million_tokens'], base['gpu_hours_per_million_tokens'])}) |")
    return lines


PARTITION = ("Seconds of each variant's busiest pipeline stage (the one that waited least on "
             "its peers) by what it was doing; the parts partition the iteration, each second "
             "counted once: compute is kernels, bubble is waiting on a peer stage (fill, drain "
             "and the idle tail), each comm kind is time blocked on it (docs/exploration.md).")


def exposure_table(rows: list[dict]) -> list[str]:
    """Seconds per kind (rows) by variant (columns), the busiest stage of each; they add up to
    the iteration (the last row)."""
    done = [row for row in rows if row["status"] != "error"]
    lines = [PARTITION, "",
             "| seconds | " + " | ".join(markdown_text(r["variant"]) for r in done) + " |",
             "|---|" + "---:|" * len(done),
             "| busiest stage | " + " | ".join(str(busiest_stage(r)) for r in done) + " |"]
    spent = [exposure(row) for row in done]
    for kind in kinds_of(done):
        lines.append(f"| {kind} | " + " | ".join(f"{s[kind]:.3f}" for s in spent) + " |")
    lines.append("| **iteration (sum)** | " + " | ".join(f"{r['iteration_time_s']:.3f}" for r in done)
                 + " |")
    return lines


def ranking_lines(ranked: list[dict], objective: str) -> list[str]:
    """Variants best first by the objective (those that fit first)."""
    column, _ = OBJECTIVES[objective]
    shown = {"iteration_time_s": "{:.3f} s", "tokens_per_s": "{:,.0f} tokens/s",
             "tokens_per_s_per_gpu": "{:,.1f} tokens/s per GPU", "mfu": "MFU {:.1%}",
             "gpu_hours_per_million_tokens": "{:.3f} GPU-hours per million tokens"}[column]
    lines = [f"Ranked by {objective}, variants that fit first:", ""]
    for place, row in enumerate(ranked, 1):
        value = "invalid" if row["status"] == "error" else shown.format(row[column])
        fits = "" if row.get("fits", True) else " (does not fit)"
        lines.append(f"{place}. {markdown_text(row['variant'])}: {value}{fits}")
        lines.append("")
    return lines


def whatif_markdown(rows: list[dict], ranked: list[dict], objective: str,
                    pictures: list[Path]) -> str:
    """The whole whatif.md: conclusions, tables, ranking, commands, pictures."""
    base = rows[0]
    lines = ["# What-if against the baseline", "", markdown_text(baseline_line(base)), "",
             f"{base['iteration_time_s']:.3f} s per iteration, {base['tokens_per_s']:,.0f} tokens/s. "
             "Time, exposure and memory are simulated by simsp; cost is GPU-hours per million "
             "tokens (GPUs × iteration time / tokens per iteration).", "", "## Conclusions", ""]
    for row in rows[1:]:
        lines += [markdown_text(conclusion(row, base)), ""]
    lines += ["## Against the baseline", "", *comparison_table(rows, base), "",
              "## Where the time goes", "", *exposure_table(rows), "",
              "## Ranking", "", *ranking_lines(ranked, objective), "## Commands", ""]
    for row in rows:
        command = (row.get("command") or "(no run flags for it)").replace("`", "'")
        lines += [f"{markdown_text(row['variant'])}: `{command}`", ""]
    if pictures:
        lines += ["## Pictures", ""] + [f"![{p.stem}]({p.name})" for p in pictures]
    return "\n".join(lines) + "\n"


def _save(fig, path: Path) -> Path:
    """The figure as PNG bytes, written whole by simsp/io_out.py (never through a link)."""
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    write_file(path, buffer.getvalue())
    return path


def plot_vs_baseline(rows: list[dict], path: Path) -> Path:
    """Per variant, the change against the baseline of time, tokens/s per GPU and cost."""
    done = [r for r in rows[1:] if r["status"] != "error"]
    base = rows[0]
    metrics = (("iteration time", "iteration_time_s"), ("tokens/s", "tokens_per_s"),
               ("tokens/s per GPU", "tokens_per_s_per_gpu"),
               ("GPU-hours per token", "gpu_hours_per_million_tokens"))
    fig, ax = plt.subplots(figsize=(11, 1.5 + 0.9 * max(1, len(done))))
    y = np.arange(len(done))[::-1]  # (variants,) first at the top
    height = 0.8 / len(metrics)
    low = high = 0.0
    for j, (label, column) in enumerate(metrics):
        values = [100 * change(r[column], base[column]) for r in done]  # (variants,) percent
        bars = ax.barh(y + (1.5 - j) * height, values, height, label=label)
        ax.bar_label(bars, fmt="%+.1f%%", fontsize=7, padding=2)
        low, high = min(low, *values), max(high, *values)
    margin = 0.15 * ((high - low) or 1.0)  # room for the labels beyond the longest bars
    ax.set_xlim(low - margin if low < 0 else -margin / 3, high + margin)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(y, [r["variant"] for r in done], fontsize=9)
    ax.set(xlabel="change against the baseline (%): tokens/s up is better, time and GPU-hours "
                  "per token down", title="each variant against the baseline" + (
               "" if base["variant"] == "baseline" else f" ({base['variant']})"))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def plot_exposure(rows: list[dict], path: Path) -> Path:
    """Stacked seconds per kind for every variant (baseline first), labelled by name."""
    done = [r for r in rows if r["status"] != "error"]
    fig, ax = plt.subplots(figsize=(11, 1.5 + 0.6 * len(done)))
    y = np.arange(len(done))[::-1]  # (variants,)
    left = np.zeros(len(done))  # (variants,)
    for kind in kinds_of(done):
        values = np.array([exposure(r)[kind] for r in done])  # (variants,)
        ax.barh(y, values, left=left, label=kind)
        left += values
    ax.set_yticks(y, [r["variant"] for r in done], fontsize=9)
    ax.set(xlabel="seconds per iteration, busiest stage: the parts add up to the iteration",
           title="where the time goes: compute, bubble and exposed communication")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def plot_memory(rows: list[dict], path: Path) -> Path:
    """Peak memory of the busiest stage per variant, with capacity and capacity less reserve."""
    done = [r for r in rows if r["status"] != "error"]
    fig, ax = plt.subplots(figsize=(11, 1.5 + 0.6 * len(done)))
    y = np.arange(len(done))[::-1]  # (variants,)
    peaks = [r["peak_bytes_max"] / GiB for r in done]  # (variants,) GiB
    colors = ["#4c72b0" if r.get("fits", True) else "#c44e52" for r in done]
    ax.barh(y, peaks, color=colors)
    for yi, peak in zip(y, peaks):  # inside the bar's end: clear of the capacity lines
        ax.text(peak, yi, f"{peak:.1f} GiB ", ha="right", va="center", fontsize=8,
                color="white", fontweight="bold")
    capacity = max(r["capacity_bytes"] for r in done) / GiB
    ax.axvline(capacity, color="black", linestyle="--", label="GPU capacity")
    reserve = max(r.get("memory_reserve_bytes", 0) or 0 for r in done) / GiB
    ax.axvline(capacity - reserve, color="grey", linestyle=":", label="capacity less reserve")
    ax.set_yticks(y, [r["variant"] for r in done], fontsize=9)
    ax.set(xlabel="peak memory, busiest stage (GiB)", title="peak memory per variant (red: does not fit)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


WIDE_TABLES = "table{display:block;max-width:100%;overflow-x:auto}"
CAPTIONS = {"vs_baseline": "Each variant against the baseline: iteration time, tokens/s, "
                           "tokens/s per GPU and cost (GPU-hours per token).",
            "exposure": "Where the time goes, per variant: the busiest stage's iteration "
                        "partitioned (each bar's length is the iteration time).",
            "memory": "Peak memory per variant, with the GPU's capacity and the usable memory."}


def write_whatif_page(rows: list[dict], ranked: list[dict], objective: str, out: Path) -> list[Path]:
    """whatif.md, whatif.html and the three pictures under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    pictures = []
    if any(r["status"] != "error" for r in rows[1:]) and rows[0]["status"] != "error":
        pictures = [plot_vs_baseline(rows, out / "vs_baseline.png"),
                    plot_exposure(rows, out / "exposure.png"), plot_memory(rows, out / "memory.png")]
    text = whatif_markdown(rows, ranked, objective, pictures)
    write_file(out / "whatif.md", text)
    body_md = text.split("## Pictures")[0]
    body = to_html(body_md) + "".join(
        figure(p.read_bytes(), CAPTIONS[p.stem], p.stem) for p in pictures)
    write_file(out / "whatif.html", page("simsp what-if", body, style=WIDE_TABLES))
    return [out / "whatif.md", out / "whatif.html", *pictures]
