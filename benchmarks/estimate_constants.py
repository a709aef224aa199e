"""Measure every constant of the work estimate (simsp/scenario/work_constants.py) in one pass on
this machine: per group of constants, runs that isolate its term, each in its own process, best
of three by process time (what benchmarks/scale.py measures), printed beside work.py's value.

Usage: python benchmarks/estimate_constants.py [--only GROUP ...] [--repeat N] [--json FILE]
                                              [--from-json FILE]
The groups and their runs are in benchmarks/estimate_cases.py; `--from-json` refits the runs
of an earlier `--json` without measuring. Copy the printed values into work_constants.py.

The estimate is linear in its constants: evaluated once with each constant a unit symbol
(Symbol), it gives every run the count each constant multiplies (its layer-steps, flows,
pairs...). A group's constants are then the non-negative least-squares fit, relative to each
run's CPU, of (measured − the other terms at their values) = Σ count × constant over the group's
runs. The groups are solved in turn with the values already found, and the pass repeated until
they settle (no more runs: the CPU seconds are measured once). `--only` measures those groups,
the others at work.py's values. The machine's speed probe (benchmarks/speed.py probe_ms) is
printed before and after: compare values only at like probes.
"""

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

from simsp.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from estimate_cases import GROUPS  # noqa: E402 (the runs of each group of constants)
from speed import probe_ms  # noqa: E402
from bench_args import (distinct, number_in, out_file, parser, read_json,  # noqa: E402
                        run_main)

MAX_REPEAT = 100  # runs per case: best of a hundred is already hours
# constants the estimate divides by: fitted as their reciprocal (seconds per FLOP)
INVERSE = {"NUMERIC_FLOPS_PER_SECOND"}
# how -> the constant of the records a run keeps that it measures: bytes freed (tracemalloc) by
# dropping them from the run's trace, over their number
KEPT = {"span-bytes": "BYTES_PER_SPAN", "merged-span-bytes": "BYTES_PER_MERGED_SPAN",
        "record-bytes": "BYTES_PER_TRANSFER_RECORD"}
# Runs in the child: one iteration's process time (or peak RSS) and the estimate's counts.
CHILD = """
import json, resource, sys, time
from simsp.cli import build_parser
from simsp.scenario.outside import scenario_from_args
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
sys.path.insert(0, "benchmarks")
from estimate_constants import KEPT, counts
from simsp.scenario.loading import load_scenario
how, argv = sys.argv[1], sys.argv[2:]
BYTES = ("bytes", "full-bytes")  # peak RSS measured
FULL = ("full", "full-bytes", "span-bytes", "record-bytes")  # under Shortcuts()
if argv[0].startswith("{"):  # scenario fields, "section.key": value
    fields = {tuple(key.split(".")): value for key, value in json.loads(argv[0]).items()}
    sc = load_scenario(None, {**fields, ("run", "mode"): "meta"})
else:
    mode = [] if how == "numeric" else ["--mode", "meta"]
    sc = scenario_from_args(build_parser().parse_args(["run", *argv, *mode]))
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.process_time()
shortcuts = Shortcuts() if how in FULL else Shortcuts.for_scale(sc)
if how == "visits":  # the solves alone (work_estimate.py --visits)
    from simsp.engine.network import Network
    solves, reschedule = [0.0], Network._reschedule
    def timed(self, event=None):
        begin = time.process_time()
        reschedule(self, event)
        solves[0] += time.process_time() - begin
    Network._reschedule = timed
if how in KEPT:  # bytes per kept record: what dropping them frees, traced
    from estimate_constants import dropped_bytes
    spent, dropped = dropped_bytes(sc, shortcuts, how)
elif how != "check":
    run = simulate_iteration(sc, shortcuts, trace="steps" if how in BYTES else "none")
    spent = solves[0] if how == "visits" else time.process_time() - start
if how in BYTES:
    spent = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss
found = counts(sc, shortcuts, how)
if how in KEPT:  # priced per record the run dropped, counted
    found = {how: {KEPT[how]: dropped}}
if how == "visits":  # priced per visit the solves made (Network.flow_visits), as counted
    found = {how: {"SECONDS_PER_FLOW_VISIT": run.inputs.world.network.flow_visits}}
print(json.dumps({"measured": spent, "counts": found}))
"""


class Symbol:
    """A linear combination of the constants ({name: coefficient}): what the estimate's
    arithmetic makes of unit symbols put in the constants' place."""

    def __init__(self, terms: dict):
        self.terms = terms

    def __add__(self, other):
        if isinstance(other, Symbol):
            return Symbol({k: self.terms.get(k, 0.0) + other.terms.get(k, 0.0)
                           for k in {*self.terms, *other.terms}})
        assert other == 0, other  # every term of the estimate carries a constant
        return self

    __radd__ = __add__

    def __mul__(self, factor):
        return Symbol({k: v * factor for k, v in self.terms.items()})

    __rmul__ = __mul__

    def __rtruediv__(self, numerator):
        """numerator / NUMERIC_FLOPS_PER_SECOND: the count of its inverse (seconds per FLOP)."""
        (name,) = self.terms
        return Symbol({name: float(numerator)})


def _modules():
    """The modules that hold the constants by name (work_constants and its importers)."""
    import simsp.scenario.work as work
    import simsp.scenario.work_bytes as work_bytes
    import simsp.scenario.work_constants as constants
    import simsp.shortcuts.work_counts as work_counts
    return constants, work, work_bytes, work_counts


def _put(values: dict) -> None:
    """Put `values` ({name or name[key]: value}) in the constants' places in every module."""
    for module in _modules():
        for name, value in values.items():
            base, _, key = name.partition("[")
            if not hasattr(module, base):
                continue
            if key:
                getattr(module, base)[key.rstrip("]")] = value
            else:
                setattr(module, base, value)


def constant_names() -> list[str]:
    """Every measured constant's name (a dict's entries as NAME[key])."""
    names = [name for group, _ in GROUPS.values() for name in group]
    return sorted(set(names))


def current_values(raw: bool = False) -> dict:
    """work_constants.py's value of every measured constant (the fit's: an INVERSE one's
    reciprocal, unless `raw`)."""
    import simsp.scenario.work_constants as constants
    values = {}
    for name in constant_names():
        base, _, key = name.partition("[")
        value = getattr(constants, base)
        value = value[key.rstrip("]")] if key else value
        values[name] = value if raw or name not in INVERSE else 1 / value
    return values


def counts(sc, shortcuts, how: str) -> dict:
    """The count each constant multiplies in this run's estimate ({how: {name: count}}; a run
    timed by `run` and by the rule before the verdict both)."""
    hows = ("run", "rule") if how in ("run", "rule") else (how,)
    return {each: _counts(sc, shortcuts, each) for each in hows}


def _counts(sc, shortcuts, how: str) -> dict:
    """The count each constant multiplies in this run's estimate ({name: count})."""
    from simsp.scenario.work import meta_bytes, meta_seconds, numeric_seconds
    from simsp.shortcuts.record_counts import dp_ring_records
    from simsp.shortcuts.work_counts import cp_shadows, run_ranks, run_seconds
    saved = current_values(raw=True)
    _put({name: Symbol({name: 1.0}) for name in saved})
    try:
        if how in ("run", "check", "visits"):
            estimate = run_seconds(sc, shortcuts)
        elif how in ("rule", "full"):
            estimate = meta_seconds(sc, shortcuts.representative)
        elif how == "numeric":
            estimate = numeric_seconds(sc)
        else:  # peak RSS at run's default trace: no detail spans
            estimate = meta_bytes(sc, shortcuts.representative, run_ranks(sc, shortcuts),
                                  shortcuts.templates, cp_shadows=cp_shadows(sc, shortcuts),
                                  records=dp_ring_records(sc, shortcuts))
    finally:
        _put(saved)
    alone = {"check": "SYMMETRY_SECONDS_PER_RANK", "visits": "SECONDS_PER_FLOW_VISIT", **KEPT}
    if how in alone:  # the check, the solves: their own term only
        estimate = Symbol({alone[how]: estimate.terms.get(alone[how], 0.0)})
    return dict(estimate.terms)


def dropped_bytes(sc, shortcuts, how: str) -> tuple[int, int]:
    """Bytes (tracemalloc) freed by dropping the records `how` names (KEPT) from a run at
    `--trace full`, and their number: the detail tracks' spans with their own args
    ("span-bytes"), a template's merged spans ("merged-span-bytes", args {"spans", "busy_s"}),
    the data-parallel rings' transfer records ("record-bytes", labelled dp_, FSDP's fsdp)."""
    import gc
    import tracemalloc
    from simsp.engine.trace import DETAIL_TRACKS
    from simsp.training.driver.iteration import simulate_iteration
    tracemalloc.start()
    trace = simulate_iteration(sc, shortcuts, trace="full").inputs.world.trace
    if how == "record-bytes":
        drop = lambda t: t.label.startswith(("dp_", "fsdp "))  # noqa: E731
        kept, name = trace.transfers, "transfers"
    else:
        merged = how == "merged-span-bytes"
        drop = lambda s: s.track in DETAIL_TRACKS and ("spans" in s.args) == merged  # noqa: E731
        kept, name = trace.spans, "spans"
    dropped = sum(map(drop, kept))
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    setattr(trace, name, [each for each in kept if not drop(each)])
    del kept
    gc.collect()
    freed = before - tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return freed, dropped


def measure(argv: list[str], how: str, repeat: int) -> dict:
    """The best (least) of `repeat` measurements, each in a fresh process, with the counts."""
    best = None
    for _ in range(repeat):
        done = subprocess.run([sys.executable, "-c", CHILD, how, *argv], cwd=ROOT,
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(f"    failed: {done.stderr.strip().splitlines()[-1:]}")
            return None
        point = json.loads(done.stdout.strip().splitlines()[-1])
        if best is None or point["measured"] < best["measured"]:
            best = point
    return best


def fit(rows: list[tuple[float, float, list[float]]]) -> list[float]:
    """Non-negative least squares, each row relative to its measurement: rows of (measured,
    the other terms, counts of the group's constants); every subset of the constants tried."""
    size = len(rows[0][2])
    best, best_error = [0.0] * size, float("inf")
    for kept in itertools.chain.from_iterable(
            itertools.combinations(range(size), k) for k in range(1, size + 1)):
        a = np.array([[c[i] / m for i in kept] for m, _, c in rows])  # shape (rows, kept)
        b = np.array([(m - other) / m for m, other, _ in rows])  # shape (rows,)
        if not a.any():
            continue
        x = np.linalg.lstsq(a, b, rcond=None)[0]  # shape (kept,)
        error = float(np.sum((a @ x - b) ** 2))
        if (x >= 0).all() and error < best_error:
            best, best_error = [0.0] * size, error
            for i, value in zip(kept, x):
                best[i] = float(value)
    return best


def solve(points: dict, values: dict, groups: list[str], sweeps: int = 8) -> dict:
    """Each group's constants from its runs, the others at `values`; repeated until settled."""
    values = dict(values)
    for _ in range(sweeps):
        for group in groups:
            names, runs = GROUPS[group]
            rows = []
            for label, _, how in runs:
                if label not in points:  # its run failed
                    continue
                point = points[label]
                c = point["counts"][how]
                other = sum(count * values[name] for name, count in c.items()
                            if name not in names and name in values)
                rows.append((point["measured"], other, [c.get(name, 0.0) for name in names]))
            if rows:
                values.update(zip(names, fit(rows)))
    return values


def report(points: dict, old: dict, new: dict, groups: list[str]) -> None:
    """Each run's measured value against the estimate before and after; each constant's value."""
    print(f"\n{'run':<40}{'measured':>11}{'est. old':>11}{'est. new':>11}")
    for group in groups:
        for label, _, how in GROUPS[group][1]:
            if label not in points:
                continue
            c = points[label]["counts"][how]
            before = sum(n * old[k] for k, n in c.items() if k in old)
            after = sum(n * new[k] for k, n in c.items() if k in new)
            print(f"{label:<40}{points[label]['measured']:>11.4g}{before:>11.4g}{after:>11.4g}")
    print(f"\n{'constant':<42}{'work.py':>11}{'measured':>11}{'ratio':>7}")
    for group in groups:
        for name in GROUPS[group][0]:
            was, now = (old[name], new[name]) if name not in INVERSE else \
                (1 / old[name], 1 / new[name] if new[name] else float("inf"))
            ratio = now / was if was else float("nan")
            print(f"{name:<42}{was:>11.3g}{now:>11.3g}{ratio:>7.2f}")


def main(argv: list[str] | None = None) -> None:
    """Measure the groups asked for, fit their constants, print them beside work.py's."""
    arguments = parser(__doc__.splitlines()[0])
    arguments.add_argument("--only", nargs="+", choices=list(GROUPS), default=list(GROUPS))
    arguments.add_argument("--repeat", type=number_in(int, 0, MAX_REPEAT), default=3,
                           help=f"runs per case (best kept), 1 to {MAX_REPEAT}")
    arguments.add_argument("--json", type=Path, help="write the runs and constants here")
    arguments.add_argument("--from-json", type=Path, help="refit the runs of an earlier --json")
    args = arguments.parse_args(argv)
    distinct(args.only, "--only")
    out_file(args.json, "--json", [args.from_json])
    old = current_values()
    if args.from_json:
        points = earlier_runs(args.from_json)
    else:
        points, before = {}, probe_ms()
        print(f"machine speed probe, sum(range(10**7)): {before:.0f} ms before", flush=True)
        for group in args.only:
            for label, run_argv, how in GROUPS[group][1]:
                if label in points:  # measured for another group (by the same arguments)
                    continue
                point = measure(run_argv, how, args.repeat)
                if point is not None:
                    points[label] = point
                    print(f"  {group:<14}{label:<40}{point['measured']:.4g}", flush=True)
        print(f"machine speed probe: {probe_ms():.0f} ms after")
    if args.json:  # the runs first: a refit (--from-json) needs only them
        args.json.write_text(json.dumps({"runs": points}, indent=1) + "\n")
    new = solve(points, old, args.only)
    if args.json:
        args.json.write_text(json.dumps({"runs": points, "constants": new}, indent=1) + "\n")
    report(points, old, new, args.only)


def earlier_runs(path: Path) -> dict:
    """The runs of an earlier --json ({label: {"measured": seconds or bytes, "counts": {how:
    {constant: count}}}}), each checked, else one error naming the file."""
    runs = read_json(path, "--from-json")
    runs = runs.get("runs") if isinstance(runs, dict) else None
    if not isinstance(runs, dict):
        raise UserError("--from-json", f"{path}: has no \"runs\" object (an earlier --json's)")
    for label, point in runs.items():
        counts_ = point.get("counts") if isinstance(point, dict) else None
        if not (isinstance(counts_, dict) and _finite(point.get("measured"))
                and all(isinstance(c, dict) and all(map(_finite, c.values()))
                        for c in counts_.values())):
            raise UserError("--from-json", f"{path}: run {label!r} is not a measured value "
                                           "with its counts")
    return runs


def _finite(value) -> bool:
    """A JSON number that is finite (bool excluded)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


if __name__ == "__main__":
    run_main(main)
