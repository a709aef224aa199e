"""`simsp calibrate nccl-tests`: fit simsp's link parameters to nccl-tests measurements.

    simsp calibrate nccl-tests FILE... [--collective C] [--gpus-per-node N] [--nodes K]
                               [--transfer-overhead-us X] [--nccl-algo A] [--nccl-proto P]
                               [--out FRAGMENT.toml] [--json]

One-node runs fit the intra-node tier (nvlink_efficiency, nvlink_latency_us), multi-node runs
the inter-node tier (ib_efficiency, ib_latency_us); the forward model is simsp's own collective
timing, at the algorithm and protocol NCCL picks per size (docs/nccl.md; --nccl-algo /
--nccl-proto when the logs ran with NCCL_ALGO / NCCL_PROTO), so `simsp run` with the fragment
reproduces the fitted times. Prints, per file, measured
vs simsp per size (nccl-tests layout), then the parameters, then the [cluster] fragment (to
stdout, or to --out).
"""

from dataclasses import replace

from simsp.scenario.limits import BOUNDS, check_field
from simsp.calibrate.fit import calibrate
from simsp.calibrate.layout import measurement
from simsp.calibrate.nccl_log import read_log
from simsp.calibrate.summary import report
from simsp.calibrate import gemm_command
from simsp.scenario.config import Cluster
from simsp.scenario.table.cluster import NCCL_ALGO_CHOICES, NCCL_PROTO_CHOICES
from simsp.calibrate.nccl_log import ALL_TO_ALL
from simsp.engine.collectives.ring_plan import COLLECTIVES
from simsp.errors import UserError
from simsp.jsonout import dumps
from simsp.io_out import check_out_file, write_file


def add_parser(subparsers) -> None:
    """Register `simsp calibrate` with its one source, `nccl-tests`."""
    parser = subparsers.add_parser("calibrate", help="fit link parameters to measurements",
                                   description=__doc__.split("\n\n")[0])
    sources = parser.add_subparsers(dest="source", required=True, parser_class=type(parser))
    nccl = sources.add_parser("nccl-tests", help="nccl-tests *_perf output files",
                              description=__doc__.split("\n\n")[2])
    nccl.add_argument("files", nargs="+", metavar="FILE", help="nccl-tests output (text)")
    nccl.add_argument("--collective", choices=COLLECTIVES + (ALL_TO_ALL,), default=None,
                      help="the collective, when the log does not say")
    nccl.add_argument("--gpus-per-node", type=int, default=None,
                      help="ranks per node, when the log has no Rank lines or abbreviates them")
    nccl.add_argument("--nodes", type=int, default=None,
                      help="nodes, when the log has no Rank lines or abbreviates them")
    nccl.add_argument("--transfer-overhead-us", type=float, default=None,
                      help="held per-step overhead (default: the cluster's, 0)")
    nccl.add_argument("--nccl-algo", choices=NCCL_ALGO_CHOICES, default="auto",
                      help="the NCCL_ALGO the logs ran with (default auto: NCCL's choice)")
    nccl.add_argument("--nccl-proto", choices=NCCL_PROTO_CHOICES, default="auto",
                      help="the NCCL_PROTO the logs ran with (default auto: NCCL's choice)")
    nccl.add_argument("--out", metavar="FRAGMENT.toml", default=None,
                      help="write the [cluster] fragment here instead of stdout")
    nccl.add_argument("--json", action="store_true",
                      help="print one JSON object (runs, tiers, parameters, fragment)")
    nccl.set_defaults(handler=run)
    gemm_command.add_parser(sources)


def run(args) -> int:
    """Read every file, fit tier by tier, print the tables (or JSON) and the fragment."""
    _check_flags(args)
    base = _base_cluster(args)
    measurements = [measurement(read_log(path), args.collective, args.nodes, args.gpus_per_node)
                    for path in args.files]
    links, fits = calibrate(base, measurements)
    document = report(base, links, fits, measurements)
    if args.out:
        write_file(args.out, document["fragment"])
    if args.json:
        print(dumps(document, indent=2))
        return 0
    for run_doc in document["runs"]:
        print("\n".join(comparison_lines(run_doc)) + "\n")
    print("\n".join(parameter_lines(document)) + "\n")
    if args.out:
        print(f"fragment: {args.out}")
    else:
        print(document["fragment"], end="")
    return 0


def _check_flags(args) -> None:
    """Positive layout flags; the output's folder must exist."""
    for flag, value in (("--gpus-per-node", args.gpus_per_node), ("--nodes", args.nodes)):
        if value is not None and value < 1:
            raise UserError(flag, f"must be positive, got {value}")
    if args.transfer_overhead_us is not None:
        try:
            check_field("cluster.transfer_overhead_us", args.transfer_overhead_us)
        except UserError as exc:
            raise UserError("--transfer-overhead-us", exc.reason) from None
    for flag, value in (("--gpus-per-node", args.gpus_per_node), ("--nodes", args.nodes)):
        bound = BOUNDS[f"cluster.{flag[2:].replace('-', '_')}"]
        if value is not None and value > bound.high:
            raise UserError(flag, f"{value} is above the limit of {int(bound.high)}")
    if args.out:
        check_out_file(args.out, "--out", args.files)


def _base_cluster(args) -> Cluster:
    """simsp's default DGX A100 cluster, with the held overhead if given."""
    base = replace(Cluster(), nccl_algo=args.nccl_algo, nccl_proto=args.nccl_proto)
    if args.transfer_overhead_us is not None:
        base = replace(base, transfer_overhead_us=args.transfer_overhead_us)
    return base


def comparison_lines(run_doc: dict) -> list[str]:
    """nccl-tests-like rows: measured out-of-place / in-place vs simsp, errors and busbw."""
    skipped = run_doc["skipped_rows"]
    lines = [f"# {run_doc['file']}: {run_doc['description']}, {run_doc['elem_bytes']}-byte "
             "elements" + (f", {skipped} size-0 row(s) skipped" if skipped else ""),
             f"# {'size':>12} {'count':>12} {'type':>8} {'redop':>6} {'oop time':>10} "
             f"{'ip time':>10} {'simsp':>10} {'err oop':>8} {'err ip':>8} {'busbw':>8} "
             f"{'simsp':>8}",
             f"# {'(B)':>12} {'(elements)':>12} {'':>8} {'':>6} {'(us)':>10} {'(us)':>10} "
             f"{'(us)':>10} {'(%)':>8} {'(%)':>8} {'(GB/s)':>8} {'(GB/s)':>8}"]
    for r in run_doc["rows"]:
        lines.append(f"  {r['size_bytes']:>12} {r['count']:>12} {r['type']:>8} {r['redop']:>6} "
                     f"{r['out_of_place_us']:>10.2f} {r['in_place_us']:>10.2f} "
                     f"{r['simsp_us']:>10.2f} {r['error_out_of_place_pct']:>+8.2f} "
                     f"{r['error_in_place_pct']:>+8.2f} {r['busbw_GBps']:>8.2f} "
                     f"{r['simsp_busbw_GBps']:>8.2f}")
    lines.append(f"# mean |error| {run_doc['mean_abs_error_pct']:.2f}%, worst "
                 f"{run_doc['worst_abs_error_pct']:.2f}%; simsp's latency floor (size 0) "
                 f"{run_doc['latency_floor_us']:.2f} us")
    return lines


def parameter_lines(document: dict) -> list[str]:
    """Each tier's fit quality, then every link field with its value, error and status."""
    lines = [f"# {t['tier']}-node tier: rms relative error {100 * t['rms_relative_error']:.2f}% "
             f"after {t['iterations']} Gauss-Newton iteration(s)" for t in document["tiers"]]
    for name, p in document["parameters"].items():
        sigma = f" +- {p['std_error']:.2g}" if p["std_error"] is not None else ""
        lines.append(f"#   {name:<22} {p['value']:<12.6g}{sigma:<12} {p['status']}")
    return lines
