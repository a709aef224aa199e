"""`simsp search --gpus N`: every layout of a model on N GPUs, pruned by closed forms, the rest
simulated on Dask (branch and bound on a time lower bound), ranked and explained."""

from pathlib import Path

from simsp.scenario.limits import BOUNDS
from simsp.scenario.config import Parallel
from simsp.errors import UserError
from simsp.explore.arguments import (add_executor_arguments, add_field_arguments,
                                    add_reserve_argument, check_executor_arguments, check_reserve,
                                    field_lists)
from simsp.explore.evaluation.cache import ResultCache
from simsp.explore.configs.grid import parse_list
from simsp.explore.search.explain import limits, why_lost
from simsp.explore.configs.fields import by_key
from simsp.explore.results.headroom import reserve_bytes
from simsp.explore.search.layouts import RESTRICTABLE, held_fields, search_start
from simsp.explore.search.objectives import OBJECTIVES
from simsp.hardware.constants import GPUS
from simsp.units import GiB, format_seconds

# Fields the search sets itself: the layout (a comma list restricts the layouts to those values),
# the node count (enough for N GPUs unless given) and meta mode.
CP_KEY = "context_parallel_size"  # one value held, or a list the search varies (1,2,4)


def add_parser(subparsers) -> None:
    """Register `simsp search` and its flags."""
    parser = subparsers.add_parser("search", help="find the fastest layout for N GPUs")
    parser.add_argument("scenario", nargs="?", help="scenario TOML (its model and cluster)")
    parser.add_argument("--gpus", "--world-size", dest="gpus", type=int, required=True,
                        metavar="N", help="GPUs to lay out (Megatron's --world-size)")
    parser.add_argument("--top", type=int, default=5, metavar="K", help="layouts to show (5)")
    parser.add_argument("--objective", choices=OBJECTIVES, default="time",
                        help="what ranks the layouts: time (iteration seconds, lowest first), "
                             "tokens-per-s or mfu (highest first), memory (the busiest GPU's "
                             "peak, lowest first); default: time")
    add_reserve_argument(parser)
    parser.add_argument("--exhaustive", action="store_true",
                        help="simulate every layout (no memory screen, no time bound)")
    parser.add_argument("--keep-scenario-parallel", action="store_true",
                        help="keep the scenario's own [parallel] fields the search does not vary "
                        f"({', '.join(held_fields())}; default: Megatron's defaults)")
    add_field_arguments(parser, metavar="VALUE", list_keys=RESTRICTABLE,
                        title="scenario fields (one value each; the layout's own fields, "
                              f"{', '.join(_flag(key) for key in RESTRICTABLE)}, take a comma "
                              "list that restricts the layouts searched; another [parallel] "
                              "field's comma list is varied with every layout)")
    add_executor_arguments(parser, "search-<N>gpus")
    parser.set_defaults(handler=run)


def _flag(key: str) -> str:
    return by_key()[key].flag


def _given(args) -> tuple[dict, dict]:
    """({(section, key): value} of the one-valued field flags given, {layout key: allowed
    values} of the layout fields given); search runs in meta mode only."""
    table, values, allowed = by_key(), {}, {}
    for key, text in field_lists(args).items():
        items = parse_list(table[key], text)
        if key == CP_KEY and any(item < 1 for item in items):
            raise UserError(table[key].flag, f"must be a positive integer, got {text}")
        if key == CP_KEY and len(set(items)) > 1:  # the search varies cp over these
            values[table[key].path] = tuple(sorted(set(items)))
            continue
        if key in RESTRICTABLE:
            allowed[key] = items
            continue
        if key in held_fields() and len(items) > 1:  # a held field the search varies
            values[table[key].path] = tuple(dict.fromkeys(items))
            continue
        if len(items) != 1:
            raise UserError(table[key].flag, "search takes one value (sweep takes lists; "
                                             "a [parallel] field's list is varied)")
        values[table[key].path] = items[0]
    if values.get(("run", "mode"), "meta") != "meta":
        raise UserError("--mode", "search simulates in meta mode only")
    return values, allowed


def _base(args) -> tuple[dict, dict, dict]:
    """(the layouts' starting values in meta mode, the held [parallel] fields fixed by the user,
    the allowed values of the layout fields the user restricted): search_start, as simsp.search."""
    given, allowed = _given(args)
    base, fixed = search_start(args.scenario, given, args.keep_scenario_parallel)
    return base, fixed, allowed


MAX_GPUS = 32768  # BOUNDS' largest data-parallel job; checked before the divisor loops
MAX_TOP = 1000


def _given_nodes(args) -> int | None:
    """--nodes as given (default: enough nodes for the GPUs)."""
    text = field_lists(args).get("nodes")
    return None if text is None else parse_list(by_key()["nodes"], text)[0]


def _check(args, batch, base) -> None:
    """Counts positive and bounded (before any enumeration), the reserve a part of the GPU's
    memory."""
    for name, value, high in (("--gpus", args.gpus, MAX_GPUS), ("--top", args.top, MAX_TOP),
                              ("--global-batch-size", batch,
                               BOUNDS["parallel.global_batch_size"].high)):
        if value is None or value < 1:
            raise UserError(name, f"must be a positive integer, got {value}")
        if value > high:
            raise UserError(name, f"{value} is above the limit of {int(high)}")
    check_reserve(args.memory_reserve, GPUS[base[("cluster", "gpu")]].memory_bytes / GiB)


def _fixed_line(fixed: dict) -> str:
    """Which held [parallel] fields every layout takes from the user, and where they apply."""
    changed = {key: value for key, value in fixed.items() if getattr(Parallel(), key) != value}
    varied = {key: value for key, value in changed.items() if isinstance(value, tuple)}
    if varied:  # lists (a cp list, ...): varied like t, p and d, not held
        rest = _fixed_line({key: value for key, value in fixed.items() if key not in varied})
        return "; ".join([f"{key} varied over {', '.join(map(str, values))}"
                          for key, values in varied.items()] + [rest])
    if not changed:
        return "every [parallel] field the search does not vary is at Megatron's default"
    shown = ", ".join(f"{key} = {value}" for key, value in changed.items())
    return (f"fixed for every layout where Megatron allows it: {shown} (recompute method and "
            "layers: full recompute only; p2p overlap: interleaved only; parameter-gather "
            "overlap: distributed optimizer only"
            + ("; FSDP: layouts without the distributed optimizer" if changed.keys() & {
                "use_megatron_fsdp", "use_torch_fsdp2"} else "") + ")")


def summary_lines(result, args, batch: int, fixed: dict) -> list[str]:
    """How many layouts there were, how many were screened out and why, how many simulated."""
    reserve = ("each layout's non-tensor memory" if args.memory_reserve is None
               else f"{args.memory_reserve:g} GiB")
    lines = [f"{args.gpus} GPUs, global batch {batch}, objective {args.objective}, memory "
             f"reserve {reserve}: {result.layouts} layouts, "
             f"{result.invalid} rejected by the config checks", _fixed_line(fixed)]
    for reason, count in sorted(result.rejected.items(), key=lambda item: -item[1])[:3]:
        lines.append(f"  {count} x {reason}")
    if result.layouts == 0:
        lines.append(f"why none: {no_layout_reason(args.gpus, batch, result)}")
    elif result.invalid == result.layouts:
        lines += rejected_lines(result.rejected)
    if result.exhaustive:
        lines.append(f"exhaustive: simulated all {len(result.rows)} valid layouts")
        return lines + _violation_lines(result)
    lines.append(f"screened out {result.pruned_memory} whose memory lower bound (stage 0's "
                 "weights, gradients, optimizer state and the activations its schedule holds at "
                 "once) exceeds capacity less the reserve")
    lines += [f"  e.g. {label}: {reason}" for label, reason in result.memory_examples]
    bound = ("memory lower bound" if args.objective == "memory" else
             "time lower bound ((m·v + p − 1)·(chunk forward + backward); a split-backward "
             "schedule's own steps at the chunk's F, B, W)"
             + (" as an MFU ceiling" if args.objective == "mfu" else ""))
    lines.append(f"screened out {result.pruned_bound} whose {bound} cannot beat the top K")
    lines.append(f"simulated {len(result.rows)}")
    if result.layouts > result.invalid and not result.rows:
        lines.append(f"why none: all {result.pruned_memory} valid layouts need more memory than "
                     "capacity less the reserve (lower the --memory-reserve, add GPUs, or "
                     "restrict fewer layout fields)")
    return lines + _violation_lines(result)


def rejected_lines(rejected: dict) -> list[str]:
    """`why none:` then one line per field the config checks rejected layouts by, with counts
    and the commonest message (every layout was rejected)."""
    by_field = {}
    for reason, count in sorted(rejected.items(), key=lambda item: (-item[1], item[0])):
        name = reason.removeprefix("error: ").split(":")[0]
        total, example = by_field.get(name, (0, reason))
        by_field[name] = (total + count, example)
    lines = ["why none: the config checks rejected every layout:"]
    return lines + [f"  {total} x {name} (e.g. {example})"
                    for name, (total, example) in by_field.items()]


def _violation_lines(result) -> list[str]:
    """Bounds a simulation beat: the screening was heuristic there, by this much."""
    if not result.violations:
        return ["every simulated layout checked: both bounds held"]
    worst = max(result.violations, key=lambda item: item[2])
    return [f"warning: a bound exceeded its simulation for {len(result.violations)} layouts "
            f"(worst: {worst[1]} of {worst[0]} by {worst[2] - 1:.1%}); screening was "
            "heuristic there: run with --exhaustive"]


def no_layout_reason(gpus: int, batch: int, result) -> str:
    """Why N GPUs give no layout at all (Megatron needs t·p·d = N)."""
    return (f"Megatron needs t·p·d = {gpus} with t at most the GPUs per node, p dividing the "
            f"layers and d dividing the global batch {batch}; no (t, p, d) satisfies all three "
            "(try a GPU count with more divisors, or another --global-batch-size)")


def ranking_lines(frame, top: int, objective: str) -> list[str]:
    """The top K with what limits each, then the best rejected with why they lost."""
    from simsp.report.sweep.report_md import ranked  # matplotlib: only when a search has run
    order = ranked(frame, objective)
    rows = [row.to_dict() for _, row in order.iterrows()]
    fits = [row for row in rows if row.get("fits", row["status"] == "ok") is True]
    if not fits:
        return ["why none: no simulated layout fits in memory (less the reserve):"] + [
            f"  {count} x {status}" for status, count in _misfit_counts(rows).items()]
    lines = [f"top {min(top, len(fits))}:"]
    for place, row in enumerate(fits[:top], 1):
        lines.append(f"{place:2d}. {row['variant']}")
        lines.append(f"    {format_seconds(row['iteration_time_s'])}, {row['tokens_per_s']:,.0f} "
                     f"tokens/s, MFU {row['mfu']:.1%}, peak {row['peak_bytes_max'] / GiB:.1f} "
                     f"GiB, headroom {row['headroom_bytes'] / GiB:.1f} GiB")
        lines.append(f"    limits: {limits(row)}")
    misfits = [row for row in rows if row["status"] != "error" and row.get("fits") is not True]
    rejected = fits[top:top + 3] + misfits[:3]
    if rejected:
        lines.append("best rejected:")
        for row in rejected:
            lines += [f"    {row['variant']}", f"      {why_lost(row, fits[0])}"]
    return lines


def _misfit_counts(rows: list) -> dict:
    """{why a simulated layout does not fit: layouts}, commonest first."""
    counts = {}
    for row in rows:
        status = {"oom": "out of memory", "error": "simulation error"}.get(
            row["status"], "fit the GPU but not its capacity less the reserve")
        counts[status] = counts.get(status, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def write_outputs(result, out: Path, args, batch: int, fixed: dict) -> tuple[list, list]:
    """`results.csv`, `results.jsonl` and the report (`report.md` and its figures) of a search
    into `out`, as `simsp search` and `simsp.search(out=...)` write them; returns (the summary
    lines, the ranking lines). `args` holds gpus, top, objective and memory_reserve."""
    from simsp.explore.results.table import results_frame, write_results
    from simsp.report.sweep.report_md import write_whatif_report
    frame = results_frame(result.rows)
    lines, ranking = summary_lines(result, args, batch, fixed), []
    if result.rows:
        write_results(result.rows, frame, out)
        ranking = ranking_lines(frame, args.top, args.objective)
        write_whatif_report(frame, out, args.objective, [line + "  " for line in lines + ranking]
                            + [""], title="Search report")
    return lines, ranking


def run(args) -> int:
    """Search, print the screening summary and the explained ranking, write the report."""
    from simsp.explore.evaluation.executor import Executor, ExecutorLost  # Dask, pandas: only here
    from simsp.explore.results.folders import default_folder, exploration_digest, write_manifest
    from simsp.explore.evaluation.runner import failure_message, prepare_out
    from simsp.explore.search.branch_and_bound import search
    check_executor_arguments(args)
    base, fixed, allowed = _base(args)
    batch = base[("parallel", "global_batch_size")]
    _check(args, batch, base)
    digest = exploration_digest([sorted(base.items(), key=str), args.gpus, batch, fixed,
                                 args.objective, args.memory_reserve, args.exhaustive, args.top]
                                + ([sorted(allowed.items())] if allowed else []))
    out = Path(args.out) if args.out else default_folder(f"search-{args.gpus}gpus",
                                                         args.scenario, [], digest)
    out = prepare_out(out, (args.scenario,))
    write_manifest(out, " ".join(["simsp", *getattr(args, "argv", ["search"])]), digest)
    cache = ResultCache(out / "cache")
    with Executor(args.workers, args.scheduler, args.force) as executor:
        try:
            result = search(base, args.gpus, batch, executor, cache, args.top, args.objective,
                            reserve_bytes(args.memory_reserve), getattr(args, "quiet", False),
                            fixed, args.exhaustive, args.scenario, allowed,
                            _given_nodes(args), stream=True, force=args.force)
        except ExecutorLost as exc:
            raise UserError("dask", f"{exc}; the {cache.stats.simulated} layouts simulated so "
                                    f"far are cached in {out / 'cache'} (run it again to resume)"
                            ) from None
    lines, ranking = write_outputs(result, out, args, batch, fixed)
    print("\n".join(lines + ranking))
    print(cache.stats.line())
    print(f"results: {out}")
    failure = failure_message(executor, result.rows, out)
    if failure:
        raise UserError("dask", failure)
    return 0
