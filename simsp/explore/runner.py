"""Run a list of configurations: cached rows first, the rest on the executor with a progress
bar on stderr (done / total, rate, ETA, failures so far); rows come back in configuration order."""

import sys
from pathlib import Path

from tqdm import tqdm

from simsp.explore.cache import ResultCache
from simsp.explore.configs import Config
from simsp.explore.executor import Executor
from simsp.explore.table import results_frame, table_row


def _is_failure(row: dict) -> bool:
    return row.get("status") == "error"


def _progress(total: int, done: int, quiet: bool) -> tqdm:
    bar = tqdm(total=total, initial=done, file=sys.stderr, disable=quiet, unit="config",
               desc="simsp sweep", dynamic_ncols=True)
    bar.set_postfix(failed=0)
    return bar


def evaluate_all(configs: list[Config], executor: Executor, cache: ResultCache,
                 quiet: bool = True) -> dict:
    """{digest: result row} for every configuration, simulating only what the cache lacks."""
    digests = [c.digest() for c in configs]
    found = {d: cache.get(d) for d in dict.fromkeys(digests)}
    jobs = {d: c.values for d, c in zip(digests, configs) if found[d] is None}
    failed = sum(_is_failure(row) for row in found.values() if row)
    with _progress(len(found), len(found) - len(jobs), quiet) as bar:
        for digest, row in executor.results(jobs):
            cache.put(digest, row)
            found[digest] = row
            failed += _is_failure(row)
            bar.set_postfix(failed=failed, refresh=False)
            bar.update()
    return found


def run_configs(configs: list[Config], executor: Executor, out: str | Path | None = None,
                quiet: bool = True) -> list[dict]:
    """Table rows of every configuration, in configuration order (cache under out/cache)."""
    cache = ResultCache(Path(out) / "cache" if out is not None else None)
    found = evaluate_all(configs, executor, cache, quiet)
    return [table_row(i, c, configs[0], found[c.digest()]) for i, c in enumerate(configs)]


__all__ = ["run_configs", "evaluate_all", "results_frame"]
