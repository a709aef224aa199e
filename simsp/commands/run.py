"""`simsp run`: one training iteration of a scenario — time, MFU/HFU, bubble, memory, reports."""

import shlex
from pathlib import Path

from simsp.scenario.work import check_work
from simsp.engine.trace import TRACE_DETAILS
from simsp.scenario.flags import add_scenario_arguments, nonempty, override_tokens
from simsp.scenario.outside import scenario_from_args
from simsp.io_out import check_not_inputs, check_target
from simsp.jsonout import dumps
from simsp.errors import UserError
from simsp.hardware.constants import GPUS
from simsp.units import GiB
from simsp.explore.arguments import add_reserve_argument, check_reserve
from simsp.memory_verdict import reserve_bytes
from simsp.metrics.collect import collect
from simsp.metrics.layout import check_side_runs
from simsp.metrics.memory import memory_report
from simsp.outdir import default_out_dir, prepare_out_dir
from simsp.progress import step_callback
from simsp.explore.whatif.oom_advice import explain_oom
from simsp.report.run import paint_stage_figures, summary_text, write_reports
from simsp.report.run.figures.drawing import warm_up
from simsp.report.run.memory_snapshot import snapshot_name, write_memory_snapshots
from simsp.report.run.painter import start_painter
from simsp.report.run.summary_md import run_label
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
from simsp.training.driver.work_verdict import verdict_work


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("run", help="simulate one training iteration (the main job)")
    add_scenario_arguments(parser)
    parser.add_argument("--json", action="store_true",
                        help="print the metrics as JSON on stdout; writes no files unless --out")
    parser.add_argument("--out", metavar="DIR", type=nonempty, default=None,
                        help="report folder (default: reports/<scenario>[_<overrides>], e.g. "
                             "reports/paper-175b_t4_p16)")
    parser.add_argument("--no-shortcuts", action="store_true",
                        help="meta mode: simulate every rank and every ring step (slow)")
    parser.add_argument("--trace", choices=TRACE_DETAILS, default="steps",
                        help="trace.json detail: none (no file), steps (schedule, pipeline "
                             "transfers, DP communication, memory; default) or full (also "
                             "compute and TP communication)")
    add_reserve_argument(parser)
    parser.add_argument("--caching-allocator", action="store_true",
                        help="replay every stage's rank through the model of PyTorch's caching "
                             "allocator: reserved and allocated peaks, fragmentation at the peak "
                             "(docs/allocator.md; several times the simulation's CPU time on "
                             "paper-scale layouts)")
    parser.add_argument("--memory-snapshot", metavar="RANKS", type=nonempty, default=None,
                        help="write memory_snapshot_rank<N>.pickle for each rank of this comma "
                             "list (e.g. 0,8) into the report folder: its ledger through "
                             "PyTorch's caching allocator, as torch.cuda.memory._dump_snapshot "
                             "writes it, for PyTorch's memory visualizer (docs/allocator.md)")
    parser.set_defaults(handler=run)


REPORT_FILES = ("summary.md", "metrics.json", "trace.json", "report.html", "memory.png")


def snapshot_ranks(text: str | None, world_size: int) -> list[int]:
    """--memory-snapshot's ranks: distinct integers in [0, world size), in the order given."""
    if text is None:
        return []
    ranks = []
    for item in text.split(","):
        if not item.strip().isdigit() or int(item) >= world_size:
            raise UserError("--memory-snapshot", f"expected a comma list of ranks in "
                                                 f"[0, {world_size}), got {text!r}")
        ranks += [] if int(item) in ranks else [int(item)]
    return ranks


def report_folder(args, sc, snapshots: list[int] = ()) -> Path | None:
    """The folder reports go to, created and proven writable, with no link, folder or device
    where a report file goes; None for --json without --out."""
    if args.out is not None:
        out = prepare_out_dir(Path(args.out))
    elif args.json:
        if snapshots:
            raise UserError("--memory-snapshot", "needs a report folder: give --out with --json")
        return None
    else:
        out = prepare_out_dir(default_out_dir(sc.run.name, override_tokens(args)))
    names = REPORT_FILES + tuple(snapshot_name(rank) for rank in snapshots)
    for name in names:
        check_target(out / name)
    check_not_inputs([out / name for name in names], [args.scenario] if args.scenario else [])
    return out


def reported_command(argv: list[str]) -> str:
    """The command that made a report, less where it went and how loudly (--out, --quiet):
    the same configuration gives the same report bytes wherever it is written."""
    kept, skip = [], False
    for arg in argv:
        if skip or arg == "--quiet" or arg.startswith("--out="):
            skip = False
            continue
        skip = arg == "--out"
        kept += [] if skip else [arg]
    return shlex.join(["simsp", *kept])


def simulate(args, sc, shortcuts):
    """The iteration, with a progress bar on a terminal."""
    progress = step_callback(getattr(args, "quiet", False))
    result = simulate_iteration(sc, shortcuts, on_step=progress, trace=args.trace,
                                keep_until_exit=args.process_ends)
    if progress is not None:
        progress.close()
    return result


def run(args) -> int:
    """Simulate, measure, report. Where reports are written, the painter process (started
    first, report/run/painter.py) loads matplotlib during the simulation and draws the figures."""
    sc = scenario_from_args(args)
    check_reserve(args.memory_reserve, GPUS[sc.cluster.gpu].memory_bytes / GiB)
    snapshots = snapshot_ranks(args.memory_snapshot, sc.parallel.world_size)
    check_side_runs(sc)
    # first at the cheapest the shortcuts could make it: their check walks every route of every
    # group (CP 2048 took minutes there before refusing), so a run far too big stops before it
    check_work(sc, shortcuts=not args.no_shortcuts, force=args.force)
    shortcuts = Shortcuts() if args.no_shortcuts else Shortcuts.for_scale(sc)
    check_work(sc, shortcuts=shortcuts.representative, force=args.force,
               meta=verdict_work(sc, shortcuts, args.trace))
    out_dir = report_folder(args, sc, snapshots)
    with start_painter(wanted=out_dir is not None, warm_up=warm_up) as painter:
        result = simulate(args, sc, shortcuts)
        if out_dir is not None:
            paint_stage_figures(result, run_label(sc), painter, args.trace)
        metrics = collect(result, shortcuts)
        metrics["command"] = reported_command(args.argv)
        memory = memory_report(result, metrics, reserve_bytes(args.memory_reserve),
                               args.caching_allocator)
        metrics["oom_explanation"] = explain_oom(result, memory["stages"])
        metrics["memory"] = memory
        written = (write_reports(result, metrics, out_dir, trace=args.trace, painter=painter)
                   + write_memory_snapshots(result, snapshots, out_dir)
                   if out_dir is not None else [])
    if args.json:
        print(dumps(metrics, indent=2))
    else:
        print(summary_text(metrics))
        print("reports: " + ", ".join(str(path) for path in written))
    return 0
