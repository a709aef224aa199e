"""A calibration's results as data: per run measured vs simsp per size, per tier the fit, every
link parameter with its status, and the fragment (`simsp calibrate nccl-tests --json`)."""

from dataclasses import replace

import numpy as np

from simsp.calibrate.fragment import describe_run, fragment_text, status_of
from simsp.calibrate.layout import Measurement
from simsp.calibrate.link_model import LINK_FIELDS, busbw_of, predicted_times_s
from simsp.scenario.config import Cluster


def report(base: Cluster, links: dict, fits: list, measurements: list[Measurement]) -> dict:
    """The --json document: per run its rows vs simsp, per tier its fit, every parameter."""
    stderr = {k: v for fit in fits for k, v in fit.std_errors.items()}
    return {
        "runs": [run_report(base, links, m) for m in measurements],
        "tiers": [{"tier": f.tier, "rms_relative_error": f.rms_relative_error,
                   "iterations": f.iterations} for f in fits],
        "parameters": {name: {"value": links[name], "std_error": stderr.get(name),
                              "status": status_of(name, fits)} for name in LINK_FIELDS},
        "fragment": fragment_text(base, links, fits, measurements),
    }


def run_report(base: Cluster, links: dict, m: Measurement) -> dict:
    """One run: its layout and, per size, measured and simsp times with signed errors."""
    predicted = predicted_times_s(base, m, links)[::2]  # (rows,): one per size
    rows = []
    for row, sim_s in zip(m.rows, predicted):
        oop, ip, sim_us = row.out_of_place_us, row.in_place_us, float(sim_s) * 1e6
        rows.append({"size_bytes": row.size_bytes, "count": row.count, "type": row.dtype,
                     "redop": row.redop, "out_of_place_us": oop, "in_place_us": ip,
                     "simsp_us": sim_us, "error_out_of_place_pct": 100 * (sim_us / oop - 1),
                     "error_in_place_pct": 100 * (sim_us / ip - 1),
                     "busbw_GBps": busbw_of(m, row.size_bytes, oop * 1e-6),
                     "simsp_busbw_GBps": busbw_of(m, row.size_bytes, float(sim_s))})
    errors = [abs(r[k]) for r in rows for k in ("error_out_of_place_pct", "error_in_place_pct")]
    return {"file": m.path, "collective": m.collective, "ranks": m.ranks, "nodes": m.nodes,
            "tier": m.tier, "description": describe_run(m), "elem_bytes": m.elem_bytes,
            "skipped_rows": m.skipped_rows, "rows": rows,
            "mean_abs_error_pct": float(np.mean(errors)), "worst_abs_error_pct": max(errors),
            "latency_floor_us": _latency_floor_us(base, links, m)}


def _latency_floor_us(base: Cluster, links: dict, m: Measurement) -> float:
    """simsp's time of a zero-byte call on this layout: the part of the time the data pins
    down as per-step latency (link latency + transfer_overhead_us per step, summed)."""
    zero = replace(m, sizes_bytes=(0,), times_s=(1.0,))
    return float(predicted_times_s(base, zero, links)[0]) * 1e6
