"""How fast simsp answers (docs/PERFORMANCE.md): whole commands and one in-process evaluation,
with the results they give, so a speed change that moves a result is seen at once.

Usage: python benchmarks/speed.py [--only NAME ...] [--runs N] [--repeat N] [--timeout S]
                                 [--json FILE] [--cold-bytecode]
Cases (each in its own subprocess): the four paper scenarios as `simsp run` with its default
reports; 530B with 8-way DP (2,240 GPUs) and 1T with 6-way DP (3,072 GPUs), micro-batches per
replica unchanged; 175B with --no-shortcuts and 16 micro-batches; `simsp ring` over 512 ranks on
64 nodes; and one 22B evaluation inside a running process (simulate_iteration + metrics.collect.collect,
repeated, median). Each case runs --runs times (default 3); the row is the run of median wall
time, with the fastest and slowest beside it. Prints wall and CPU seconds (CPU counts the
painter process too), peak RSS, simpy events and events per CPU second,
the iteration time and the stage-0 peak; and a machine speed probe before and after (a shared
machine's speed drifts by tens of percent: compare tables taken at like probes). simsp's
bytecode is compiled first (see bytecode(); --cold-bytecode leaves it).
"""

import argparse
import compileall
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GIB, MIB = 2 ** 30, 2 ** 20


def _run(scenario: str, *flags: str) -> list[str]:
    """`simsp run` arguments for a paper scenario."""
    return ["run", f"scenarios/paper-{scenario}.toml", *flags]


# name -> (simsp arguments, target in seconds of the whole command (None: relative), note)
CASES = {
    "175b": (_run("175b"), 1.5, ""),
    "22b": (_run("22b"), None, ""),
    "530b": (_run("530b"), 5.0, ""),
    "1t": (_run("1t"), 10.0, "peak RSS <= 1 GiB"),
    "530b-d8": (_run("530b", "--data-parallel-size", "8", "--global-batch-size", "2240",
                     "--nodes", "280"), None, "<= 1.2 x 530b"),
    "1t-d6": (_run("1t", "--data-parallel-size", "6", "--global-batch-size", "3072",
                   "--nodes", "384"), None, "<= 1.2 x 1t"),
    "175b-full-m16": (_run("175b", "--no-shortcuts", "--global-batch-size", "16"), 30.0, ""),
    "ring-512": (["ring", "--ranks", "512", "--nodes", "64", "--size", "1G"], None, ""),
    "22b-in-process": (None, 0.050, "median of one evaluation"),
    "llama3-70b": (["run", "scenarios/llama3-70b.toml"], None, "64 GPUs, GQA, SwiGLU, flash"),
    "llama3.1-405b": (["run", "scenarios/llama3.1-405b.toml"], None, "512 GPUs, uneven stages"),
}

# Runs inside the subprocess: counts the events of every simpy environment the command makes.
DRIVER = """
import json, os, sys, simpy
envs = []
_init = simpy.Environment.__init__
def _counting_init(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    envs.append(self)
simpy.Environment.__init__ = _counting_init
from simsp.cli import _flush_streams, main
try:
    code = main(sys.argv[2:], process_ends=True)  # as the installed script (simsp.cli.console)
except SystemExit as exit:
    code = exit.code
with open(sys.argv[1], "w") as f:
    json.dump({"code": code, "events": sum(next(env._eid) for env in envs)}, f)
_flush_streams()
os._exit(code)  # as the installed script: no interpreter teardown
"""

# Runs inside the subprocess: repeated in-process evaluations of the 22B scenario.
IN_PROCESS = """
import json, statistics, sys, time
from simsp.scenario.loading import load_scenario
from simsp.metrics.collect import collect
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
sc = load_scenario("scenarios/paper-22b.toml")
shortcuts = Shortcuts.for_scale(sc)
wall, cpu = [], []
for _ in range(int(sys.argv[2])):
    w, c = time.perf_counter(), time.process_time()
    run = simulate_iteration(sc, shortcuts, trace="none")
    metrics = collect(run, shortcuts)
    wall.append(time.perf_counter() - w)
    cpu.append(time.process_time() - c)
with open(sys.argv[1], "w") as f:
    json.dump({"code": 0, "events": next(run.inputs.world.env._eid),
               "wall": statistics.median(wall),
               "cpu": statistics.median(cpu), "metrics": metrics}, f)
"""


def measure(argv: list[str], timeout: float) -> dict:
    """Run `python argv` from the repository root: wall and CPU seconds and peak RSS of that
    child alone (os.wait4), or a timeout."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    with tempfile.TemporaryFile() as stderr:
        child = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env,
                                 stdout=subprocess.DEVNULL, stderr=stderr)
        while True:
            pid, _status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - start > timeout:
                child.kill()
                os.wait4(child.pid, 0)
                return {"timeout": True, "wall": time.perf_counter() - start}
            time.sleep(0.005)
        wall = time.perf_counter() - start
        stderr.seek(0)
        tail = stderr.read().decode()[-2000:]
    return {"timeout": False, "wall": wall, "cpu": usage.ru_utime + usage.ru_stime,
            "rss_bytes": usage.ru_maxrss * 1024, "stderr": tail}


def run_case(name: str, repeat: int, timeout: float) -> dict:
    """Measure one case; its figures and the results it printed."""
    command, target, note = CASES[name]
    with tempfile.TemporaryDirectory() as tmp:
        side = os.path.join(tmp, "side.json")
        if command is None:
            figures = measure(["-c", IN_PROCESS, side, str(repeat)], timeout)
        else:
            out = ["--out", os.path.join(tmp, "out")] if command[0] == "run" else []
            figures = measure(["-c", DRIVER, side, *command, *out], timeout)
        result = json.load(open(side)) if os.path.exists(side) else {}
        metrics = result.get("metrics") or _metrics(os.path.join(tmp, "out", "metrics.json"))
    if command is None and result:
        figures.update(wall=result["wall"], cpu=result["cpu"])
    return {"name": name, "target_s": target, "note": note, **figures,
            "code": result.get("code"), "events": result.get("events"),
            "iteration_time_s": metrics.get("iteration_time_s"),
            "stage0_peak_bytes": (metrics.get("ranks") or [{}])[0].get("peak_bytes")}


def median_case(name: str, runs: int, repeat: int, timeout: float) -> dict:
    """The case measured `runs` times: the run of median wall time, with the fastest and
    slowest wall times beside it (a shared machine's speed drifts by tens of percent)."""
    measured = sorted((run_case(name, repeat, timeout) for _ in range(runs)),
                      key=lambda r: r["wall"])
    middle = dict(measured[len(measured) // 2])
    middle["wall_range"] = (measured[0]["wall"], measured[-1]["wall"])
    return middle


def _metrics(path: str) -> dict:
    """The metrics.json a `simsp run` wrote, or {} (ring, failures)."""
    return json.load(open(path)) if os.path.exists(path) else {}


def row(r: dict) -> str:
    """One markdown table row of a measured case."""
    if r.get("timeout"):
        return f"| {r['name']} | > {r['wall']:.0f} (timeout) | | | | | | | | {_target(r)} |"
    events = r["events"] or 0
    rate = f"{events / r['cpu'] / 1e3:.0f}k" if r["cpu"] and events else "—"
    rss = f"{r['rss_bytes'] / MIB:.0f}" if "rss_bytes" in r else "—"
    t_iter = f"{r['iteration_time_s']!r}" if r["iteration_time_s"] is not None else "—"
    peak = f"{r['stage0_peak_bytes']}" if r["stage0_peak_bytes"] is not None else "—"
    ok = "" if r["code"] == 0 else f" (exit {r['code']})"
    low, high = r.get("wall_range", (r["wall"], r["wall"]))
    return (f"| {r['name']}{ok} | {_seconds(r['wall'])} | {_seconds(low)}–{_seconds(high)} | "
            f"{_seconds(r['cpu'])} | {rss} | {events} | {rate} | {t_iter} | {peak} | "
            f"{_target(r)} |")


def _seconds(s: float) -> str:
    """Seconds as "12.34", or "45.6 ms" below a second."""
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f}"


def _target(r: dict) -> str:
    """The case's target and note, for the last column."""
    parts = [f"<= {_seconds(r['target_s'])}"] if r["target_s"] else []
    return ", ".join(parts + ([r["note"]] if r["note"] else []))


HEADER = ("| case | wall s (median) | wall s (fastest–slowest) | CPU s | peak RSS MiB | events "
          "| events / CPU s | iteration time s | stage-0 peak bytes | target |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def probe_ms() -> float:
    """The machine's speed now: median milliseconds of three sum(range(10**7)) (pure Python,
    one core), printed beside the table so tables taken at different times can be compared."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        sum(range(10 ** 7))
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[1]


def bytecode(compile_first: bool) -> str:
    """Compile simsp's modules to bytecode (__pycache__, as Python's first import of them
    writes it) unless told not to, and say which: a run after the first reads that cache, but
    where PYTHONDONTWRITEBYTECODE is set nothing ever writes it, and every run would compile
    all of simsp again (about 0.1-0.15 s of each command's start)."""
    if not compile_first:
        return "bytecode: not compiled first (--cold-bytecode): each run compiles what it lacks"
    compileall.compile_dir(ROOT / "simsp", quiet=1)
    return "bytecode: simsp compiled first, as any run after the first finds it"


def main() -> int:
    """Run the chosen cases one after another and print (and optionally save) the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(CASES), metavar="NAME",
                        help=f"run only these cases: {', '.join(CASES)}")
    parser.add_argument("--repeat", type=int, default=20, help="in-process evaluations (median)")
    parser.add_argument("--runs", type=int, default=3,
                        help="measure each case this many times and show the median run")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per case")
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    parser.add_argument("--cold-bytecode", action="store_true",
                        help="do not compile simsp's bytecode first (see bytecode())")
    args = parser.parse_args()
    names = args.only or list(CASES)
    print(bytecode(compile_first=not args.cold_bytecode), flush=True)
    before = probe_ms()
    print(HEADER, flush=True)
    results = []
    for name in names:
        results.append(median_case(name, args.runs, args.repeat, args.timeout))
        print(row(results[-1]), flush=True)
    after = probe_ms()
    print(f"\nmachine speed probe, sum(range(10**7)): {before:.0f} ms before, {after:.0f} ms after")
    if args.json:
        Path(args.json).write_text(json.dumps({"probe_ms": [before, after], "cases": results},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
