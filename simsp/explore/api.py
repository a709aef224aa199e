"""`simsp.sweep(...)`: the Python face of `simsp sweep`, returning the results as a DataFrame."""

from pathlib import Path

import pandas as pd

from simsp.errors import UserError
from simsp.explore.configs import Config, base_values, expand, parse_list
from simsp.explore.executor import Executor
from simsp.explore.fields import by_key
from simsp.explore.cache import ResultCache
from simsp.explore.guard import check_count, check_sweep, grid_size
from simsp.explore.runner import failure_message, prepare_out, results_frame, run_configs
from simsp.explore.sweepfile import is_sweep_file, load_sweep_file
from simsp.explore.table import write_results


def _axis_values(field, values) -> list:
    """A list given in Python (kept as is) or a comma list of text (typed like the field)."""
    if isinstance(values, str):
        return parse_list(field, values)
    return list(values) if isinstance(values, (list, tuple)) else [values]


def build_configs(source: str | Path | None = None, lists: dict | None = None) -> list[Config]:
    """The configurations of a sweep: a scenario (or sweep file) times the lists' product.

    `lists` maps a field name (`tensor_model_parallel_size` or `parallel.<key>`) to its values."""
    table = by_key()
    axes = []
    for name, values in (lists or {}).items():
        if name not in table:
            raise UserError(name, "unknown scenario field")
        axes.append((table[name], _axis_values(table[name], values)))
    if source is not None and is_sweep_file(source):
        variants = load_sweep_file(source)
    else:
        variants = [("", base_values(source))]
    check_count(grid_size(len(variants), [len(choices) for _, choices in axes]))
    return expand(variants, axes)


def sweep_configs(configs: list[Config], out: str | Path | None = None,
                  workers: int | None = None, scheduler: str | None = None,
                  quiet: bool = True, report: bool = True, force: bool = False,
                  inputs: tuple = ()) -> pd.DataFrame:
    """Simulate every configuration; write results (and the what-if report) under `out`.
    Checked before any cluster starts: run's work limits (simsp.explore.guard), the output
    folder (`inputs`: files this sweep reads, never overwritten). The frame's
    attrs["cache"] says what the cache did; a lost cluster raises UserError once the
    finished rows are written."""
    check_sweep(configs, force)
    out = prepare_out(out, inputs) if out is not None else None
    cache = ResultCache(out / "cache" if out is not None else None)
    with Executor(workers, scheduler, force) as executor:
        rows = run_configs(configs, executor, out, quiet, cache)
    frame = results_frame(rows)
    frame.attrs["cache"] = cache.stats.line()
    if out is not None:
        write_results(rows, frame, out)
        if report:
            from simsp.report.whatif import write_whatif_report
            write_whatif_report(frame, Path(out))
    failure = failure_message(executor, rows, out)
    if failure:
        raise UserError("dask", failure)
    return frame


def sweep(source: str | Path | None = None, out: str | Path | None = None,
          workers: int | None = None, scheduler: str | None = None, quiet: bool = True,
          **lists) -> pd.DataFrame:
    """Sweep a scenario or sweep file over lists of field values; one row per configuration.

    Example: simsp.sweep("scenarios/paper-175b.toml", tensor_model_parallel_size=[4, 8],
    recompute_granularity="none,selective,full", workers=2). workers=0 runs in this process."""
    return sweep_configs(build_configs(source, lists), out, workers, scheduler, quiet)
