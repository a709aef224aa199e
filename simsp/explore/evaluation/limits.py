"""Work bounds for many configurations: `run`'s estimate (simsp.scenario.work.check_work)
applied to every row before it is submitted, and limits on the whole sweep (the batch limit of
simsp/batch_work.py, the number of configurations, the workers), before any cluster starts.

A row `run` would refuse is refused the same way: numeric mode beyond the memory limit stops the
whole sweep (a model that cannot be numeric is never simulated numerically by accident); a row
beyond the meta memory or the time limit becomes an error row with run's `error:` text (the
time limit lifts with --force). The sweep's total estimate and its number of configurations
are bounded too (README "Limits").
"""

import math
import os

from simsp.batch_work import TOTAL_TIME_LIMIT_S
from simsp.scenario.work import check_work
from simsp.scenario.loading import load_scenario
from simsp.errors import UserError

MAX_CONFIGS = 10000  # configurations in one sweep or search (rows of one results.csv)


def max_workers() -> int:
    """Worker processes the machine can run at once: its usable cores (at least 2)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(2, cores)


def check_workers(workers: int | None) -> None:
    """--workers between 0 (this process) and the machine's cores."""
    if workers is None:
        return
    if workers < 0:
        raise UserError("--workers", f"must be 0 or more, got {workers}")
    if workers > max_workers():
        raise UserError("--workers", f"{workers} is above this machine's {max_workers()} usable "
                                     "cores (each worker is a process simulating one row)")


def check_count(count: int, what: str = "configurations") -> None:
    """At most MAX_CONFIGS rows, checked from the axes' lengths before any row is built."""
    if count > MAX_CONFIGS:
        raise UserError("sweep", f"{count} {what}, above the limit of {MAX_CONFIGS} "
                                 "(split the sweep, or narrow its lists)")


def refusal(values: tuple, force: bool = False) -> str | None:
    """run's `error:` text for a configuration it would refuse before simulating, else None
    (an invalid configuration is left to evaluate(), which names the field)."""
    try:
        sc = load_scenario(None, dict(values))
    except UserError:
        return None
    try:
        check_work(sc, force=force)
    except UserError as exc:
        return f"error: {exc}"
    return None


def check_sweep(configs: list, force: bool = False) -> None:
    """Before any cluster starts: no row in numeric mode beyond the memory limit, and the whole
    sweep's estimated CPU time within TOTAL_TIME_LIMIT_S unless `force`."""
    check_count(len(configs))
    total, seen = 0.0, set()
    for index, config in enumerate(configs):
        if config.values in seen:
            continue
        seen.add(config.values)
        try:
            sc = load_scenario(None, dict(config.values))
        except UserError:
            continue  # an error row, named by evaluate()
        if sc.run.mode == "numeric":
            try:
                check_work(sc, force=True)
            except UserError as exc:
                raise UserError(exc.field, f"row {index} ({config.name}): {exc.reason}") from None
        from simsp.shortcuts.work_counts import row_seconds  # the shortcut check: networkx
        total += row_seconds(sc)
    if total > TOTAL_TIME_LIMIT_S and not force:
        raise UserError("work", f"about {total:.3g} CPU seconds for {len(seen)} configurations, "
                                f"above the sweep limit of {TOTAL_TIME_LIMIT_S:g} s (--force to "
                                "run anyway)")


def grid_size(variants: int, lengths: list[int]) -> int:
    """How many configurations variants x the lists' product would make."""
    return variants * math.prod(lengths)
