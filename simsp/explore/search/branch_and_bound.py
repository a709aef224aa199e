"""`simsp search`: every layout for N GPUs, screened by proven bounds, the survivors simulated
in order of their objective's bound until no unsimulated layout can enter the top K, then ranked.

Branch and bound: a layout whose bound is worse than the K-th best simulated objective provably
cannot enter the top K (simsp.explore.search.bounds), so it is counted and never simulated. Every
simulated layout re-checks its bounds against its simulation; a bound that was not one is
reported (the ranking is then only as sound as that check). `exhaustive` simulates every layout.
"""

from dataclasses import dataclass, field
import math

from simsp.analytic import model_flops
from simsp.batch_work import TOTAL_TIME_LIMIT_S
from simsp.explore.evaluation.cache import ResultCache
from simsp.errors import UserError
from simsp.explore.configs.grid import Config
from simsp.explore.results.headroom import add_headroom, row_reserve
from simsp.explore.search.layouts import Layouts, enumerate_layouts
from simsp.explore.search.objectives import OBJECTIVES
from simsp.explore.search.bounds import (memory_lower_bound, memory_verdict, scenario_of,
                                 time_lower_bound)
from simsp.explore.evaluation.runner import evaluate_all, progress_bar
from simsp.explore.evaluation.stream import RowStream
from simsp.explore.results.table import table_row
from simsp.hardware.constants import GPUS
from simsp.memory_verdict import chosen_reserve
from simsp.progress import track
from simsp.training.non_tensor_memory import non_tensor_bytes


BATCH = 8  # layouts simulated per branch-and-bound round, fixed so results never depend on workers


@dataclass
class SearchResult:
    """What the search found: simulated rows, and how many layouts it never simulated, and why."""

    rows: list = field(default_factory=list)
    layouts: int = 0
    rejected: dict = field(default_factory=dict)  # `error:` text -> layouts the checks rejected
    pruned_memory: int = 0
    pruned_bound: int = 0
    memory_examples: list = field(default_factory=list)  # a few (label, reason)
    violations: list = field(default_factory=list)  # (label, which bound, bound / simulated)
    exhaustive: bool = False

    @property
    def invalid(self) -> int:
        return sum(self.rejected.values())


def objective_bound(sc, objective: str) -> float:
    """A bound of the objective no simulation of `sc` can beat, oriented smaller-is-better.
    Tokens/s is B·s/T with B and s fixed: ranked by T; MFU is F(t)/(T·N·peak), F counting the
    vocabulary as padded for t (analytic.model_flops), so it is bounded through T's bound."""
    if objective == "memory":
        return memory_lower_bound(sc)
    bound = time_lower_bound(sc)
    if objective == "mfu":
        if bound <= 0:  # no time bound (bounds.py): any MFU
            return -math.inf
        peak = GPUS[sc.cluster.gpu].peak_flops * sc.parallel.world_size
        return -model_flops(sc.model, sc.parallel) / (bound * peak)
    return bound


def objective_score(row: dict, objective: str, reserve: float | None) -> float | None:
    """Smaller-is-better value comparable with objective_bound; None unless the layout ran and
    fits in the usable memory (capacity less the reserve: `reserve` bytes, None: the row's
    itemised one)."""
    usable_bytes = row.get("capacity_bytes", 0) - row_reserve(row, reserve)
    if row.get("status") != "ok" or row["peak_bytes_max"] > usable_bytes:
        return None
    if objective == "memory":
        return row["peak_bytes_max"]
    return -row["mfu"] if objective == "mfu" else row["iteration_time_s"]


def screen(configs: list[Config], reserve: float | None, result: SearchResult, objective: str,
           exhaustive: bool, quiet: bool = True) -> list:
    """[(bound, index, config)] of layouts the memory bound does not rule out, best bound first
    (unless `quiet`, a bar on stderr counts the layouts bounded against their total)."""
    survivors = []
    for i, config in track(list(enumerate(configs)), "simsp search: bounds", "layout", quiet):
        sc = scenario_of(config)
        verdict = None if exhaustive else memory_verdict(
            sc, chosen_reserve(reserve, non_tensor_bytes(sc)))
        if verdict is None:
            survivors.append((objective_bound(sc, objective), i, config))
            continue
        result.pruned_memory += 1
        if len(result.memory_examples) < 3:
            result.memory_examples.append((config.name, verdict))
    return sorted(survivors, key=lambda item: (item[0], item[1]))


def _kth_best(scores: list, top: int) -> float:
    """The top-K's worst score so far (infinity until K layouts fit)."""
    done = sorted(s for s in scores if s is not None)
    return done[top - 1] if len(done) >= top else float("inf")


def _open(survivors: list, position: int, threshold: float) -> int:
    """How many unsimulated survivors could still enter the top K (bound not worse)."""
    return sum(1 for bound, _, _ in survivors[position:] if bound <= threshold)


def branch_and_bound(survivors: list, executor, cache: ResultCache, top: int, batch: int,
                     objective: str, reserve: float | None, bar, exhaustive: bool,
                     stream: bool = False, force: bool = False) -> tuple[dict, int]:
    """Simulate survivors by increasing bound, a batch at a time; ({index: row}, never simulated).
    A row scores only if it fits (`reserve` bytes override, None: its itemised reserve).
    The progress total is what has run plus what could still enter the top K; with `stream`,
    each simulated layout's line is printed as it is ready, in bound order. The
    batches' estimated CPU seconds add up to at most the batch limit (simsp/batch_work.py) unless
    `force`: beyond it one `error: work:` (the batches done are cached; --force resumes)."""
    found, scores, position, spent = {}, [], 0, 0.0
    threshold = float("inf")
    while position < len(survivors) and (exhaustive or survivors[position][0] <= threshold):
        chunk = survivors[position:position + batch]
        from simsp.shortcuts.work_counts import row_seconds  # the shortcut check: networkx
        spent += sum(row_seconds(scenario_of(config)) for _, _, config in chunk)
        if spent > TOTAL_TIME_LIMIT_S and not force:
            raise UserError("work", f"the search has simulated {position} layouts and the next "
                                    f"{len(chunk)} bring its estimate to about {spent:.3g} CPU "
                                    f"seconds, above the limit of {TOTAL_TIME_LIMIT_S:g} s "
                                    "(those simulated are cached: --force to go on)")
        position += len(chunk)
        printer = RowStream([(index, config) for _, index, config in chunk], chunk[0][2],
                            reserve) if stream else None
        rows = evaluate_all([config for _, _, config in chunk], executor, cache, bar,
                            stream=printer)
        for _, index, config in chunk:
            found[index] = rows[config.digest()]
            scores.append(objective_score(found[index], objective, reserve))
        threshold = float("inf") if exhaustive else _kth_best(scores, top)
        if bar is not None:
            bar.total = position + _open(survivors, position, threshold)
            bar.refresh()
    return found, len(survivors) - position


def check_bounds(result: SearchResult, sc, row: dict) -> None:
    """Put both bounds in the row; record one the simulation beat (pruning would be unsound)."""
    row["time_lower_bound_s"] = time_lower_bound(sc)
    row["memory_lower_bound_bytes"] = memory_lower_bound(sc)
    if row.get("status") == "error":
        return
    pairs = [("time", row["time_lower_bound_s"], row["iteration_time_s"]),
             ("memory", row["memory_lower_bound_bytes"], row.get("peak_bytes_stage0"))]
    for which, bound, simulated in pairs:
        if simulated is not None and bound > simulated * (1 + 1e-12):
            result.violations.append((row["variant"], which, bound / simulated))


def search(base: dict, gpus: int, batch: int, executor, cache: ResultCache, top: int = 5,
           objective: str = "time", reserve: float | None = None, quiet: bool = True,
           fixed: dict | None = None, exhaustive: bool = False,
           source: str | None = None, allowed: dict | None = None,
           nodes: int | None = None, stream: bool = False, force: bool = False) -> SearchResult:
    """Enumerate, screen, simulate and collect the rows of every simulated layout; `reserve`
    bytes of each GPU are kept free (None: each layout's itemised non-tensor memory; a layout
    fits when its peak leaves them); `allowed`
    restricts layout fields to the values given, `nodes` the node count (default: enough);
    `stream`: print each simulated layout's line to stdout as it is ready; `force`: past the
    total work limit."""
    layouts: Layouts = enumerate_layouts(base, gpus, batch, fixed, source, allowed, nodes,
                                         quiet)
    configs = layouts.configs
    result = SearchResult(layouts=len(configs) + layouts.invalid, rejected=dict(layouts.rejected),
                          exhaustive=exhaustive)
    survivors = screen(configs, reserve, result, objective, exhaustive, quiet)
    width = BATCH  # not the executor's parallelism: the same rows whatever runs them
    with progress_bar(len(survivors), 0, quiet, "simsp search: simulated") as bar:
        found, result.pruned_bound = branch_and_bound(survivors, executor, cache, top, width,
                                                      objective, reserve, bar, exhaustive,
                                                      stream, force)
    first = configs[min(found)] if found else None
    for index in sorted(found):
        row = add_headroom(table_row(index, configs[index], first, found[index]), reserve)
        check_bounds(result, scenario_of(configs[index]), row)
        result.rows.append(row)
    return result


__all__ = ["search", "SearchResult", "OBJECTIVES"]
