"""`simsp whatif BASE VARIANT...`: a baseline scenario and named variants (NAME=FLAGS, the flags
of `simsp run`, plus --world-size), or a sweep file with a variant marked `baseline = true`;
each variant simulated and compared with the baseline in whatif.md and one whatif.html."""

from pathlib import Path

from simsp.errors import UserError
from simsp.explore.arguments import (add_executor_arguments, add_reserve_argument,
                                    check_executor_arguments, check_reserve)
from simsp.report.whatif.comparison import OBJECTIVES


def add_parser(subparsers) -> None:
    """Register `simsp whatif` and its flags."""
    parser = subparsers.add_parser(
        "whatif", help="compare named variants with a baseline (HTML page + markdown)",
        description="simsp whatif scenarios/paper-175b.toml 'IB 2x=--ib-bandwidth-GBps 50' "
                    "'2x GPUs=--world-size 128' 'micro-batch 2=--micro-batch-size 2'")
    parser.add_argument("base", metavar="BASE", help="baseline scenario TOML, or a sweep TOML "
                        "whose [[variant]] marked baseline = true (else the first) is the baseline")
    parser.add_argument("variants", nargs="*", metavar="VARIANT",
                        help="NAME=FLAGS, e.g. 'IB 2x=--ib-bandwidth-GBps 50' (flags of simsp run, "
                             "and --world-size N: d = N/(t x p) as Megatron derives it)")
    parser.add_argument("--baseline-flags", metavar="FLAGS", default=None,
                        help="flags of simsp run applied to the baseline, and so to every variant "
                             "built on it, e.g. '--use-megatron-fsdp --micro-batch-size 2'")
    parser.add_argument("--objective", choices=tuple(OBJECTIVES), default="tokens-per-s",
                        help="what ranks the variants (default tokens-per-s; cost is GPU-hours "
                             "per token)")
    add_reserve_argument(parser)
    add_executor_arguments(parser, "whatif")
    parser.set_defaults(handler=run)


def _variants(args) -> list[tuple]:
    """The baseline first, then the variants, from the command line or a sweep file."""
    from simsp.explore.configs.sweep_file import is_sweep_file
    from simsp.explore.whatif.variants import variants_from_specs, variants_from_sweep_file
    if is_sweep_file(args.base):
        if args.variants:
            raise UserError("VARIANT", "a sweep file names its own variants; give none")
        if args.baseline_flags is not None:
            raise UserError("--baseline-flags", "a sweep file's baseline variant takes its own "
                                                "keys; give the flags to a scenario file")
        return variants_from_sweep_file(args.base)
    if not args.variants:
        raise UserError("VARIANT", "give at least one NAME=FLAGS variant to compare")
    return variants_from_specs(args.base, args.variants, args.baseline_flags)


def run(args) -> int:
    """Simulate the baseline and the variants, print the conclusions, write the page."""
    from simsp.api import sweep_configs
    from simsp.explore.results.folders import default_folder, exploration_digest, write_manifest
    from simsp.explore.evaluation.limits import check_sweep
    from simsp.explore.evaluation.runner import RESULT_FILES, WHATIF_FILES, prepare_out
    from simsp.explore.whatif.variants import add_derived, rank_rows, whatif_configs
    from simsp.report.whatif.comparison import baseline_line, conclusion
    from simsp.report.whatif.page import write_whatif_page
    check_executor_arguments(args)
    check_reserve(args.memory_reserve)
    configs = whatif_configs(_variants(args))
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise UserError("VARIANT", "two variants share a name")
    check_sweep(configs, args.force)  # run's work limits, before any folder is made
    digest = exploration_digest([[c.digest() for c in configs], names, args.memory_reserve])
    out = Path(args.out) if args.out else default_folder("whatif", args.base, [], digest)
    out = prepare_out(out, (args.base,), RESULT_FILES + WHATIF_FILES)
    write_manifest(out, " ".join(["simsp", *getattr(args, "argv", ["whatif"])]), digest)
    frame = sweep_configs(configs, out, args.workers, args.scheduler, getattr(args, "quiet", False),
                          report=False, force=args.force, inputs=(args.base,),
                          memory_reserve_gib=args.memory_reserve)
    rows = [add_derived(row) for row in frame.to_dict("records")]
    if rows[0]["status"] == "error":
        raise UserError("baseline", rows[0]["error"])
    print(baseline_line(rows[0]))
    for row in rows[1:]:
        print(conclusion(row, rows[0]))
    write_whatif_page(rows, rank_rows(rows, args.objective), args.objective, out)
    print(f"page: {out / 'whatif.html'} (and whatif.md)")
    return 0
