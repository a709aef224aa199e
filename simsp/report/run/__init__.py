"""The report of one run: summary.md (with its figures as PNGs), report.html (the same, one
self-contained page), metrics.json, trace.json (Perfetto) and memory.png; write_reports writes
them all.

Modules: summary_md.py (and fsdp_summary.py, glossary.py) the text, report_html.py the page,
shown_categories.py the memory categories text and figures show,
figures/ the PNGs, trace/ trace.json, memory_timeline.py the memory over time both read, and
painter.py the worker processes that draw the figures while this one writes the rest.

Every file is a deterministic function of the run: the same scenario gives the same bytes.
"""

from functools import partial
from pathlib import Path

from simsp.gc_pause import gc_paused
from simsp.io_out import write_file
from simsp.jsonout import dumps

from simsp.report.run.figures.inputs import memory_figures_of, schedule_figure_of
from simsp.report.run.figures.memory import memory_plot_png, write_memory_plot
from simsp.report.run.figures.pictures import (capacity_of, memory_pictures, metric_figures,
                                               schedule_pictures)
from simsp.report.run.painter import Painter, start_painter
from simsp.report.run.report_html import write_report_html
from simsp.report.run.summary_md import summary_text, variant_label, write_summary
from simsp.report.run.trace.writer import counter_points, stage_counter_lines, write_chrome_trace

__all__ = ["metrics_json", "paint_stage_figures", "summary_text", "write_chrome_trace",
           "write_memory_plot", "write_reports", "write_summary"]


def metrics_json(metrics: dict) -> str:
    """The metrics document: strict indented JSON in the dict's own key order, newline-ended."""
    return dumps(metrics, indent=2) + "\n"


def write_figures(figures: list[tuple[str, str, bytes]], out: Path) -> list[Path]:
    """Write each figure's PNG into `out` (beside summary.md, which links them)."""
    for name, _caption, png in figures:
        write_file(out / name, png)
    return [out / name for name, _, _ in figures]


def paint_stage_figures(run, label: str, painter: Painter, trace: str = "full") -> None:
    """Hand the figures drawn from every stage's timeline to the painter as soon as the run
    has ended, the schedule first (its inputs are ready at once): it draws them while this
    process measures the run. With a trace (`trace` not "none"), the painter also encodes the
    stages' memory counters for trace.json from the same timelines."""
    painter.submit("schedule", schedule_pictures, schedule_figure_of(run, label))
    memory = memory_figures_of(run, label)
    painter.submit("memory", memory_pictures, memory)
    painter.submit("memory plot", memory_plot_png, memory)
    if trace != "none":
        painter.submit("counters", stage_counter_lines, memory, counter_points(run),
                       shared=True)  # no matplotlib: this process takes it if free first


def write_reports(run, metrics: dict, out_dir, trace: str = "full",
                  painter: Painter | None = None) -> list[Path]:
    """Write summary.md, metrics.json, trace.json (at detail `trace`; none for "none"),
    report.html and (with matplotlib) the figures and memory.png to `out_dir`. The figures are
    drawn by `painter` (report/run/painter.py; one is started here if none is given).

    The cyclic collector is paused meanwhile: the reports make many short-lived objects, and
    each collection would rescan the run's millions of long-lived records."""
    with gc_paused():
        if painter is not None:
            return _write_reports(run, metrics, Path(out_dir), trace, painter)
        with start_painter() as own:
            return _write_reports(run, metrics, Path(out_dir), trace, own)


def _write_reports(run, metrics: dict, out: Path, trace: str, painter: Painter) -> list[Path]:
    """write_reports' work: the figures drawn and trace.json written meanwhile, then the pages
    that show the figures."""
    out.mkdir(parents=True, exist_ok=True)
    figures, side_files = _figures_and_trace(run, metrics, out, trace, painter)
    links = [(name, caption) for name, caption, _ in figures]
    written = [write_summary(metrics, out / "summary.md", links)]
    write_file(out / "metrics.json", metrics_json(metrics))
    written += [out / "metrics.json", *side_files]
    written.append(write_report_html(metrics, figures, out / "report.html"))
    return written + write_figures(figures, out)


def _figures_and_trace(run, metrics: dict, out: Path, trace: str, painter: Painter) -> tuple:
    """The painter draws the figures while this process writes trace.json (unless "none");
    memory.png written too: (figures in reading order, [files written])."""
    label = variant_label(metrics)
    if "memory" not in painter.submitted:
        paint_stage_figures(run, label, painter, trace)
    painter.submit("metrics", metric_figures, metrics, capacity_of(run), label)
    files = []
    if trace != "none":
        counters = partial(painter.result, "counters") if "counters" in painter.submitted else None
        files.append(write_chrome_trace(run, out / "trace.json", detail=trace, counters=counters))
    memory, memory_png = painter.result("memory"), painter.result("memory plot")
    if memory_png is not None:
        write_file(out / "memory.png", memory_png)
        files.append(out / "memory.png")
    return memory + painter.result("schedule") + painter.result("metrics"), files
