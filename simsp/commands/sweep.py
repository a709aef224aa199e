"""`simsp sweep`: the cartesian product of comma-listed scenario flags (and/or a sweep file's
variants), simulated in parallel on Dask, written as results.csv/.jsonl and a what-if report."""

from pathlib import Path

from simsp.explore.arguments import (add_executor_arguments, add_field_arguments,
                                    check_executor_arguments, default_out, field_lists)


def add_parser(subparsers) -> None:
    """Register `simsp sweep` and its flags."""
    parser = subparsers.add_parser("sweep", help="simulate every combination of comma-listed flags")
    parser.add_argument("source", nargs="?", help="scenario TOML or sweep TOML ([[variant]] tables)")
    add_field_arguments(parser)
    add_executor_arguments(parser)
    parser.set_defaults(handler=run)


def print_summary(frame, out: Path) -> None:
    """One line per configuration: status, time, MFU, peak; then where the files are."""
    for row in frame.itertuples(index=False):
        if row.status == "error":
            print(f"{row.index:4d}  {row.variant}: {row.error}")
            continue
        verdict = "OOM" if row.oom else "ok "
        print(f"{row.index:4d}  {verdict} {row.iteration_time_s:9.3f} s  MFU {row.mfu:6.1%}  "
              f"peak {row.peak_bytes_max / 2**30:6.1f} GiB  {row.variant}")
    print(f"results: {out / 'results.csv'}, {out / 'results.jsonl'}, {out / 'report.md'}")


def run(args) -> int:
    """Expand the configurations, simulate them, write and print the results."""
    from simsp.api import build_configs, sweep_configs  # pandas and Dask: only here
    check_executor_arguments(args)
    out = Path(args.out) if args.out else default_out(args.source, "sweep")
    configs = build_configs(args.source, field_lists(args))
    frame = sweep_configs(configs, out, args.workers, args.scheduler,
                          getattr(args, "quiet", False), force=args.force,
                          inputs=(args.source,))
    print_summary(frame, out)
    print(frame.attrs["cache"])
    return 0
