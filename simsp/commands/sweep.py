"""`simsp sweep`: the cartesian product of comma-listed scenario flags (and/or a sweep file's
variants), simulated in parallel on Dask, written as results.csv/.jsonl and a what-if report."""

from pathlib import Path

from simsp.errors import UserError
from simsp.explore.fields import all_fields, switch_flags


def _dest(field) -> str:
    """argparse destination of a field's flag."""
    return f"sweep_{field.key}"


def add_field_arguments(parser, skip: tuple = (), metavar: str = "LIST",
                        title: str = "scenario fields (each takes a comma-separated list)") -> None:
    """One flag per scenario field, each taking a comma list; switches may stand alone."""
    group = parser.add_argument_group(title)
    switches = switch_flags()
    for field in all_fields():
        if field.key in skip:
            continue
        lone = field.kind is bool and True in switches.get(field.path, {})
        group.add_argument(field.flag, dest=_dest(field), default=None, metavar=metavar,
                           nargs="?" if lone else None, const="true" if lone else None,
                           help=f"{field.section}.{field.key}")
        if False in switches.get(field.path, {}):
            group.add_argument(switches[field.path][False], dest=_dest(field),
                               action="store_const", const="false", help="= false")


def field_lists(args, skip: tuple = ()) -> dict:
    """{field key: comma list text} of every field flag the user gave."""
    return {f.key: getattr(args, _dest(f)) for f in all_fields()
            if f.key not in skip and getattr(args, _dest(f), None) is not None}


def add_executor_arguments(parser, command: str = "sweep") -> None:
    """--out, --workers, --scheduler, --force (--quiet comes with every command: simsp.progress)."""
    parser.add_argument("--out", metavar="DIR", default=None,
                        help=f"results and report folder (default: reports/{command}-<name>/)")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="embedded Dask workers (default: one per core, at most the "
                             "machine's cores; 0: in this process)")
    parser.add_argument("--scheduler", default=None, metavar="ADDRESS",
                        help="run on an existing Dask cluster, tcp://HOST:PORT (its workers run "
                             "simsp's code as sent: use only a cluster you trust)")
    parser.add_argument("--force", action="store_true",
                        help="simulate rows (and a sweep) above run's estimated-time limit "
                             "(never above the memory limit; see README 'Limits')")


def check_executor_arguments(args) -> None:
    """--workers between 0 and the machine's cores; it has no meaning with --scheduler, whose
    address must be tcp://HOST:PORT."""
    from simsp.explore.executor import parse_scheduler
    from simsp.explore.guard import check_workers
    check_workers(args.workers)
    if args.workers is not None and args.scheduler:
        raise UserError("--workers", "conflicts with --scheduler (the cluster has its workers)")
    if args.scheduler is not None:
        parse_scheduler(args.scheduler)


def add_parser(subparsers) -> None:
    """Register `simsp sweep` and its flags."""
    parser = subparsers.add_parser("sweep", help="simulate every combination of comma-listed flags")
    parser.add_argument("source", nargs="?", help="scenario TOML or sweep TOML ([[variant]] tables)")
    add_field_arguments(parser)
    add_executor_arguments(parser)
    parser.set_defaults(handler=run)


def default_out(source, prefix: str) -> Path:
    """reports/<prefix>-<source stem>/ (or reports/<prefix>-default/)."""
    return Path("reports") / f"{prefix}-{Path(source).stem if source else 'default'}"


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
    from simsp.explore.api import build_configs, sweep_configs  # pandas and Dask: only here
    check_executor_arguments(args)
    out = Path(args.out) if args.out else default_out(args.source, "sweep")
    configs = build_configs(args.source, field_lists(args))
    frame = sweep_configs(configs, out, args.workers, args.scheduler,
                          getattr(args, "quiet", False), force=args.force,
                          inputs=(args.source,))
    print_summary(frame, out)
    print(frame.attrs["cache"])
    return 0
