"""Run a list of configurations: cached rows first, the rest on the executor with a progress
bar on stderr (done / total, rate, ETA, failures so far); rows come back in configuration order."""

import sys
from pathlib import Path

from tqdm import tqdm

from simsp.explore.cache import ResultCache
from simsp.explore.configs import Config
from simsp.explore.executor import Executor
from simsp.explore.table import results_frame, table_row
from simsp.progress import wanted


def _is_failure(row: dict) -> bool:
    """An invalid configuration (OOM is a result, not a failure)."""
    return row.get("status") == "error"


def progress_bar(total: int, done: int, quiet: bool, what: str = "simsp sweep") -> tqdm:
    """configs done / total, rate and ETA on stderr, with the failures so far (drawn only when
    stderr is a terminal and not --quiet, as every command's progress: simsp.progress)."""
    bar = tqdm(total=total, initial=done, file=sys.stderr, disable=not wanted(quiet), unit="config",
               desc=what, dynamic_ncols=True)
    bar.set_postfix(failed=0)
    bar.failed = 0
    return bar


def evaluate_all(configs: list[Config], executor: Executor, cache: ResultCache, bar=None) -> dict:
    """{digest: result row} for every configuration, simulating only what the cache lacks;
    `bar` (a progress_bar, or None) advances once per configuration."""
    digests = [c.digest() for c in configs]
    found = {d: cache.get(d) for d in dict.fromkeys(digests)}
    for digest, config in zip(digests, configs):
        if config.error:  # known invalid before simulating: a row, never a job
            found[digest] = {"status": "error", "error": config.error}
    jobs = {d: c.values for d, c in zip(digests, configs) if found[d] is None}
    _advance(bar, [row for row in found.values() if row])
    for digest, row in executor.results(jobs):
        if not str(row.get("error") or "").startswith("internal error"):
            cache.put(digest, row)  # a crash is not a result: try it again next time
        found[digest] = row
        _advance(bar, [row])
    return found


def _advance(bar, rows: list[dict]) -> None:
    """Advance the progress bar by finished rows, counting failures."""
    if bar is None or not rows:
        return
    bar.failed += sum(_is_failure(row) for row in rows)
    bar.set_postfix(failed=bar.failed, refresh=False)
    bar.update(len(rows))


def run_configs(configs: list[Config], executor: Executor, out: str | Path | None = None,
                quiet: bool = True) -> list[dict]:
    """Table rows of every configuration, in configuration order (cache under out/cache)."""
    cache = ResultCache(Path(out) / "cache" if out is not None else None)
    with progress_bar(len({c.digest() for c in configs}), 0, quiet) as bar:
        found = evaluate_all(configs, executor, cache, bar)
    return [table_row(i, c, configs[0], found[c.digest()]) for i, c in enumerate(configs)]


__all__ = ["run_configs", "evaluate_all", "results_frame"]
