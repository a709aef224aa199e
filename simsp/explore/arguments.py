"""The flags `simsp sweep` and `simsp search` share: one comma-list flag per scenario field,
the Dask executor's --out/--workers/--scheduler/--force, and the memory reserve."""

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
                           help=field_help(field))
        if False in switches.get(field.path, {}):
            group.add_argument(switches[field.path][False], dest=_dest(field),
                               action="store_const", const="false",
                               help=f"set {field.section}.{field.key} to false")


def field_help(field) -> str:
    """`run`'s meaning, unit and default of the field's flag (simsp.flags, one table), or the
    switch's, else the field's name and default."""
    from simsp import flags
    if field.flag in flags.SCENARIO_FLAGS:
        return flags.flag_help(field.flag)
    switch = next((flag for flag, row in flags.SWITCHES.items()
                   if (row[0], row[1]) == field.path and row[2] is True), None)
    if switch is not None:
        return (f"{flags.SWITCHES[switch][3]} (true/false); default: "
                f"{str(field.default).lower()} [{field.section}.{field.key}]")
    return f"{field.key.replace('_', ' ')}; default: {field.default} [{field.section}.{field.key}]"


def field_lists(args, skip: tuple = ()) -> dict:
    """{field key: comma list text} of every field flag the user gave."""
    return {f.key: getattr(args, _dest(f)) for f in all_fields()
            if f.key not in skip and getattr(args, _dest(f), None) is not None}


def add_executor_arguments(parser, command: str = "sweep") -> None:
    """--out, --workers, --scheduler, --force (--quiet comes with every command: simsp.progress)."""
    parser.add_argument("--out", metavar="DIR", default=None,
                        help=f"results and report folder (default: reports/{command}-<scenario>"
                             "[-<what varies>], never one another exploration wrote)")
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


def add_reserve_argument(parser) -> None:
    """--memory-reserve GiB: what "fits" leaves free (simsp.explore.headroom)."""
    from simsp.explore.headroom import DEFAULT_MEMORY_RESERVE_GIB
    parser.add_argument("--memory-reserve", type=float, default=DEFAULT_MEMORY_RESERVE_GIB,
                        metavar="GiB", help="GPU memory kept free for the CUDA context, NCCL "
                        "buffers and allocator fragmentation; a row fits when its peak leaves "
                        f"it (default {DEFAULT_MEMORY_RESERVE_GIB:g}; docs/exploration.md)")


def check_reserve(gib: float, capacity_gib: float = 80.0) -> None:
    """The reserve must be a finite part of the GPU's memory."""
    import math
    if not (math.isfinite(gib) and 0 <= gib < capacity_gib):
        raise UserError("--memory-reserve", f"must be in [0, {capacity_gib:g}) GiB, got {gib}")
