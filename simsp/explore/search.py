"""`simsp search`: every layout for N GPUs, pruned by closed forms, the survivors simulated in
order of their time lower bound until no unsimulated layout can enter the top K, then ranked.

Branch and bound: a layout whose lower bound is not below the K-th best simulated objective
provably cannot enter the top K (simsp.explore.prune), so it is counted and never simulated."""

from dataclasses import dataclass, field

from simsp.explore.cache import ResultCache
from simsp.explore.configs import Config
from simsp.explore.layouts import enumerate_layouts
from simsp.explore.objectives import OBJECTIVES
from simsp.explore.prune import memory_verdict, scenario_of, static_bytes, time_lower_bound
from simsp.explore.runner import evaluate_all, progress_bar
from simsp.explore.table import results_frame, table_row



BATCH = 8  # layouts simulated per branch-and-bound round, fixed so results never depend on workers


@dataclass
class SearchResult:
    """What the search found: simulated rows, and how many layouts it never simulated, and why."""

    rows: list = field(default_factory=list)
    layouts: int = 0
    invalid: int = 0
    pruned_memory: int = 0
    pruned_bound: int = 0
    memory_examples: list = field(default_factory=list)  # a few (label, reason)


def _bound(sc, objective: str) -> float:
    """A lower bound of the objective, oriented so that smaller is better."""
    if objective == "memory":
        return static_bytes(sc)
    return time_lower_bound(sc)  # tokens/s and MFU are B·s/T and FLOPs/T: same order as time


def _score(row: dict, objective: str) -> float | None:
    """Smaller-is-better value comparable with the bound; None for OOM or invalid rows.
    Tokens/s and MFU are B·s/T and FLOPs/T with B, s and FLOPs fixed: ranked by time T."""
    if row.get("status") != "ok":
        return None
    return row["peak_bytes_max"] if objective == "memory" else row["iteration_time_s"]


def screen(configs: list[Config], margin: float, result: SearchResult, objective: str) -> list:
    """[(bound, index, config)] of layouts the memory closed form does not rule out."""
    survivors = []
    for i, config in enumerate(configs):
        sc = scenario_of(config)
        verdict = memory_verdict(sc, margin)
        if verdict is None:
            survivors.append((_bound(sc, objective), i, config))
            continue
        result.pruned_memory += 1
        if len(result.memory_examples) < 3:
            result.memory_examples.append((config.name, verdict))
    return sorted(survivors, key=lambda item: (item[0], item[1]))


def _kth_best(scores: list[float], top: int) -> float:
    """The top-K's worst score so far (infinity until K layouts fit)."""
    done = sorted(s for s in scores if s is not None)
    return done[top - 1] if len(done) >= top else float("inf")


def branch_and_bound(survivors: list, executor, cache: ResultCache, top: int, batch: int,
                     objective: str, bar) -> tuple[dict, int]:
    """Simulate survivors by increasing bound, a batch at a time; ({index: row}, never simulated)."""
    found, scores, position = {}, [], 0
    while position < len(survivors) and survivors[position][0] < _kth_best(scores, top):
        chunk = survivors[position:position + batch]
        position += len(chunk)
        rows = evaluate_all([config for _, _, config in chunk], executor, cache, bar)
        for _, index, config in chunk:
            found[index] = rows[config.digest()]
            scores.append(_score(found[index], objective))
    return found, len(survivors) - position


def search(base: dict, gpus: int, batch: int, executor, cache: ResultCache, top: int = 5,
           objective: str = "time", margin: float = 0.10, quiet: bool = True) -> SearchResult:
    """Enumerate, prune, simulate and collect the rows of every simulated layout."""
    configs, invalid = enumerate_layouts(base, gpus, batch)
    result = SearchResult(layouts=len(configs) + invalid, invalid=invalid)
    survivors = screen(configs, margin, result, objective)
    width = BATCH  # not the executor's parallelism: the same rows whatever runs them
    with progress_bar(len(survivors), 0, quiet, "simsp search") as bar:
        found, result.pruned_bound = branch_and_bound(survivors, executor, cache, top, width,
                                                      objective, bar)
    bounds = {index: bound for bound, index, _ in survivors}
    first = configs[min(found)] if found else None
    for index in sorted(found):
        row = table_row(index, configs[index], first, found[index])
        row["lower_bound"] = bounds[index]
        result.rows.append(row)
    return result


__all__ = ["search", "SearchResult", "OBJECTIVES", "results_frame"]
