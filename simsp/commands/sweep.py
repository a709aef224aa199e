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


def add_parser(subparsers) -> None:
    """Register `simsp sweep` and its flags."""
    parser = subparsers.add_parser("sweep", help="simulate every combination of comma-listed flags")
    parser.add_argument("source", nargs="?", help="scenario TOML or sweep TOML ([[variant]] tables)")
    add_field_arguments(parser)
    parser.add_argument("--world-size", dest="sweep_world_size", default=None, metavar="LIST",
                        help="total GPUs, a comma list: d = N / (t x p) as Megatron derives it, "
                             "nodes = N / gpus per node unless --nodes is given")
    add_reserve_argument(parser)
    add_executor_arguments(parser)
    parser.set_defaults(handler=run)


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


def print_summary(frame, out: Path) -> None:
    """One line per configuration: status, GPUs, time, tokens/s, MFU, peak and headroom; then
    what deriving d from the GPUs did, and where the files are."""
    from simsp.units import GiB
    for row in frame.to_dict("records"):
        if row["status"] == "error":
            print(f"{row['index']:4d}  {row['variant']}: {row['error']}")
            continue
        verdict = "fits" if row.get("fits", not row["oom"]) else ("OOM " if row["oom"] else "tight")
        print(f"{row['index']:4d}  {verdict} {row['gpus']:5d} GPUs {row['iteration_time_s']:9.3f} s "
              f"{row['tokens_per_s']:11,.0f} tokens/s  MFU {row['mfu']:6.1%}  peak "
              f"{row['peak_bytes_max'] / GiB:6.1f} GiB  headroom {row['headroom_bytes'] / GiB:6.1f} "
              f"GiB  {row['variant']}")
    for note in dict.fromkeys(n for n in frame.get("note", []) if isinstance(n, str) and n):
        print(f"note: {note}")
    print(f"results: {out / 'results.csv'}, {out / 'results.jsonl'}, {out / 'report.md'}")


def run(args) -> int:
    """Expand the configurations, simulate them, write and print the results."""
    from simsp.explore.api import build_configs, sweep_configs  # pandas and Dask: only here
    from simsp.explore.folders import default_folder, exploration_digest, write_manifest
    from simsp.explore.guard import check_sweep
    from simsp.explore.runner import prepare_out
    check_executor_arguments(args)
    check_reserve(args.memory_reserve)
    lists = field_lists(args)
    if args.sweep_world_size is not None:
        lists["world_size"] = args.sweep_world_size
    configs = build_configs(args.source, lists)
    check_sweep(configs, args.force)  # run's work limits, before any folder is made
    digest = exploration_digest([[c.digest() for c in configs], args.memory_reserve])
    varies = [by_flag(key) for key, text in lists.items() if "," in str(text)]
    out = Path(args.out) if args.out else default_folder("sweep", args.source, varies, digest)
    out = prepare_out(out, (args.source,))
    write_manifest(out, " ".join(["simsp", *getattr(args, "argv", ["sweep"])]), digest)
    frame = sweep_configs(configs, out, args.workers, args.scheduler,
                          getattr(args, "quiet", False), force=args.force,
                          inputs=(args.source,), memory_reserve_gib=args.memory_reserve)
    print_summary(frame, out)
    print(frame.attrs["cache"])
    return 0


def by_flag(key: str) -> str:
    """A varied field's flag without its dashes (`tensor-model-parallel-size`), for folder names."""
    from simsp.explore.fields import by_key
    field = by_key().get(key)
    return (field.flag if field else f"--{key.replace('_', '-')}").lstrip("-")
