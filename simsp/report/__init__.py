"""Reports of one run: summary.md (with its figures as PNGs), report.html (the same, one
self-contained page), metrics.json, trace.json (Perfetto) and memory.png.

Every file is a deterministic function of the run: the same scenario gives the same bytes.
"""

from pathlib import Path

from simsp.engine.gc_pause import gc_paused
from simsp.jsonout import dumps

from simsp.report.chrome_trace import write_chrome_trace
from simsp.report.figures import report_figures
from simsp.report.html import write_report_html
from simsp.report.memory_plot import write_memory_plot
from simsp.report.summary_md import summary_text, variant_label, write_summary

__all__ = ["metrics_json", "summary_text", "write_chrome_trace", "write_memory_plot",
           "write_reports", "write_summary"]


def metrics_json(metrics: dict) -> str:
    """The metrics document: strict indented JSON in the dict's own key order, newline-ended."""
    return dumps(metrics, indent=2) + "\n"


def write_figures(figures: list[tuple[str, str, bytes]], out: Path) -> list[Path]:
    """Write each figure's PNG into `out` (beside summary.md, which links them)."""
    for name, _caption, png in figures:
        (out / name).write_bytes(png)
    return [out / name for name, _, _ in figures]


def write_reports(run, metrics: dict, out_dir, trace: str = "full") -> list[Path]:
    """Write summary.md, metrics.json, trace.json (at detail `trace`; none for "none"),
    report.html and (with matplotlib) the figures and memory.png to `out_dir`.

    The cyclic collector is paused meanwhile: the reports make many short-lived objects, and
    each collection would rescan the run's millions of long-lived records."""
    with gc_paused():
        return _write_reports(run, metrics, Path(out_dir), trace)


def _write_reports(run, metrics: dict, out: Path, trace: str) -> list[Path]:
    """write_reports' work, in the order the reader meets the files."""
    out.mkdir(parents=True, exist_ok=True)
    figures = report_figures(run, metrics, variant_label(metrics))
    links = [(name, caption) for name, caption, _ in figures]
    written = [write_summary(metrics, out / "summary.md", links)]
    (out / "metrics.json").write_text(metrics_json(metrics))
    written.append(out / "metrics.json")
    if trace != "none":
        written.append(write_chrome_trace(run, out / "trace.json", detail=trace))
    plot = write_memory_plot(run, out / "memory.png")
    if plot is not None:
        written.append(plot)
    written.append(write_report_html(metrics, figures, out / "report.html"))
    return written + write_figures(figures, out)
