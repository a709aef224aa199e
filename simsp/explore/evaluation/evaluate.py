"""One configuration -> one result row: simulate an iteration in this process, collect metrics.

This is the function Dask workers run; it imports nothing from the executor and returns plain
JSON-ready values. An invalid configuration is a row with its `error:` text; out of memory is a
row with its verdict, the stage and the bytes over.
"""

from simsp.scenario.loading import load_scenario
from simsp.errors import UserError
from simsp.explore.evaluation.flatten import flatten_metrics
from simsp.gc_pause import gc_paused
from simsp.hardware.constants import GPUS
from simsp.metrics.collect import collect
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
from simsp.training.non_tensor_memory import non_tensor_bytes

TERA = 1e12


def simulate_metrics(overrides: dict) -> dict:
    """The metrics dict of `simsp run --json` for one configuration, an OOM verdict's live
    tensors unnamed (raises UserError)."""
    return collect_metrics(load_scenario(None, overrides), name_live=False)


def collect_metrics(sc, name_live: bool = True) -> dict:
    """Simulate one iteration of a validated scenario, recording no trace (a row writes none;
    the metrics are the same), and collect `simsp run --json`'s metrics; `name_live=False`:
    an out-of-memory verdict without the live tensors' names (a row has only its bytes).
    The collector stays paused throughout and the world is released at the end, so it is
    freed at once, not rescanned by collections (about 10% of a 175B row, and half the
    memory a worker holds between collections: docs/PERFORMANCE.md)."""
    with gc_paused():  # the world is freed by reference counting below, never collected
        shortcuts = Shortcuts.for_scale(sc)
        run = simulate_iteration(sc, shortcuts, trace="none")
        metrics = collect(run, shortcuts, name_live)
        run.inputs.world.release()
    return metrics


def _exposed_by_kind(metrics: dict) -> dict:
    """`exposed_<kind>_s`: the most any stage waited on each kind of communication."""
    stages = metrics.get("exposed_s_per_stage") or metrics.get("exposed_comm_s_per_stage") or []
    kinds = dict.fromkeys(kind for stage in stages for kind in stage)
    return {f"exposed_{kind}_s": max(stage.get(kind, 0.0) for stage in stages) for kind in kinds}


def _oom_columns(metrics: dict, capacity_bytes: int) -> dict:
    """The first out-of-memory stage, by how much its peak exceeds capacity (the bytes to cut),
    and by how much the first allocation that failed overflowed."""
    for rank in sorted(metrics["ranks"], key=lambda r: (r["pp"], r["rank"])):
        detail = rank.get("oom_detail")
        if rank["oom"] and detail:
            first = detail["bytes_in_use"] + detail["bytes_asked"] - detail["capacity_bytes"]
            return {"oom_stage": rank["pp"], "oom_bytes_over": rank["peak_bytes"] - capacity_bytes,
                    "oom_first_overflow_bytes": first}
    return {"oom_stage": None, "oom_bytes_over": None, "oom_first_overflow_bytes": None}


def _held_for_wgrad_at_peak(metrics: dict, stage: int, peak_bytes: int) -> int:
    """Bytes held for deferred W steps (the ledger's held_for_wgrad) at the peak of the rank of
    `stage` whose peak is `peak_bytes`: what a split backward's W deferral costs there."""
    return max((r["at_peak_bytes"].get("held_for_wgrad", 0) for r in metrics["ranks"]
                if r["pp"] == stage and r["peak_bytes"] == peak_bytes), default=0)


def summary_columns(metrics: dict, capacity_bytes: int) -> dict:
    """The issue's named columns first: time, throughput, utilisation, memory, OOM."""
    gpus = metrics["layout"]["gpus"]
    peaks = {}
    for rank in metrics["ranks"]:
        peaks[rank["pp"]] = max(peaks.get(rank["pp"], 0), rank["peak_bytes"])
    peak_stage = max(peaks, key=lambda pp: (peaks[pp], -pp))
    row = {"iteration_time_s": metrics["iteration_time_s"], "tokens_per_s": metrics["tokens_per_s"],
           "tflops_per_gpu": metrics["model_flops"] / metrics["iteration_time_s"] / gpus / TERA,
           "mfu": metrics["mfu"], "hfu": metrics["hfu"],
           "bubble_fraction": metrics["bubble_fraction"], **_exposed_by_kind(metrics),
           "peak_bytes_max": peaks[peak_stage], "peak_stage": peak_stage,
           "held_for_wgrad_at_peak_bytes": _held_for_wgrad_at_peak(metrics, peak_stage,
                                                                   peaks[peak_stage]),
           "capacity_bytes": capacity_bytes, "headroom_bytes": capacity_bytes - peaks[peak_stage],
           "oom": metrics["oom"], **_oom_columns(metrics, capacity_bytes)}
    return row


def evaluate(values: tuple) -> dict:
    """Result row of one configuration, given as ((section, key), value) pairs."""
    overrides = dict(values)
    try:
        sc = load_scenario(None, overrides)
        metrics = collect_metrics(sc, name_live=False)
    except UserError as exc:
        return {"status": "error", "error": f"error: {exc}"}
    except Exception as exc:  # noqa: BLE001  a simulator bug in one row must not end the sweep
        return {"status": "error", "error": f"internal error: {type(exc).__name__}: {exc}"}
    capacity = GPUS[overrides[("cluster", "gpu")]].memory_bytes
    row = {"status": "oom" if metrics["oom"] else "ok", "error": None}
    row.update(summary_columns(metrics, capacity))
    row["non_tensor_bytes"] = non_tensor_bytes(sc)
    row.update({k: v for k, v in flatten_metrics(metrics).items() if k not in row})
    return row

