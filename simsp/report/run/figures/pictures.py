"""The pictures of the run report, each a (file name, caption, PNG bytes): memory over time for
every stage, the pipeline schedule, and those drawn from the metrics. Each function here is one
painter job (report/run/painter.py); every PNG is a deterministic function of the run.
"""

from simsp.metrics.timing import stage_ranks
from simsp.report.run.figures.bars import exposed_time_bars, memory_at_peak_bars, switch_bars
from simsp.report.run.figures.memory import memory_over_time
from simsp.report.run.figures.schedule import schedule_gantt


MEMORY_CAPTION = ("Memory over one iteration for every pipeline stage (stacked by category; "
                  "dashed line: capacity).")
SCHEDULE_CAPTION = ("Pipeline schedule: forward and backward steps, recompute, waits for input "
                    "(grey), and pipeline transfers and DP communication below each row. Where "
                    "steps are narrower than a few pixels, each pixel column is coloured by the "
                    "share of its time each kind takes.")
REPLAYED_NOTE = (" Recompute is drawn inside the backward bars here: meta mode's replayed layer "
                 "templates keep no per-op detail (--no-shortcuts shows it).")


def capacity_of(run) -> int:
    """Device memory in bytes, as stage 0's ledger has it."""
    return run.inputs.world.ranks[stage_ranks(run)[0]].ledger.capacity_bytes


def _drawn(made: list) -> list[tuple[str, str, bytes]]:
    """The (name, caption, png) figures that were drawn (png None: no matplotlib)."""
    return [(name, caption, png) for name, caption, png in made if png is not None]


def memory_pictures(inputs) -> list[tuple[str, str, bytes]]:
    """[memory_stages.png] from MemoryFigures: one painter job (report/run/painter.py;
    memory.png, from the same inputs, is another: memory_plot_png)."""
    return _drawn([("memory_stages.png", MEMORY_CAPTION, memory_over_time(inputs))])


def schedule_pictures(inputs) -> list[tuple[str, str, bytes]]:
    """[schedule.png] from ScheduleFigure: one painter job."""
    caption = SCHEDULE_CAPTION + (REPLAYED_NOTE if inputs.replayed else "")
    return _drawn([("schedule.png", caption, schedule_gantt(inputs))])


def metric_figures(metrics: dict, capacity: int, label: str) -> list[tuple[str, str, bytes]]:
    """The figures drawn from the metrics (and the device's `capacity` in bytes): exposed time,
    memory at each stage's peak, and the switches tried against an out-of-memory."""
    made = [("exposed.png", "Exposed time per stage: communication that no compute hid, and "
             "pipeline waits.", exposed_time_bars(metrics, label)),
            ("memory_at_peak.png", "Memory by category at each stage's peak moment.",
             memory_at_peak_bars(metrics, capacity, label))]
    explanation = metrics.get("oom_explanation")
    if explanation:
        made.append(("oom_switches.png", "Out of memory: the worst-stage peak of each candidate "
                     "switch, each from its own simulated iteration (green fits).",
                     switch_bars(explanation, label)))
    return _drawn(made)
