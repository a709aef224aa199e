"""The memory categories the human run report shows (summary.md, report.html, the figures).

Every ledger category, but held_for_wgrad (what a split backward's B keeps for its deferred W:
zero-bubble, DualPipe, --delay-wgrad-compute; docs/schedules.md) only where some rank of the run
held bytes in it; a run whose backward is whole (1F1B) reads as it did before the category
existed. metrics.json keeps every key, 0 included.
"""

from collections.abc import Iterable

from simsp.engine.memory import CATEGORIES, HELD_FOR_WGRAD


def shown_categories(peaks: Iterable[dict]) -> tuple[str, ...]:
    """CATEGORIES in order, less held_for_wgrad unless one of `peaks` (each rank's own peak
    bytes by category) is above 0 in it."""
    held = any(p.get(HELD_FOR_WGRAD, 0) > 0 for p in peaks)
    return tuple(c for c in CATEGORIES if held or c != HELD_FOR_WGRAD)


def report_categories(metrics: dict) -> tuple[str, ...]:
    """shown_categories of a run's metrics (every rank's peak_by_category_bytes)."""
    return shown_categories(r["peak_by_category_bytes"] for r in metrics["ranks"])
