"""What one meta iteration will spend and keep under a shortcut verdict, counted before it
runs, for the limits `run` and `memory` keep (simsp/scenario/work.py check_work, README
"Limits")."""

from simsp.scenario.work import MetaWork
from simsp.shortcuts.check import Shortcuts
from simsp.shortcuts.record_counts import dp_ring_records
from simsp.shortcuts.work_counts import cp_shadows, run_ranks, run_seconds
from simsp.training.driver.trace_counts import detail_spans


def verdict_work(sc, shortcuts: Shortcuts, trace: str = "none") -> MetaWork:
    """The verdict's work: its CPU seconds (run_seconds), the ranks it simulates, whether it
    replays layer templates, the spans `trace` keeps beyond the default, the data-parallel
    rings' records and whether its CP groups run as one program."""
    return MetaWork(run_seconds(sc, shortcuts), run_ranks(sc, shortcuts), shortcuts.templates,
                    detail_spans(sc, trace), dp_ring_records(sc, shortcuts),
                    cp_shadows(sc, shortcuts))
