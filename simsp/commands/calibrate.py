"""`simsp calibrate nccl-tests`: fit simsp's link parameters to nccl-tests measurements.

    simsp calibrate nccl-tests FILE... [--collective C] [--gpus-per-node N] [--nodes K]
                               [--transfer-overhead-us X] [--out FRAGMENT.toml]

One-node runs fit the intra-node tier (nvlink_efficiency, nvlink_latency_us), multi-node runs
the inter-node tier (ib_efficiency, ib_latency_us); the forward model is simsp's own collective
timing, so `simsp run` with the fragment reproduces the fitted times. Prints, per file, measured
vs simsp per size (nccl-tests layout), then the parameters, then the [cluster] fragment (to
stdout, or to --out).
"""

from dataclasses import replace
from pathlib import Path

import numpy as np

from simsp.calibrate.fit import calibrate
from simsp.calibrate.fragment import describe_run, fragment_text, status_of
from simsp.calibrate.layout import measurement
from simsp.calibrate.link_model import LINK_FIELDS, busbw_of, predicted_times_s
from simsp.calibrate.nccl_log import read_log
from simsp.config import Cluster
from simsp.engine.ring_plan import COLLECTIVES
from simsp.errors import UserError


def add_parser(subparsers) -> None:
    """Register `simsp calibrate` with its one source, `nccl-tests`."""
    parser = subparsers.add_parser("calibrate", help="fit link parameters to measurements",
                                   description=__doc__.split("\n\n")[0])
    sources = parser.add_subparsers(dest="source", required=True, parser_class=type(parser))
    nccl = sources.add_parser("nccl-tests", help="nccl-tests *_perf output files",
                              description=__doc__.split("\n\n")[2])
    nccl.add_argument("files", nargs="+", metavar="FILE", help="nccl-tests output (text)")
    nccl.add_argument("--collective", choices=COLLECTIVES, default=None,
                      help="the collective, when the log does not say")
    nccl.add_argument("--gpus-per-node", type=int, default=None,
                      help="ranks per node, when the log has no Rank lines")
    nccl.add_argument("--nodes", type=int, default=None,
                      help="nodes, when the log has no Rank lines")
    nccl.add_argument("--transfer-overhead-us", type=float, default=None,
                      help="held per-step overhead (default: the cluster's, 0)")
    nccl.add_argument("--out", metavar="FRAGMENT.toml", default=None,
                      help="write the [cluster] fragment here instead of stdout")
    nccl.set_defaults(handler=run)


def run(args) -> int:
    """Read every file, fit tier by tier, print the tables and the fragment."""
    _check_flags(args)
    base = _base_cluster(args)
    measurements = [measurement(read_log(path), args.collective, args.nodes, args.gpus_per_node)
                    for path in args.files]
    links, fits = calibrate(base, measurements)
    for m in measurements:
        print("\n".join(comparison_table(base, links, m)))
        print()
    print("\n".join(parameter_lines(base, links, fits)))
    print()
    text = fragment_text(base, links, fits, measurements)
    _emit(text, args.out)
    return 0


def _check_flags(args) -> None:
    """Positive layout flags; the output's folder must exist."""
    for flag, value in (("--gpus-per-node", args.gpus_per_node), ("--nodes", args.nodes)):
        if value is not None and value < 1:
            raise UserError(flag, f"must be positive, got {value}")
    if args.transfer_overhead_us is not None and not args.transfer_overhead_us >= 0:
        raise UserError("--transfer-overhead-us", "must not be negative")
    if args.out and not Path(args.out).resolve().parent.is_dir():
        raise UserError("--out", f"folder {Path(args.out).parent} does not exist")


def _base_cluster(args) -> Cluster:
    """simsp's default DGX A100 cluster, with the held overhead if given."""
    base = Cluster()
    if args.transfer_overhead_us is not None:
        base = replace(base, transfer_overhead_us=args.transfer_overhead_us)
    return base


def _emit(text: str, out: str | None) -> None:
    """The fragment to --out, or to stdout."""
    if out is None:
        print(text, end="")
        return
    Path(out).write_text(text, encoding="utf-8")
    print(f"fragment: {out}")


def comparison_table(base: Cluster, links: dict, m) -> list[str]:
    """nccl-tests-like rows: measured out-of-place / in-place vs simsp, errors and busbw."""
    predicted = predicted_times_s(base, m, links)[::2]  # (rows,): one per size
    lines = [f"# {m.path}: {describe_run(m)}, {m.elem_bytes}-byte elements"
             + (f", {m.skipped_rows} size-0 row(s) skipped" if m.skipped_rows else ""),
             f"# {'size':>12} {'count':>12} {'type':>8} {'redop':>6} {'oop time':>10} "
             f"{'ip time':>10} {'simsp':>10} {'err oop':>8} {'err ip':>8} {'busbw':>8} "
             f"{'simsp':>8}",
             f"# {'(B)':>12} {'(elements)':>12} {'':>8} {'':>6} {'(us)':>10} {'(us)':>10} "
             f"{'(us)':>10} {'(%)':>8} {'(%)':>8} {'(GB/s)':>8} {'(GB/s)':>8}"]
    errors = []
    for row, sim_s in zip(m.rows, predicted):
        oop, ip = row.out_of_place_us, row.in_place_us
        pair = (100 * (sim_s * 1e6 / oop - 1), 100 * (sim_s * 1e6 / ip - 1))
        errors += [abs(e) for e in pair]
        lines.append(f"  {row.size_bytes:>12} {row.count:>12} {row.dtype:>8} {row.redop:>6} "
                     f"{oop:>10.2f} {ip:>10.2f} {sim_s * 1e6:>10.2f} {pair[0]:>+8.2f} "
                     f"{pair[1]:>+8.2f} {busbw_of(m, row.size_bytes, oop * 1e-6):>8.2f} "
                     f"{busbw_of(m, row.size_bytes, sim_s):>8.2f}")
    floor_us = _latency_floor_us(base, links, m)
    lines.append(f"# mean |error| {np.mean(errors):.2f}%, worst {max(errors):.2f}%; simsp's "
                 f"latency floor (size 0) {floor_us:.2f} us")
    return lines


def _latency_floor_us(base: Cluster, links: dict, m) -> float:
    """simsp's time of a zero-byte call on this layout: the part of the time the data pins
    down as per-step latency (link latency + transfer_overhead_us per step, summed)."""
    zero = replace(m, sizes_bytes=(0,), times_s=(1.0,))
    return float(predicted_times_s(base, zero, links)[0]) * 1e6


def parameter_lines(base: Cluster, links: dict, fits) -> list[str]:
    """Each tier's fit quality, then every link field with its value, error and status."""
    lines = []
    for fit in fits:
        lines.append(f"# {fit.tier}-node tier: rms relative error {100 * fit.rms_relative_error:.2f}%"
                     f" after {fit.iterations} Gauss-Newton iteration(s)")
    stderr = {k: v for fit in fits for k, v in fit.std_errors.items()}
    for name in LINK_FIELDS:
        sigma = f" +- {stderr[name]:.2g}" if name in stderr else ""
        lines.append(f"#   {name:<22} {links[name]:<12.6g}{sigma:<12} {status_of(name, fits)}")
    return lines
