"""`simsp memory diff`: a real PyTorch memory snapshot against simsp's for the same rank
(docs/allocator.md#comparing-a-real-snapshot-simsp-memory-diff)."""

from pathlib import Path

from simsp.engine.allocator.snapshot_diff import memory_diff
from simsp.engine.allocator.snapshot_profile import profile_of
from simsp.engine.allocator.snapshot_read import MAX_SNAPSHOT_BYTES, read_snapshot
from simsp.errors import UserError, one_line
from simsp.io_out import check_not_inputs, check_target
from simsp.progress import add_quiet_flag
from simsp.outdir import default_out_dir, prepare_out_dir
from simsp.report.memory_diff import PAGE_NAME, diff_markdown, write_diff_page
from simsp.report.run.memory_snapshot import rank_snapshot
from simsp.scenario.flags import add_scenario_arguments, nonempty, override_tokens
from simsp.scenario.outside import scenario_from_args
from simsp.scenario.work import check_work
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
from simsp.training.driver.work_verdict import verdict_work
from simsp.units import format_bytes


def add_parser(subparsers) -> None:
    """The `memory` command group and its `diff` subcommand."""
    parser = subparsers.add_parser("memory", help="compare a PyTorch memory snapshot with "
                                                  "simsp's (memory diff)")
    actions = parser.add_subparsers(dest="memory_command", required=True, metavar="diff",
                                    parser_class=type(parser))
    diff = actions.add_parser(
        "diff", help="a real memory snapshot against simsp's for one rank: per category, per "
                     "layer, allocated and reserved, the unexplained allocations")
    diff.add_argument("snapshot", type=nonempty, metavar="SNAPSHOT.pickle",
                      help="a file torch.cuda.memory._dump_snapshot wrote (read as plain data "
                           f"only, at most {format_bytes(MAX_SNAPSHOT_BYTES)})")
    add_scenario_arguments(diff)
    diff.add_argument("--rank", type=int, required=True, metavar="N",
                      help="the rank the snapshot was taken on (simsp simulates it)")
    diff.add_argument("--out", metavar="DIR", type=nonempty, default=None,
                      help="folder for memory_diff.html (default: "
                           "reports/memory-diff-<scenario>-rank<N>[_<overrides>])")
    add_quiet_flag(diff)
    diff.set_defaults(handler=run)


def diff_folder(args, sc) -> Path:
    """The folder memory_diff.html goes to, created and proven writable."""
    name = f"memory-diff-{sc.run.name}-rank{args.rank}"
    out = prepare_out_dir(Path(args.out) if args.out is not None
                          else default_out_dir(name, override_tokens(args)))
    check_target(out / PAGE_NAME)
    check_not_inputs([out / PAGE_NAME], [args.snapshot, args.scenario])
    return out


def simsp_snapshot(args, sc) -> dict:
    """simsp's snapshot of the rank: the iteration simulated as `run` does, its ledger through
    the caching allocator."""
    if not 0 <= args.rank < sc.parallel.world_size:
        raise UserError("--rank", f"{args.rank} is not a rank of the layout's "
                                  f"{sc.parallel.world_size} GPUs")
    check_work(sc, shortcuts=True, force=args.force)
    shortcuts = Shortcuts.for_scale(sc)
    check_work(sc, shortcuts=shortcuts.representative, force=args.force,
               meta=verdict_work(sc, shortcuts))
    run_ = simulate_iteration(sc, shortcuts, trace="none", keep_until_exit=args.process_ends)
    return rank_snapshot(run_, args.rank)


def run(args) -> int:
    """Read the snapshot (refused in one line if it is not plain snapshot data), simulate the
    rank, compare, print and write memory_diff.html."""
    real = read_snapshot(args.snapshot)
    sc = scenario_from_args(args)
    out = diff_folder(args, sc)
    diff = memory_diff(profile_of(real, str(args.snapshot)),
                       profile_of(simsp_snapshot(args, sc), "simsp"))
    title = f"memory diff: {Path(args.snapshot).name} against simsp's rank {args.rank} of " \
            f"{sc.run.name}"
    page = write_diff_page(diff, title, out)
    print(one_line(title) + "\n")
    print(diff_markdown(diff))
    print(f"report: {page}")
    return 0
