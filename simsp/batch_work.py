"""The work of a batch of runs (a sweep, a search, a validation set): each run's CPU-second
estimate by `run`'s rule (simsp.scenario.work), and the limit on the batch's total (README
"Limits"). Below the drivers, so explore/ and validation/ share it without importing each other.
"""

from simsp.scenario.work import TIME_LIMIT_S, meta_seconds, numeric_seconds

TOTAL_TIME_LIMIT_S = 12 * TIME_LIMIT_S  # estimated CPU seconds of a whole batch; --force lifts it


def row_seconds(sc) -> float:
    """run's CPU-second estimate of one configuration (simsp.scenario.work)."""
    return numeric_seconds(sc) if sc.run.mode == "numeric" else meta_seconds(sc, True)
