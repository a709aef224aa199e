"""simsp: a discrete-event simulator of GPT training on emulated A100 clusters.

Python API (each imports pandas and Dask only when called):
    simsp.run(scenario=None, **fields) -> dict        one iteration, `simsp run --json`'s metrics
    simsp.sweep(source=None, **lists) -> DataFrame    `simsp sweep`, one row per configuration
    simsp.search(scenario=None, gpus=N) -> DataFrame  `simsp search`, simulated layouts, best first
Fields are the scenario's keys (tensor_model_parallel_size=8, ib_bandwidth_GBps=50, mode="meta").
"""

from pathlib import Path

from simsp.version import __version__  # noqa: F401 (simsp.__version__)

RESERVE_GIB = None  # memory_verdict.DEFAULT_MEMORY_RESERVE_GIB (kept equal by a test): itemised


def run(scenario: str | Path | None = None, *, world_size: int | None = None, **fields) -> dict:
    """Simulate one iteration and return the metrics `simsp run --json` prints.

    Main keys: iteration_time_s, tokens_per_s, mfu, hfu, bubble_fraction, exposed_s_per_stage
    (seconds per stage by kind: compute, tp_comm, pp_transfer, pp_wait, dp_comm, optimizer),
    ranks (per rank: peak_bytes, oom, ...), oom. `world_size` derives d = N/(t·cp·p) as Megatron
    does, and the nodes as `simsp run --world-size` does. Refuses work beyond `simsp run`'s
    limits (UserError), as the command does."""
    from simsp.api import run as run_api
    return run_api(scenario, world_size=world_size, **fields)


def sweep(source: str | Path | None = None, *, out: str | Path | None = None,
          workers: int | None = None, scheduler: str | None = None, quiet: bool = False,
          memory_reserve_gib: float | None = RESERVE_GIB,
          world_size: int | list[int] | str | None = None, **lists):
    """Simulate every combination of the lists (a list, or a comma string, per field) on a
    scenario or sweep file; returns a pandas DataFrame, one row per configuration.

    Main columns: index, variant, gpus, command (the `simsp run` line that reproduces the row),
    note (what a world size did to d and the batch), every scenario field, status (ok / oom /
    error), error, iteration_time_s, tokens_per_s, mfu, hfu, bubble_fraction,
    exposed_<kind>_s, peak_bytes_max, headroom_bytes (capacity − reserve − peak), fits.
    `out`: write results.csv/.jsonl, report.md and figures there (and cache rows under
    out/cache). `workers`: embedded Dask worker processes (default one per core; 0: this
    process); started by fork on POSIX, so a plain script needs no `__main__` guard.
    `quiet`: no progress bar (default: on stderr when it is a terminal, the configurations
    done / total, as `simsp sweep` draws it).
    Example: simsp.sweep("scenarios/paper-175b.toml", world_size=[64, 128], workers=2)."""
    from simsp.api import sweep as sweep_api
    return sweep_api(source, out=out, workers=workers, scheduler=scheduler, quiet=quiet,
                     memory_reserve_gib=memory_reserve_gib, world_size=world_size, **lists)


def search(scenario: str | Path | None = None, *, gpus: int,
           global_batch_size: int | None = None, top: int = 5, objective: str = "time",
           memory_reserve_gib: float | None = RESERVE_GIB, exhaustive: bool = False,
           keep_scenario_parallel: bool = False, out: str | Path | None = None,
           workers: int | None = None, scheduler: str | None = None, quiet: bool = False,
           **fields):
    """Every layout of the scenario's model on `gpus` GPUs, screened by proven bounds and
    simulated until the top `top` are certain (docs/exploration.md); returns the simulated
    layouts as a DataFrame, best first by `objective` (time, tokens-per-s, mfu, memory), those
    that fit in memory less the reserve first. Columns as simsp.sweep's, plus
    time_lower_bound_s and memory_lower_bound_bytes. `fields`: model/cluster fields and the
    [parallel] fields the search does not vary, one value each (recompute_method="block").
    `quiet`: no progress bars (default: on stderr when it is a terminal, as `simsp search`)."""
    from simsp.api import search as search_api
    return search_api(scenario, gpus=gpus, global_batch_size=global_batch_size, top=top,
                      objective=objective, memory_reserve_gib=memory_reserve_gib,
                      exhaustive=exhaustive, keep_scenario_parallel=keep_scenario_parallel,
                      out=out, workers=workers, scheduler=scheduler, quiet=quiet, **fields)
