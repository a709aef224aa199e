"""`simsp search --gpus N`: every layout of a model on N GPUs, pruned by closed forms, the rest
simulated on Dask (branch and bound on a time lower bound), ranked and explained."""

from pathlib import Path

from simsp.commands.sweep import (add_executor_arguments, add_field_arguments,
                                  check_executor_arguments, default_out, field_lists)
from simsp.bounds import BOUNDS
from simsp.config import SECTIONS
from simsp.errors import UserError
from simsp.explore.cache import ResultCache
from simsp.explore.configs import base_values, parse_list
from simsp.explore.explain import limits, why_lost
from simsp.explore.fields import by_key
from simsp.explore.objectives import OBJECTIVES
from simsp.units import GiB, format_seconds

# Fields the search sets itself: the layout, the node count (enough for N GPUs) and meta mode.
LAYOUT_KEYS = (*SECTIONS["parallel"].__dataclass_fields__, "nodes", "mode")


def add_parser(subparsers) -> None:
    """Register `simsp search` and its flags."""
    parser = subparsers.add_parser("search", help="find the fastest layout for N GPUs")
    parser.add_argument("scenario", nargs="?", help="scenario TOML (its model and cluster)")
    parser.add_argument("--gpus", type=int, required=True, metavar="N", help="GPUs to lay out")
    parser.add_argument("--global-batch-size", type=int, default=None, metavar="B",
                        help="samples per iteration (default: the scenario's)")
    parser.add_argument("--top", type=int, default=5, metavar="K", help="layouts to show (5)")
    parser.add_argument("--objective", choices=OBJECTIVES, default="time")
    parser.add_argument("--margin", type=float, default=0.10, metavar="FRACTION",
                        help="prune on memory only beyond capacity x (1 + margin) (0.10)")
    add_field_arguments(parser, skip=LAYOUT_KEYS, metavar="VALUE",
                        title="model, cluster and run fields (one value each)")
    add_executor_arguments(parser, "search-<N>gpus")
    parser.set_defaults(handler=run)


def _base(args) -> dict:
    """The scenario's fields with the single-valued model/cluster/run flags applied, in meta mode."""
    values = base_values(args.scenario)
    table = by_key()
    for key, text in field_lists(args, skip=LAYOUT_KEYS).items():
        items = parse_list(table[key], text)
        if len(items) != 1:
            raise UserError(table[key].flag, "search takes one value (sweep takes lists)")
        values[table[key].path] = items[0]
    values[("run", "mode")] = "meta"
    return values


MAX_GPUS = 32768  # BOUNDS' largest data-parallel job; checked before the divisor loops
MAX_TOP = 1000


def _check(args, batch) -> None:
    """Counts positive and bounded (before any enumeration), the margin finite and not negative."""
    for name, value, high in (("--gpus", args.gpus, MAX_GPUS), ("--top", args.top, MAX_TOP),
                              ("--global-batch-size", batch,
                               BOUNDS["parallel.global_batch_size"].high)):
        if value is None or value < 1:
            raise UserError(name, f"must be a positive integer, got {value}")
        if value > high:
            raise UserError(name, f"{value} is above the limit of {int(high)}")
    if not 0 <= args.margin <= 10:
        raise UserError("--margin", f"must be a fraction in [0, 10], got {args.margin}")


def summary_lines(result, args, batch: int) -> list[str]:
    """How many layouts there were, how many were pruned and why, how many simulated."""
    lines = [f"{args.gpus} GPUs, global batch {batch}, objective {args.objective}: "
             f"{result.layouts} layouts ({result.invalid} rejected by the config checks)",
             f"pruned {result.pruned_memory} by the memory closed form (weights + grads + "
             f"optimizer + K22 first-stage activations > capacity x {1 + args.margin:g})"]
    lines += [f"  e.g. {label}: {reason}" for label, reason in result.memory_examples]
    lines.append(f"pruned {result.pruned_bound} by the time lower bound "
                 "(L/p)(f+b)(m+(p-1)/v) >= the top-K's worst simulated")
    lines.append(f"simulated {len(result.rows)}")
    return lines


def ranking_lines(frame, top: int, objective: str) -> list[str]:
    """The top K with what limits each, then the best rejected with why they lost."""
    from simsp.report.whatif import ranked  # matplotlib: only when a search has run
    order = ranked(frame, objective)
    rows = [row.to_dict() for _, row in order.iterrows()]
    fits = [row for row in rows if row["status"] == "ok"]
    if not fits:
        return ["no simulated layout fits in memory"]
    lines = [f"top {min(top, len(fits))}:"]
    for place, row in enumerate(fits[:top], 1):
        lines.append(f"{place:2d}. {row['variant']:<34} {format_seconds(row['iteration_time_s']):>10}  "
                     f"MFU {row['mfu']:5.1%}  peak {row['peak_bytes_max'] / GiB:5.1f} GiB")
        lines.append(f"    limits: {limits(row)}")
    rejected = fits[top:top + 3] + [row for row in rows if row["status"] == "oom"][:3]
    if rejected:
        lines.append("best rejected:")
        lines += [f"    {row['variant']:<34} {why_lost(row, fits[0])}" for row in rejected]
    return lines


def run(args) -> int:
    """Search, print the pruning summary and the explained ranking, write the report."""
    from simsp.explore.executor import Executor, ExecutorLost  # Dask, pandas: only here
    from simsp.explore.runner import failure_message, prepare_out
    from simsp.explore.search import search
    from simsp.explore.table import results_frame, write_results
    from simsp.report.whatif import write_whatif_report
    check_executor_arguments(args)
    base = _base(args)
    batch = args.global_batch_size or base[("parallel", "global_batch_size")]
    _check(args, batch)
    out = Path(args.out) if args.out else default_out(args.scenario, f"search-{args.gpus}gpus")
    out = prepare_out(out, (args.scenario,))
    cache = ResultCache(out / "cache")
    with Executor(args.workers, args.scheduler, args.force) as executor:
        try:
            result = search(base, args.gpus, batch, executor, cache, args.top,
                            args.objective, args.margin, getattr(args, "quiet", False))
        except ExecutorLost as exc:
            raise UserError("dask", f"{exc}; the {cache.stats.simulated} layouts simulated so "
                                    f"far are cached in {out / 'cache'} (run it again to resume)"
                            ) from None
    frame = results_frame(result.rows)
    lines = summary_lines(result, args, batch)
    print("\n".join(lines))
    if result.rows:
        write_results(result.rows, frame, out)
        write_whatif_report(frame, out, args.objective, [line + "  " for line in lines] + [""])
        print("\n".join(ranking_lines(frame, args.top, args.objective)))
    print(cache.stats.line())
    print(f"results: {out}")
    failure = failure_message(executor, result.rows, out)
    if failure:
        raise UserError("dask", failure)
    return 0
