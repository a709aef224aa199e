"""Run a list of configurations: cached rows first, the rest on the executor with a progress
bar on stderr (done / total, rate, ETA, failures so far); rows come back in configuration order."""

import sys
from pathlib import Path

from tqdm import tqdm

from simsp.explore.evaluation.cache import ResultCache
from simsp.explore.configs.grid import Config
from simsp.explore.evaluation.executor import Executor, ExecutorLost
from simsp.explore.evaluation.limits import refusal
from simsp.explore.evaluation.stream import RowStream
from simsp.explore.results.table import results_frame, table_row
from simsp.io_out import check_folder, check_not_inputs, check_target
from simsp.outdir import prepare_out_dir
from simsp.progress import wanted


def _is_failure(row: dict) -> bool:
    """An invalid configuration (OOM is a result, not a failure)."""
    return row.get("status") == "error"


def progress_bar(total: int | None, done: int, quiet: bool, what: str = "simsp sweep") -> tqdm:
    """configs done / total, rate and ETA on stderr, with the failures so far (drawn only when
    stderr is a terminal and not --quiet, as every command's progress: simsp.progress); a
    total of None is set by evaluate_all to the configurations it will simulate."""
    bar = tqdm(total=total, initial=done, file=sys.stderr, disable=not wanted(quiet), unit="config",
               desc=what, dynamic_ncols=True)
    bar.set_postfix(failed=0)
    bar.failed = 0
    return bar


def evaluate_all(configs: list[Config], executor: Executor, cache: ResultCache, bar=None,
                 found: dict | None = None, stream=None) -> dict:
    """{digest: result row} for every configuration, simulating only what the cache lacks;
    a row `run` would refuse (simsp.explore.evaluation.limits) is its error row, never submitted;
    `bar` (a progress_bar, or None) advances once per configuration; `stream(found)` (a
    simsp.explore.evaluation.stream.RowStream, or None) prints the rows ready. A lost cluster raises
    ExecutorLost, the rows finished so far in `found` (a dict to fill, if given)."""
    stream = stream or (lambda found: None)
    digests = [c.digest() for c in configs]
    values = dict(zip(digests, (c.values for c in configs)))
    errors = {d: c.error for d, c in zip(digests, configs) if c.error}
    found = {} if found is None else found
    found.update({d: cache.get(d, values[d]) if d not in errors else None for d in values})
    jobs = {}
    for digest in values:
        if digest in errors:  # known invalid before simulating: a row, never a job
            found[digest] = {"status": "error", "error": errors[digest]}
        elif found[digest] is None:
            reason = refusal(values[digest], getattr(executor, "force", False))
            if reason is None:
                jobs[digest] = values[digest]
            else:
                found[digest] = {"status": "error", "error": reason}
    _count_known(bar, [found[d] for d in values if found[d]], len(jobs))
    stream(found)
    for digest, row in executor.results(jobs):
        if not str(row.get("error") or "").startswith("internal error"):
            cache.put(digest, row, values[digest])  # a crash is not a result: try it again
        cache.stats.simulated += 1
        found[digest] = row
        _advance(bar, [row])
        stream(found)
    return found


def _count_known(bar, rows: list[dict], jobs: int) -> None:
    """Rows known without simulating (cached, refused): a bar opened with no total (a sweep's)
    then counts only the `jobs` to simulate, its failures noted; any other bar advances."""
    if bar is not None and bar.total is None:
        bar.total = jobs
        bar.failed += sum(_is_failure(row) for row in rows)
        bar.set_postfix(failed=bar.failed)
        return
    _advance(bar, rows)


def _advance(bar, rows: list[dict]) -> None:
    """Advance the progress bar by finished rows, counting failures."""
    if bar is None or not rows:
        return
    bar.failed += sum(_is_failure(row) for row in rows)
    bar.set_postfix(failed=bar.failed, refresh=False)
    bar.update(len(rows))


def run_configs(configs: list[Config], executor: Executor, out: str | Path | None = None,
                quiet: bool = True, cache: ResultCache | None = None,
                stream: bool = False, reserve: float | None = None) -> list[dict]:
    """Table rows of every configuration, in configuration order (cache under out/cache);
    with `stream`, each row's line (judged with the `reserve` override in bytes, None: the
    row's itemised one) is printed to stdout as it is ready
    (simsp.explore.evaluation.stream). If the cluster is lost midway, the rows not finished are
    error rows saying so and `executor.lost` says why."""
    cache = cache or ResultCache(Path(out) / "cache" if out is not None else None)
    unique = list({c.digest(): c for c in configs}.values())
    found = {}
    printer = None
    if stream and configs:
        printer = RowStream(list(enumerate(configs)), configs[0], reserve)
    with progress_bar(None, 0, quiet) as bar:  # its total: the configurations to simulate
        try:
            evaluate_all(unique, executor, cache, bar, found, printer)
        except ExecutorLost as exc:
            lost = {"status": "error", "error": f"internal error: not simulated: {exc}"}
            found.update({d: lost for d, row in found.items() if row is None})
    return [table_row(i, c, configs[0], found[c.digest()]) for i, c in enumerate(configs)]


# every file a sweep or search writes in its folder (explore/table.py, report/sweep/report_md.py,
# report/sweep/plots.py, explore/folders.py), and what whatif adds (report/whatif/page.py)
RESULT_FILES = ("results.csv", "results.jsonl", "report.md", "top.png", "pareto.png",
                "memory.png", "exposed.png", "exploration.json")
WHATIF_FILES = ("whatif.md", "whatif.html", "vs_baseline.png", "exposure.png")


def prepare_out(out: str | Path, inputs: tuple = (), files: tuple = RESULT_FILES) -> Path:
    """The results folder, created and probed before any work: a real folder, `cache` in it a
    real folder, each of `files` absent or a regular file, none of them an input."""
    out = prepare_out_dir(Path(out))
    check_folder(out / "cache")
    for name in files:
        check_target(out / name)
    check_not_inputs([out / name for name in files], [p for p in inputs if p])
    return out


def failure_message(executor: Executor, rows: list[dict], out) -> str | None:
    """The `error:` text of a run whose cluster failed (lost, or a worker killed), else None."""
    if not executor.lost and not executor.killed:
        return None
    done = sum(not str(r.get("error") or "").startswith("internal error") for r in rows)
    what = executor.lost or (f"{len(executor.killed)} worker(s) died (KilledWorker: out of "
                             "memory, or killed) and their rows are error rows")
    where = f" in {Path(out) / 'results.csv'}" if out is not None else ""
    return f"{what}; {done} of {len(rows)} rows finished and saved{where} (run it again to " \
           "simulate the rest)"


__all__ = ["run_configs", "evaluate_all", "results_frame", "prepare_out", "failure_message"]
