"""The what-if report (report.md): the configurations ranked, how each differs from the first
(as the flags that produce it), why the invalid ones failed, and the four pictures."""

from pathlib import Path

from simsp.io_out import markdown_text, write_file
from simsp.report.sweep.plots import exposed_kinds, write_plots
from simsp.units import GiB

RANK_KEYS = {"time": ("iteration_time_s", True), "tokens-per-s": ("tokens_per_s", False),
             "mfu": ("mfu", False), "memory": ("peak_bytes_max", True)}


def ranked(frame, objective: str = "time"):
    """Rows that fit first (by the objective), then out-of-memory rows, then invalid ones."""
    column, ascending = RANK_KEYS[objective]
    group = frame["status"].map({"ok": 0, "oom": 1, "error": 2})
    if "fits" in frame:  # simulated but short of the memory reserve: after those that fit
        group = group.where(frame["fits"].fillna(False).astype(bool) | (group == 2), 1)
    if column not in frame:  # no row simulated (every one failed): configuration order
        return frame.sort_values("index", kind="stable")
    key = frame[column] if ascending else -frame[column]
    return frame.assign(_group=group, _key=key).sort_values(
        ["_group", "_key", "index"], kind="stable").drop(columns=["_group", "_key"])


def _verdict(row) -> str:
    """fits, short of the reserve, invalid, or OOM with its stage and the bytes over."""
    if row["status"] == "error":
        return "invalid"
    if row["oom"]:
        return f"OOM stage {int(row['oom_stage'])} +{row['oom_bytes_over'] / GiB:.2f} GiB"
    if row.get("fits") is False:
        return f"inside the {row['memory_reserve_bytes'] / GiB:.2f} GiB reserve"
    return "fits"


def _cells(row, kinds: list[str]) -> list[str]:
    """One table line's cells for a simulated row."""
    exposed = " / ".join(f"{row[k]:.3g}" if row[k] == row[k] else "-" for k in kinds)
    return [f"{row['iteration_time_s']:.4g}", f"{row['tokens_per_s']:,.0f}",
            f"{row['tokens_per_s'] / row['gpus']:,.0f}", f"{row['mfu']:.1%}",
            f"{row['bubble_fraction']:.1%}", exposed, f"{row['peak_bytes_max'] / GiB:.1f}",
            f"{row['headroom_bytes'] / GiB:.1f}", _verdict(row)]


def ranked_table(frame, objective: str = "time") -> list[str]:
    """The markdown table of the simulated rows, best first."""
    kinds = exposed_kinds(frame)
    names = " / ".join(k[len("exposed_"):-2] for k in kinds) or "-"
    lines = [f"| rank | # | variant | GPUs | time (s) | tokens/s | tokens/s per GPU | MFU | bubble | "
             f"exposed {names} (s) | peak (GiB) | headroom (GiB) | verdict |", "|" + "---|" * 13]
    done = ranked(frame, objective)
    done = done[done["status"] != "error"]
    for place, (_, row) in enumerate(done.iterrows(), 1):
        cells = [str(place), str(row["index"]), markdown_text(row["variant"]), str(row["gpus"])]
        lines.append("| " + " | ".join(cells + _cells(row, kinds)) + " |")
    return lines


def command_lines(frame, objective: str = "time", count: int = 10) -> list[str]:
    """The exact `simsp run` command that reproduces each of the best rows."""
    done = ranked(frame, objective)
    done = done[done["status"] != "error"].head(count)
    if done.empty or "command" not in done:
        return []
    lines = ["", f"## Reproduce the best {len(done)}", ""]
    for place, (_, row) in enumerate(done.iterrows(), 1):
        command = row["command"] if isinstance(row["command"], str) else "(no run flags for it)"
        lines += [f"{place}. #{row['index']} {markdown_text(row['variant'])}", "",
                  f"    {command}", ""]
    return lines


def note_lines(frame) -> list[str]:
    """What deriving d from the GPUs did, once per distinct note."""
    notes = dict.fromkeys(n for n in frame.get("note", []) if isinstance(n, str) and n)
    return ["", "## GPUs and batch", "", *[f"- {markdown_text(note)}" for note in notes]] \
        if notes else []


def error_lines(frame) -> list[str]:
    """Invalid configurations with their `error:` text."""
    bad = frame[frame["status"] == "error"]
    if bad.empty:
        return []
    lines = ["", "## Invalid configurations", ""]
    lines += [f"- #{row['index']} {markdown_text(row['variant'])}: {markdown_text(row['error'])}"
              for _, row in bad.iterrows()]
    return lines


def report_text(frame, pictures: list[Path], objective: str = "time", intro: list[str] = (),
                title: str = "Sweep report") -> str:
    """The whole report.md."""
    counts = frame["status"].value_counts()
    fits = int(frame["fits"].fillna(False).astype(bool).sum()) if "fits" in frame else counts.get("ok", 0)
    lines = [f"# {title}", "", *intro,
             f"{len(frame)} configurations: {fits} fit, {counts.get('oom', 0)} out of memory, "
             f"{counts.get('error', 0)} invalid. Ranked by {objective} (those that fit first). "
             "t, p, d: tensor, pipeline and data-parallel sizes; b: micro-batch size; "
             "headroom: capacity less the memory reserve less the peak.", "",
             *ranked_table(frame, objective), *note_lines(frame),
             *command_lines(frame, objective), *error_lines(frame)]
    if pictures:
        lines += ["", "## Pictures", ""] + [f"![{p.stem}]({p.name})" for p in pictures]
    return "\n".join(lines) + "\n"


def write_whatif_report(frame, out: Path, objective: str = "time", intro: list[str] = (),
                        title: str = "Sweep report") -> Path:
    """Write report.md and its pictures into `out`; return the report's path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pictures = write_plots(ranked(frame, objective), out, objective)
    path = out / "report.md"
    write_file(path, report_text(frame, pictures, objective, list(intro), title))
    return path
