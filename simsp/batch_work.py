"""The limit on a batch's total work (a sweep, a search, a validation set; README "Limits"):
each run's CPU-second estimate is `run`'s (simsp/shortcuts/work_counts.py row_seconds). Below the
drivers, so explore/ and validation/ share it without importing each other.
"""

from simsp.scenario.work import TIME_LIMIT_S

TOTAL_TIME_LIMIT_S = 12 * TIME_LIMIT_S  # estimated CPU seconds of a whole batch; --force lifts it
