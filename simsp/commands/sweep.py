"""`simsp sweep`: the cartesian product of comma-listed scenario flags (and/or a sweep file's
variants), simulated in parallel on Dask, written as results.csv/.jsonl and a what-if report."""

from pathlib import Path

from simsp.explore.arguments import (add_executor_arguments, add_field_arguments,
                                    add_reserve_argument, check_executor_arguments,
                                    check_reserve, field_lists)


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


def print_summary(frame, out: Path) -> None:
    """After the rows (printed as they finished): what deriving d from the GPUs did, and where
    the files are."""
    for note in dict.fromkeys(n for n in frame.get("note", []) if isinstance(n, str) and n):
        print(f"note: {note}")
    print(f"results: {out / 'results.csv'}, {out / 'results.jsonl'}, {out / 'report.md'}")


def run(args) -> int:
    """Expand the configurations, simulate them, write and print the results."""
    from simsp.api import build_configs, sweep_configs  # pandas and Dask: only here
    from simsp.explore.results.folders import default_folder, exploration_digest, write_manifest
    from simsp.explore.evaluation.limits import check_sweep
    from simsp.explore.evaluation.runner import prepare_out
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
                          inputs=(args.source,), memory_reserve_gib=args.memory_reserve,
                          stream=True)
    print_summary(frame, out)
    print(frame.attrs["cache"])
    return 0


def by_flag(key: str) -> str:
    """A varied field's flag without its dashes (`tensor-model-parallel-size`), for folder names."""
    from simsp.explore.configs.fields import by_key
    field = by_key().get(key)
    return (field.flag if field else f"--{key.replace('_', '-')}").lstrip("-")
