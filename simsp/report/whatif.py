"""The what-if report (report.md): the configurations ranked, how each differs from the first
(as the flags that produce it), why the invalid ones failed, and the four pictures."""

from pathlib import Path

from simsp.io_out import markdown_text, write_file
from simsp.report.whatif_plots import exposed_kinds, write_plots
from simsp.units import GiB

RANK_KEYS = {"time": ("iteration_time_s", True), "tokens-per-s": ("tokens_per_s", False),
             "mfu": ("mfu", False), "memory": ("peak_bytes_max", True)}


def ranked(frame, objective: str = "time"):
    """Rows that fit first (by the objective), then out-of-memory rows, then invalid ones."""
    column, ascending = RANK_KEYS[objective]
    group = frame["status"].map({"ok": 0, "oom": 1, "error": 2})
    values = frame[column] if column in frame else frame["index"] * 0  # every row failed
    key = values if ascending else -values
    return frame.assign(_group=group, _key=key).sort_values(
        ["_group", "_key", "index"], kind="stable").drop(columns=["_group", "_key"])


def _verdict(row) -> str:
    """fits, invalid, or OOM with its stage and the bytes over."""
    if row["status"] == "error":
        return "invalid"
    if row["oom"]:
        return f"OOM stage {int(row['oom_stage'])} +{row['oom_bytes_over'] / GiB:.2f} GiB"
    return "fits"


def _cells(row, kinds: list[str]) -> list[str]:
    """One table line's cells for a simulated row."""
    exposed = " / ".join(f"{row[k]:.3f}" if row[k] == row[k] else "-" for k in kinds)
    return [f"{row['iteration_time_s']:.3f}", f"{row['tokens_per_s']:.0f}",
            f"{row['tflops_per_gpu']:.1f}", f"{row['mfu']:.1%}", f"{row['hfu']:.1%}",
            f"{row['bubble_fraction']:.1%}", exposed, f"{row['peak_bytes_max'] / GiB:.1f}",
            f"{row['headroom_bytes'] / GiB:.1f}", _verdict(row)]


def ranked_table(frame, objective: str = "time") -> list[str]:
    """The markdown table of the simulated rows, best first."""
    kinds = exposed_kinds(frame)
    names = " / ".join(k[len("exposed_"):-2] for k in kinds) or "-"
    lines = [f"| rank | # | variant | changes from #{frame['index'].iloc[0]} | time (s) | tokens/s | TFLOP/s/GPU | MFU | "
             f"HFU | bubble | exposed {names} (s) | peak (GiB) | headroom (GiB) | verdict |",
             "|" + "---|" * 14]
    done = ranked(frame, objective)
    done = done[done["status"] != "error"]
    for place, (_, row) in enumerate(done.iterrows(), 1):
        cells = [str(place), str(row["index"]), markdown_text(row["variant"]), f"`{row['changes']}`" if row["changes"] else "(first)"]
        lines.append("| " + " | ".join(cells + _cells(row, kinds)) + " |")
    return lines


def error_lines(frame) -> list[str]:
    """Invalid configurations with their `error:` text."""
    bad = frame[frame["status"] == "error"]
    if bad.empty:
        return []
    lines = ["", "## Invalid configurations", ""]
    lines += [f"- #{row['index']} {markdown_text(row['variant'])}: {markdown_text(row['error'])}"
              for _, row in bad.iterrows()]
    return lines


def report_text(frame, pictures: list[Path], objective: str = "time", intro: list[str] = ()) -> str:
    """The whole report.md."""
    counts = frame["status"].value_counts()
    lines = ["# What-if report", "", *intro,
             f"{len(frame)} configurations: {counts.get('ok', 0)} fit, {counts.get('oom', 0)} out "
             f"of memory, {counts.get('error', 0)} invalid. Ranked by {objective}; `changes` are "
             f"the flags that turn configuration #{frame['index'].iloc[0]} into each row.", "", *ranked_table(frame, objective),
             *error_lines(frame)]
    if pictures:
        lines += ["", "## Pictures", ""] + [f"![{p.stem}]({p.name})" for p in pictures]
    return "\n".join(lines) + "\n"


def write_whatif_report(frame, out: Path, objective: str = "time", intro: list[str] = ()) -> Path:
    """Write report.md and its pictures into `out`; return the report's path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pictures = write_plots(frame, out)
    path = out / "report.md"
    write_file(path, report_text(frame, pictures, objective, list(intro)))
    return path
