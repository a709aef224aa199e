"""The flags `simsp sweep` and `simsp search` share: one comma-list flag per scenario field,
the Dask executor's --out/--workers/--scheduler/--force, and the memory reserve."""

from simsp.errors import UserError
from simsp.explore.configs.fields import all_fields, switch_flags


def _dest(field) -> str:
    """argparse destination of a field's flag."""
    return f"sweep_{field.key}"


def _inverted_dest(field) -> str:
    """Destination of an inverted field's list: whether its switch is given, per item."""
    return f"sweep_not_{field.key}"


def _text(value) -> str:
    """A switch's value as a list item (`true`, `false`, `flash`)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def add_field_arguments(parser, skip: tuple = (), metavar: str = "LIST",
                        title: str = "scenario fields (each takes a comma-separated list; a "
                                     "switch alone, or a list of true/false)",
                        list_keys: tuple = ()) -> None:
    """Every flag of `run` for every scenario field, with `run`'s help (simsp.scenario.flags, one
    table): a value flag takes a comma list, the field's own switch stands alone or takes a
    true/false list (for an inverted switch, whether it is given), other switches stand alone.
    `metavar` names the value (LIST, or VALUE where one is taken), LIST for `list_keys`."""
    from simsp.scenario import flags
    group = parser.add_argument_group(title)
    switches = switch_flags()
    for field in all_fields():
        if field.key in skip:
            continue
        shown = "LIST" if field.key in list_keys else metavar
        if field.flag in flags.SCENARIO_FLAGS:
            group.add_argument(field.flag, dest=_dest(field), default=None, metavar=shown,
                               help=flags.flag_help(field.flag))
        for value, switch in switches.get(field.path, {}).items():
            names = (switch, *flags.ALIASES.get(switch, ()))
            if switch == field.flag:
                group.add_argument(*names, default=None, metavar=shown, nargs="?",
                                   const="true", help=flags.switch_help(switch),
                                   dest=_inverted_dest(field) if field.inverted else _dest(field))
            else:
                group.add_argument(*names, dest=_dest(field), action="store_const",
                                   const=_text(value), help=flags.switch_help(switch))


def field_lists(args, skip: tuple = ()) -> dict:
    """{field key: comma list text} of every field flag the user gave (an inverted switch's
    true/false list turned into the field's values)."""
    found = {}
    for field in all_fields():
        if field.key in skip:
            continue
        text = getattr(args, _dest(field), None)
        if field.inverted and getattr(args, _inverted_dest(field), None) is not None:
            text = _invert(field, getattr(args, _inverted_dest(field)))
        if text is not None:
            found[field.key] = text
    return found


def _invert(field, text: str) -> str:
    """`true,false` for `--disable-bias-linear` -> `false,true` for add_bias_linear."""
    flip = {"true": "false", "false": "true"}
    items = [item.strip().lower() for item in text.split(",")]
    for item in items:
        if item not in flip:
            raise UserError(field.flag, f"{item!r} is not true or false (whether the switch is "
                                        "given)")
    return ",".join(flip[item] for item in items)


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
    from simsp.explore.evaluation.executor import parse_scheduler
    from simsp.explore.evaluation.limits import check_workers
    check_workers(args.workers)
    if args.workers is not None and args.scheduler:
        raise UserError("--workers", "conflicts with --scheduler (the cluster has its workers)")
    if args.scheduler is not None:
        parse_scheduler(args.scheduler)


def add_reserve_argument(parser) -> None:
    """--memory-reserve GiB: what "fits" leaves free (simsp/memory_verdict.py)."""
    from simsp.explore.results.headroom import DEFAULT_MEMORY_RESERVE_GIB
    parser.add_argument("--memory-reserve", type=float, default=DEFAULT_MEMORY_RESERVE_GIB,
                        metavar="GiB", help="GPU memory kept free for what the ledger does not "
                        "hold, replacing each layout's itemised non-tensor memory (CUDA context, "
                        "cuBLAS workspace, NCCL buffers, fragmentation allowance; the default; "
                        "docs/non_tensor_memory.md); a row fits when its peak leaves it")


def check_reserve(gib: float | None, capacity_gib: float = 80.0) -> None:
    """The reserve, when given, must be a finite part of the GPU's memory."""
    import math
    if gib is not None and not (math.isfinite(gib) and 0 <= gib < capacity_gib):
        raise UserError("--memory-reserve", f"must be in [0, {capacity_gib:g}) GiB, got {gib}")
