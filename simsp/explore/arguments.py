"""The flags `simsp sweep` and `simsp search` share: one comma-list flag per scenario field,
the Dask executor's --out/--workers/--scheduler, and the default results folder."""

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
    """--out, --workers, --scheduler (--quiet comes with every command: simsp.progress)."""
    parser.add_argument("--out", metavar="DIR", default=None,
                        help=f"results and report folder (default: reports/{command}-<name>/)")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="embedded Dask workers (default: one per core; 0: in this process)")
    parser.add_argument("--scheduler", default=None, metavar="ADDRESS",
                        help="run on an existing Dask cluster, e.g. tcp://HOST:8786")


def check_executor_arguments(args) -> None:
    """--workers must be 0 or more; it has no meaning with --scheduler."""
    if args.workers is not None and args.workers < 0:
        raise UserError("--workers", f"must be 0 or more, got {args.workers}")
    if args.workers is not None and args.scheduler:
        raise UserError("--workers", "conflicts with --scheduler (the cluster has its workers)")


def default_out(source, prefix: str) -> Path:
    """reports/<prefix>-<source stem>/ (or reports/<prefix>-default/)."""
    return Path("reports") / f"{prefix}-{Path(source).stem if source else 'default'}"
