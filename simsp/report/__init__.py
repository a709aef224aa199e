"""Reports of one run: summary.md (with its figures as PNGs), report.html (the same, one
self-contained page), metrics.json, trace.json (Perfetto) and memory.png.

Every file is a deterministic function of the run: the same scenario gives the same bytes.
"""

from pathlib import Path

from simsp.engine.gc_pause import gc_paused
from simsp.jsonout import dumps

from simsp.report.chrome_trace import write_chrome_trace
from simsp.report.figures import metric_figures, stage_figures
from simsp.report.html import write_report_html
from simsp.report.memory_plot import write_memory_plot
from simsp.report.summary_md import summary_text, variant_label, write_summary
from simsp.report.two_cores import both

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
    """write_reports' work: the stage figures here, meanwhile the trace, memory.png and the
    metric figures on the other core (report/two_cores.py); then the pages that show them."""
    out.mkdir(parents=True, exist_ok=True)
    label = variant_label(metrics)
    staged, (side_files, charts) = both(lambda: stage_figures(run, label),
                                        lambda: _side_work(run, metrics, label, out, trace))
    figures = staged + charts
    links = [(name, caption) for name, caption, _ in figures]
    written = [write_summary(metrics, out / "summary.md", links)]
    (out / "metrics.json").write_text(metrics_json(metrics))
    written += [out / "metrics.json", *side_files]
    written.append(write_report_html(metrics, figures, out / "report.html"))
    return written + write_figures(figures, out)


def _side_work(run, metrics: dict, label: str, out: Path, trace: str) -> tuple[list, list]:
    """trace.json (unless "none") and memory.png written, and the metric figures drawn:
    (files written, figures)."""
    files = [write_chrome_trace(run, out / "trace.json", detail=trace)] if trace != "none" else []
    plot = write_memory_plot(run, out / "memory.png")
    return files + ([plot] if plot is not None else []), metric_figures(run, metrics, label)
