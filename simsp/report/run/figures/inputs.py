"""What the run report's figures show, taken from a finished run as plain numbers and numpy
arrays, so that another process can draw them from these alone (report/run/painter.py).

Each field is what the drawing code used to read from the run itself: a stage's memory timeline
(report/run/memory_timeline.py, exact peak), its summary's peak, and its schedule intervals
(stage_intervals, report/run/figures/schedule.py); the figures are the same bytes whichever
process draws them.
"""

from dataclasses import dataclass

import numpy as np

from simsp.engine.memory import CATEGORIES
from simsp.metrics.timing import stage_ranks
from simsp.report.run.figures.schedule import (replayed, stage_intervals, stage_spans,
                                               zoom_window)
from simsp.report.run.memory_timeline import coarser, memory_timeline
from simsp.report.run.shown_categories import shown_categories


@dataclass(frozen=True)
class StageMemory:
    """One pipeline stage's memory (its tp 0, dp 0 rank): the finest timeline and its peak."""

    stage: int
    rank: int
    times: np.ndarray  # (n,) seconds of each kept change, n <= MAX_MEMORY_POINTS
    state: np.ndarray  # (n, 7) int64 bytes per category after each change
    peak_total: int  # bytes at the stage's peak
    peak_time_s: float
    oom: bool  # the stage ran out of memory
    capacity_bytes: int

    def timeline(self, max_points: int) -> tuple[np.ndarray, np.ndarray]:
        """(times (m,), state (m, 7)), m <= max_points, the peak kept (memory_timeline)."""
        return coarser(self.times, self.state, max_points)


@dataclass(frozen=True)
class MemoryFigures:
    """Inputs of the memory-over-time figures: every stage (memory_stages.png) and the first
    and last (memory.png)."""

    name: str  # the scenario's run name
    label: str  # the variant in a few words (summary_md.variant_label)
    end_s: float  # the iteration's end
    memory: tuple[StageMemory, ...]  # in stage order
    categories: tuple[str, ...] = CATEGORIES  # those drawn (shown_categories.py), in order

    def columns(self) -> list[int]:
        """The drawn categories' columns of each stage's state (indices into CATEGORIES)."""
        return [CATEGORIES.index(c) for c in self.categories]


@dataclass(frozen=True)
class ScheduleFigure:
    """Inputs of the pipeline schedule (schedule.png)."""

    label: str
    end_s: float
    schedule: tuple[dict, ...]  # per stage {kind: (n, 2) [start_s, end_s]}
    zoom: tuple[float, float]  # the pipeline fill's window, seconds
    replayed: bool  # meta-mode layer templates: recompute only inside backward bars


def stage_memory(run, stage: int, rank: int) -> StageMemory:
    """One stage's memory inputs from its rank's ledger."""
    ledger = run.inputs.world.ranks[rank].ledger
    times, state = memory_timeline(ledger)  # (n,), (n, 7)
    summary = ledger.summary()
    return StageMemory(stage, rank, times, state, summary.peak_total, summary.peak_time_s,
                       summary.oom is not None, ledger.capacity_bytes)


def memory_figures_of(run, label: str) -> MemoryFigures:
    """The memory figures' inputs from a finished run; held_for_wgrad drawn only where a
    simulated rank (each rank's ledger or its identical representative's) held some."""
    memory = tuple(stage_memory(run, s, r) for s, r in enumerate(stage_ranks(run)))
    shown = shown_categories(rank.ledger.summary().peak_by_category  # replayed: partial
                             for rank in run.inputs.world.ranks.values()
                             if rank.rank not in run.inputs.replayed)
    return MemoryFigures(run.inputs.sc.run.name, label, _end_s(run), memory, shown)


def schedule_figure_of(run, label: str) -> ScheduleFigure:
    """The schedule's inputs from a finished run."""
    ranks = stage_ranks(run)
    spans = stage_spans(run, ranks)
    return ScheduleFigure(label, _end_s(run),
                          tuple(stage_intervals(run, r, spans[r]) for r in ranks),
                          zoom_window(run, ranks[0]), replayed(run))


def _end_s(run) -> float:
    """When the iteration ends: its last rank's end."""
    return max(run.results.end_s.values(), default=0.0)
