"""`simsp.sweep(...)`: the Python face of `simsp sweep`, returning the results as a DataFrame."""

import os
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from simsp.errors import UserError
from simsp.explore.evaluation.cache import ResultCache
from simsp.explore.configs.grid import Config, base_values, expand, parse_list
from simsp.explore.evaluation.executor import Executor
from simsp.explore.configs.fields import by_key
from simsp.explore.evaluation.limits import check_count, check_sweep, grid_size
from simsp.explore.results.headroom import DEFAULT_MEMORY_RESERVE_GIB, add_headroom, reserve_bytes
from simsp.explore.evaluation.runner import (failure_message, prepare_out, results_frame,
                                             run_configs)
from simsp.explore.configs.sweep_file import is_sweep_file, load_sweep_file
from simsp.explore.results.table import write_results


def _axis_values(field, values) -> list:
    """A list given in Python (kept as is) or a comma list of text (typed like the field)."""
    if isinstance(values, str):
        return parse_list(field, values)
    return list(values) if isinstance(values, (list, tuple)) else [values]


def build_configs(source: str | Path | None = None, lists: dict | None = None) -> list[Config]:
    """The configurations of a sweep: a scenario (or sweep file) times the lists' product.

    `lists` maps a field name (`tensor_model_parallel_size` or `parallel.<key>`) to its values."""
    table = by_key()
    axes, worlds = [], None
    for name, values in (lists or {}).items():
        if name == "world_size":
            worlds = _world_sizes(values)
            continue
        if name not in table:
            raise UserError(name, "unknown scenario field")
        axes.append((table[name], _axis_values(table[name], values)))
    if source is not None and is_sweep_file(source):
        variants = load_sweep_file(source)
    else:
        variants = [("", base_values(source), set(), None if source is None else str(source))]
    check_count(grid_size(len(variants) * len(worlds or [None]),
                          [len(choices) for _, choices in axes]))
    return expand(variants, axes, worlds)


def _world_sizes(values) -> list[int]:
    """--world-size's comma list (or a Python int or list) as positive integers."""
    items = str(values).split(",") if isinstance(values, str) else _axis_values(None, values)
    sizes = []
    for item in items:
        text = str(item).strip()
        if not text.isdigit() or int(text) < 1:
            raise UserError("--world-size", f"{text!r} is not a positive integer")
        sizes.append(int(text))
    return sizes


def sweep_configs(configs: list[Config], out: str | Path | None = None,
                  workers: int | None = None, scheduler: str | None = None,
                  quiet: bool = True, report: bool = True, force: bool = False,
                  inputs: tuple = (),
                  memory_reserve_gib: float | None = DEFAULT_MEMORY_RESERVE_GIB,
                  stream: bool = False) -> pd.DataFrame:
    """Simulate every configuration; write results (and the what-if report) under `out`.
    Checked before any cluster starts: run's work limits (simsp.explore.evaluation.limits), the
    output folder (`inputs`: files this sweep reads, never overwritten). A row fits when its peak
    leaves `memory_reserve_gib` free (simsp.explore.results.headroom). The frame's attrs["cache"]
    says what the cache did; a lost cluster raises UserError once the finished rows are
    written. `stream`: print each row's line to stdout as it is ready, in order."""
    check_sweep(configs, force)
    out = prepare_out(out, inputs) if out is not None else None
    cache = ResultCache(out / "cache" if out is not None else None)
    with Executor(workers, scheduler, force) as executor:
        rows = run_configs(configs, executor, out, quiet, cache,
                           stream, reserve_bytes(memory_reserve_gib))
    rows = [add_headroom(row, reserve_bytes(memory_reserve_gib)) for row in rows]
    frame = results_frame(rows)
    frame.attrs["cache"] = cache.stats.line()
    if out is not None:
        write_results(rows, frame, out)
        if report:
            from simsp.report.sweep.report_md import write_whatif_report
            write_whatif_report(frame, Path(out))
    failure = failure_message(executor, rows, out)
    if failure:
        raise UserError("dask", failure)
    return frame


@contextmanager
def script_safe_workers():
    """Start Dask worker processes by fork where the platform has it, so a plain script (no
    `if __name__ == "__main__":` guard) is not re-run in every worker (spawn re-imports the
    main module); a method the user configured is kept."""
    import dask
    import distributed  # noqa: F401  (registers distributed's config before we set a key)
    method = dask.config.get("distributed.worker.multiprocessing-method", "spawn")
    if os.name != "posix" or method != "spawn":
        yield
        return
    with dask.config.set({"distributed.worker.multiprocessing-method": "fork"}):
        yield


def sweep(source: str | Path | None = None, *, out: str | Path | None = None,
          workers: int | None = None, scheduler: str | None = None, quiet: bool = False,
          memory_reserve_gib: float | None = DEFAULT_MEMORY_RESERVE_GIB,
          world_size: int | list[int] | str | None = None, **lists) -> pd.DataFrame:
    """Sweep a scenario or sweep file over lists of field values; one row per configuration.

    Example: simsp.sweep("scenarios/paper-175b.toml", tensor_model_parallel_size=[4, 8],
    recompute_granularity="none,selective,full", workers=2). workers=0 runs in this process."""
    if world_size is not None:
        lists["world_size"] = world_size
    with script_safe_workers():
        return sweep_configs(build_configs(source, lists), out, workers, scheduler, quiet,
                             memory_reserve_gib=memory_reserve_gib)


def search(scenario: str | Path | None = None, *, gpus: int, global_batch_size: int | None = None,
           top: int = 5, objective: str = "time",
           memory_reserve_gib: float | None = DEFAULT_MEMORY_RESERVE_GIB, exhaustive: bool = False,
           keep_scenario_parallel: bool = False, out: str | Path | None = None,
           workers: int | None = None, scheduler: str | None = None, quiet: bool = False,
           **fields) -> pd.DataFrame:
    """The layouts `simsp search` simulated, best first (those that fit first); model, cluster
    and held [parallel] fields as keyword arguments, one value each; a layout field
    (tensor_model_parallel_size=[4, 8], recompute_granularity="full") restricts the layouts.
    With `out`, writes there what `simsp search --out` writes: the cache, results.csv,
    results.jsonl and the report."""
    from simsp.explore.results.headroom import reserve_bytes
    from simsp.explore.search.layouts import RESTRICTABLE, search_start
    from simsp.explore.search.branch_and_bound import search as run_search
    from simsp.report.sweep.report_md import ranked
    table = by_key()
    given, allowed = {}, {}
    for name, value in fields.items():
        if name not in table:
            raise UserError(name, "unknown scenario field")
        if table[name].key in RESTRICTABLE:
            allowed[table[name].key] = _axis_values(table[name], value)
            continue
        given[table[name].path] = value
    base, fixed = search_start(scenario, given, keep_scenario_parallel)
    batch = global_batch_size or base[("parallel", "global_batch_size")]
    if not isinstance(gpus, int) or gpus < 1 or not isinstance(batch, int) or batch < 1:
        raise UserError("gpus", f"gpus and the global batch must be positive integers, got "
                                f"{gpus} and {batch}")
    folder = None if out is None else prepare_out(out, (scenario,))
    with script_safe_workers(), Executor(workers, scheduler) as executor:
        result = run_search(base, gpus, batch, executor,
                            ResultCache(folder / "cache" if folder else None), top, objective,
                            reserve_bytes(memory_reserve_gib), quiet, fixed, exhaustive,
                            None if scenario is None else str(scenario), allowed,
                            given.get(("cluster", "nodes")))
    if folder is not None:  # the command's results and report (commands/search.py)
        from simsp.commands.search import write_outputs
        write_outputs(result, folder, SimpleNamespace(gpus=gpus, top=top, objective=objective,
                                                      memory_reserve=memory_reserve_gib),
                      batch, fixed)
    frame = results_frame(result.rows)
    return ranked(frame, objective).reset_index(drop=True) if len(frame) else frame


def run(scenario: str | Path | None = None, *, world_size: int | None = None, **fields) -> dict:
    """The metrics of `simsp run --json` for a scenario with field overrides (keyword
    arguments named like the scenario's keys: tensor_model_parallel_size=8, mode="meta")."""
    from simsp.scenario.work import check_work
    from simsp.scenario.loading import load_scenario
    from simsp.explore.evaluation.evaluate import collect_metrics
    table = by_key()
    overrides = {}
    for name, value in fields.items():
        if name not in table:
            raise UserError(name, "unknown scenario field")
        overrides[table[name].path] = value
    sc = load_scenario(scenario, overrides, world_size)
    check_work(sc)  # the limits `simsp run` keeps (README "Limits")
    return collect_metrics(sc)
