"""How simsp's cost grows with the cluster (docs/PERFORMANCE.md): CPU seconds and peak memory of
one meta-mode `simsp run` per layout family at 128 -> 16,384 GPUs (or the family's natural
sizes), the growth exponent k of CPU ∝ GPUs^k per family, and the work estimate beside it
(simsp/scenario/work.py: its counts and its seconds, and measured / estimated).

Usage: python benchmarks/scale.py [--quick] [--only FAMILY ...] [--cap S] [--json FILE]

Each point runs in its own subprocess under a wall-clock cap (--cap, default 120 s); a point
past it is recorded as "> cap" and the larger sizes of its family are skipped (the cost only
grows), so the benchmark always finishes. CPU is the child's process time (user + system),
memory its peak RSS (getrusage). The machine's speed probe (benchmarks/speed.py probe_ms) is
printed before and after: the estimate's constants were measured at the probe
simsp/scenario/work_constants.py names. The counts are the engine's: simpy events, flows started on
the links (engine/network.py `flows_started`, with those the all-to-alls timed alone start in
their private simulations, engine/communicator.py `alone_flows`) and fair-share solves. Each
point is also put to `simsp run`'s own work check (the rule before the verdict, then the
verdict's counts: commands/run.py), and a line says so where run would refuse it.
Families (the layouts of docs/PERFORMANCE.md "Scale"):
- gpt3-175b-h100: GPT-3 175B on DGX H100 as NeMo's recipe runs it (NVIDIA/NeMo
  examples/nlp/language_modeling/conf/gpt3_175b.yaml style: TP 4 with SP, PP 8 interleaved,
  distributed optimizer, overlapped gradient reduce and parameter gather), 16 micro-batches
  per replica;
- gpt3-175b-h100-tpo: the same with --tp-comm-overlap (TE's userbuffers ring exchanges);
- deepseek-v3: scenarios/deepseek-v3.toml (EP 64, PP 16, MLA), d from the GPU count;
- llama3.1-405b-fsdp: scenarios/llama3.1-405b.toml at TP 8 PP 16 with Megatron-FSDP;
- cp-128k: scenarios/llama3-70b.toml (TP 8, PP 4 interleaved) at 128K tokens, CP 8, 16 and 32;
- cp-128k-dp: the same at CP 16 with d = GPUs / 512 replicas (global batch 4·d), 512 ->
  16,384 GPUs;
- fsdp2-d64: scenarios/llama3-8b.toml with 8 layers under FSDP2, d = GPUs;
- mtp-deep: scenarios/llama3-8b.toml with 2 layers and D multi-token-prediction depths (the
  "size" is D; one GPU count);
- cp-allgather: scenarios/llama3-8b.toml, 2 layers, s 4096, --cp-comm-type allgather, cp = GPUs;
- a2a-dispatch: a 2-layer MoE with the alltoall dispatcher, EP = d = GPUs.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from speed import probe_ms  # noqa: E402 (the machine's speed, printed beside the table)
from bench_args import distinct, number_in, out_file, parser, run_main  # noqa: E402

MAX_CAP_S = 86400.0  # a day per point: a cap beyond it is a typo, not a plan
SIZES = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
QUICK = (128, 256, 512)


def _gpt3(gpus: int) -> list[str]:
    """GPT-3 175B, NeMo's H100 layout: d = GPUs / 32, 16 micro-batches per replica (NeMo's
    global batch 2048 at 4,096 GPUs)."""
    return ["scenarios/paper-175b.toml", "--system", "dgx-h100",
            "--tensor-model-parallel-size", "4", "--sequence-parallel",
            "--pipeline-model-parallel-size", "8", "--num-layers-per-virtual-pipeline-stage", "6",
            "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
            "--global-batch-size", str(gpus // 2), "--world-size", str(gpus)]


def _gpt3_tp_overlap(gpus: int) -> list[str]:
    """The GPT-3 175B layout above with Transformer Engine's TP communication overlap (TE's
    default userbuffers methods: ring-exchange all-gathers, pipelined reduce-scatters)."""
    return _gpt3(gpus) + ["--tp-comm-overlap"]


def _deepseek(gpus: int) -> list[str]:
    """DeepSeek-V3 as bundled, d = GPUs / 16 (EP 64 within it)."""
    return ["scenarios/deepseek-v3.toml", "--world-size", str(gpus),
            "--global-batch-size", str(max(1024, gpus // 16))]


def _llama405_fsdp(gpus: int) -> list[str]:
    """Llama 3.1 405B at TP 8 PP 16 with Megatron-FSDP, d = GPUs / 128, 16 micro-batches per
    replica."""
    return ["scenarios/llama3.1-405b.toml", "--pipeline-model-parallel-size", "16",
            "--num-layers-per-virtual-pipeline-stage", "2", "--use-megatron-fsdp",
            "--data-parallel-sharding-strategy", "optim_grads_params",
            "--global-batch-size", str(gpus // 8), "--world-size", str(gpus)]


def _cp_128k(gpus: int) -> list[str]:
    """Llama 3 70B as bundled (TP 8, PP 4 interleaved) at 128K tokens, CP = GPUs / 32."""
    return ["scenarios/llama3-70b.toml", "--seq-length", "131072",
            "--context-parallel-size", str(gpus // 32), "--global-batch-size", "4",
            "--world-size", str(gpus)]


def _cp_128k_dp(gpus: int) -> list[str]:
    """Llama 3 70B as bundled (TP 8, PP 4 interleaved) at 128K tokens, CP 16, d = GPUs / 512
    replicas of 4 micro-batches each."""
    return ["scenarios/llama3-70b.toml", "--seq-length", "131072",
            "--context-parallel-size", "16", "--global-batch-size", str(4 * (gpus // 512)),
            "--world-size", str(gpus)]


def _fsdp2(gpus: int) -> list[str]:
    """Llama 3 8B, 8 layers, FSDP2 over d = GPUs."""
    return ["scenarios/llama3-8b.toml", "--num-layers", "8", "--use-torch-fsdp2",
            "--tensor-model-parallel-size", "1", "--no-sequence-parallel",
            "--global-batch-size", str(gpus), "--world-size", str(gpus)]


def _mtp(depths: int) -> list[str]:
    """Llama 3 8B shape, 2 layers, `depths` multi-token-prediction depths on 8 GPUs."""
    return ["scenarios/llama3-8b.toml", "--num-layers", "2", "--mtp-num-layers", str(depths),
            "--global-batch-size", "4", "--world-size", "8"]


def _cp_allgather(gpus: int) -> list[str]:
    """Llama 3 8B shape, 2 layers, s 4096 per CP rank, all-gather CP over cp = GPUs."""
    return ["scenarios/llama3-8b.toml", "--num-layers", "2", "--seq-length", str(32 * gpus),
            "--tensor-model-parallel-size", "1", "--no-sequence-parallel",
            "--context-parallel-size", str(gpus), "--cp-comm-type", "allgather",
            "--global-batch-size", "1", "--world-size", str(gpus)]


def _a2a(gpus: int) -> list[str]:
    """A 2-layer MoE (one expert per rank), alltoall dispatcher, EP = d = GPUs."""
    return ["scenarios/tiny.toml", "--num-layers", "2", "--seq-length", "256",
            "--disable-bias-linear", "--num-experts", str(gpus), "--tensor-model-parallel-size", "1",
            "--pipeline-model-parallel-size", "1",
            "--no-sequence-parallel",
            "--expert-model-parallel-size", str(gpus), "--moe-token-dispatcher-type",
            "alltoall", "--micro-batch-size", "1", "--global-batch-size", str(gpus),
            "--world-size", str(gpus)]


# family -> (arguments of one size, full sizes, quick sizes)
FAMILIES = {
    "gpt3-175b-h100": (_gpt3, SIZES, QUICK),
    "gpt3-175b-h100-tpo": (_gpt3_tp_overlap, (128, 512, 2048), (128,)),
    "deepseek-v3": (_deepseek, (1024, 2048, 4096), (1024,)),
    "llama3.1-405b-fsdp": (_llama405_fsdp, (2048, 4096, 8192, 16384), (2048,)),
    "cp-128k": (_cp_128k, (256, 512, 1024), (256,)),
    "cp-128k-dp": (_cp_128k_dp, (512, 1024, 2048, 4096, 8192, 16384), (512, 1024)),
    "fsdp2-d64": (_fsdp2, (16, 32, 64, 128, 256), (16, 32, 64)),
    "mtp-deep": (_mtp, (64, 256, 1024, 4096), (64, 256)),
    "cp-allgather": (_cp_allgather, (64, 128, 256, 512), (64, 128)),
    "a2a-dispatch": (_a2a, (64, 128, 256), (64, 128)),
}

# Both children: what the shortcut verdict keeps (simulated ranks, groups stepped as flows) and
# the first shortcut it refuses, with its reason (shortcuts/check.py).
VERDICT = """
from simsp.engine.group_timing import STEPPED
from simsp.shortcuts.plan import simulated_ranks


def verdict(sc, shortcuts):
    ranks = simulated_ranks(sc, shortcuts)
    refused = [f"{name}: {why}" for name, why in shortcuts.reasons if why.startswith("not used")]
    return {"ranks": None if ranks is None else len(list(ranks)),
            "stepped": (sum(method in STEPPED for _, method in shortcuts.methods)
                        if shortcuts.closed_form else None),
            "refused": refused[0] if refused else None}


def run_gate(sc, shortcuts):
    # what `simsp run` says before simulating (commands/run.py: the rule, then the verdict's
    # work): None where it would go on, else its error
    from simsp.errors import UserError
    from simsp.scenario.work import check_work
    from simsp.training.driver.work_verdict import verdict_work
    try:
        check_work(sc)
        check_work(sc, shortcuts=shortcuts.representative, meta=verdict_work(sc, shortcuts))
    except UserError as error:
        return str(error)
    return None
"""

# Runs in the child: one meta iteration, its counts, CPU and peak memory, and the estimate.
CHILD = VERDICT + """
import json, resource, sys, time
from simsp.cli import build_parser
from simsp.scenario.outside import scenario_from_args
from simsp.shortcuts.work_counts import estimated_counts, run_seconds
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
args = build_parser().parse_args(["run", *sys.argv[1:], "--mode", "meta"])
sc = scenario_from_args(args)
start = time.process_time()
shortcuts = Shortcuts.for_scale(sc)
run = simulate_iteration(sc, shortcuts, trace="none")
spent = time.process_time() - start
usage = resource.getrusage(resource.RUSAGE_SELF)
network = run.inputs.world.network
print(json.dumps({"cpu_s": spent, "rss_bytes": usage.ru_maxrss * 1024,
                  "events": next(run.inputs.world.env._eid),
                  "flows": network.flows_started + run.inputs.world.comm.alone_flows,
                  "solves": network.rate_computations,
                  "estimate_s": run_seconds(sc, shortcuts),
                  "estimate": estimated_counts(sc, shortcuts)._asdict(),
                  "verdict": verdict(sc, shortcuts), "run_gate": run_gate(sc, shortcuts)}))
"""

# Runs in the child for a point past the cap: the estimate alone (the shortcut check, no run).
ESTIMATE_CHILD = VERDICT + """
import json, sys
from simsp.cli import build_parser
from simsp.scenario.outside import scenario_from_args
from simsp.shortcuts.work_counts import estimated_counts, run_seconds
from simsp.training.driver.iteration import Shortcuts
sc = scenario_from_args(build_parser().parse_args(["run", *sys.argv[1:], "--mode", "meta"]))
shortcuts = Shortcuts.for_scale(sc)
print(json.dumps({"cpu_s": None, "estimate_s": run_seconds(sc, shortcuts),
                  "estimate": estimated_counts(sc, shortcuts)._asdict(),
                  "verdict": verdict(sc, shortcuts), "run_gate": run_gate(sc, shortcuts)}))
"""


def _child(script: str, arguments: list[str], cap_s: float) -> dict | None:
    """The JSON line a child script prints; None past the cap."""
    try:
        done = subprocess.run([sys.executable, "-c", script, *arguments], cwd=ROOT,
                              capture_output=True, text=True, timeout=cap_s)
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(arguments: list[str], cap_s: float) -> dict:
    """One point in a child process: its counts, CPU and memory; past the cap, CPU None and
    the estimate alone (itself under the cap)."""
    point = _child(CHILD, arguments, cap_s)
    if point is None:
        point = _child(ESTIMATE_CHILD, arguments, cap_s) or {"cpu_s": None}
    return point


def growth_exponent(points: list[tuple[int, float]]) -> float | None:
    """k of CPU ∝ size^k, least squares on log-log over the measured points (None: < 2)."""
    if len(points) < 2:
        return None
    xs = [math.log(size) for size, _ in points]  # shape (points,)
    ys = [math.log(max(cpu, 1e-6)) for _, cpu in points]  # shape (points,)
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread


def run_family(name: str, quick: bool, cap_s: float) -> list[dict]:
    """Every size of one family, smallest first, stopping after the first point past the cap."""
    arguments_of, sizes, quick_sizes = FAMILIES[name]
    rows = []
    for size in (quick_sizes if quick else sizes):
        point = measure(arguments_of(size), cap_s)
        rows.append({"family": name, "size": size, **point})
        print(_row_text(rows[-1], cap_s), flush=True)
        if point.get("cpu_s") is None:
            break
    return rows


def _row_text(row: dict, cap_s: float) -> str:
    """One table line: size, CPU, peak memory, counts, estimate, measured / estimated, and the
    verdict's simulated ranks and stepped groups; below it the first shortcut refused, if any."""
    head = f"{row['family']:<20}{row['size']:>7}"
    if "error" in row:
        return f"{head}  error: {row['error']}"
    if row["cpu_s"] is None:
        estimate = (f"{'':>27}{_flows(row['estimate']):>10}{row['estimate_s']:>9.2f}{'':>9}"
                    if "estimate" in row else "")
        return (f"{head}{'> ' + format(cap_s, 'g'):>9}{estimate}{_verdict_text(row)}"
                f"{_gate_text(row)}")
    ratio = row["cpu_s"] / row["estimate_s"] if row["estimate_s"] else math.inf
    return (f"{head}{row['cpu_s']:>9.2f}{row['rss_bytes'] / 2 ** 30:>7.2f}{row['events']:>11}"
            f"{row['flows']:>10}{_flows(row['estimate']):>10}{row['estimate_s']:>9.2f}"
            f"{ratio:>9.2f}{_verdict_text(row)}{_gate_text(row)}")


def _gate_text(row: dict) -> str:
    """A line of its own where `simsp run` would refuse the point before simulating it."""
    gate = row.get("run_gate")
    return f"\n{'':>27}simsp run refuses it: {gate}" if gate else ""


def _flows(estimate: dict) -> int:
    """The estimate's flows: stepped TP and DP rings, FSDP rings stepped and as pieces
    (shortcuts/work_counts.py WorkCounts)."""
    return sum(count for name, count in estimate.items() if name.endswith("flows"))


def _verdict_text(row: dict) -> str:
    """The verdict's columns (simulated ranks, 'all' without the representative; stepped
    groups) and, on a line of its own, the first shortcut it refuses."""
    verdict = row.get("verdict")
    if verdict is None:
        return ""
    ranks = "all" if verdict["ranks"] is None else verdict["ranks"]
    refused = f"\n{'':>27}refused {verdict['refused']}" if verdict["refused"] else ""
    stepped = "all" if verdict["stepped"] is None else verdict["stepped"]
    return f"{ranks:>7}{stepped:>9}{refused}"


def main(argv: list[str] | None = None) -> None:
    """Measure the families asked for, print the table and each family's growth exponent."""
    arguments = parser(__doc__.splitlines()[0])
    arguments.add_argument("--quick", action="store_true", help="the small grid")
    arguments.add_argument("--only", nargs="+", choices=sorted(FAMILIES), default=list(FAMILIES))
    arguments.add_argument("--cap", type=number_in(float, 0, MAX_CAP_S), default=120.0,
                           help=f"wall seconds per point, in (0, {MAX_CAP_S:g}]")
    arguments.add_argument("--json", type=Path, help="write every row here")
    args = arguments.parse_args(argv)
    distinct(args.only, "--only")
    out_file(args.json, "--json")
    before = probe_ms()
    print(f"machine speed probe, sum(range(10**7)): {before:.0f} ms before")
    print(f"{'family':<20}{'size':>7}{'cpu s':>9}{'GiB':>7}{'events':>11}{'flows':>10}"
          f"{'est fl':>10}{'est s':>9}{'meas/est':>9}{'ranks':>7}{'stepped':>9}")
    rows = []
    for name in args.only:
        family = run_family(name, args.quick, args.cap)
        rows += family
        measured = [(r["size"], r["cpu_s"]) for r in family if r.get("cpu_s") is not None]
        k = growth_exponent(measured)
        print(f"{name:<20} growth k = {'n/a' if k is None else format(k, '.2f')}", flush=True)
    print(f"machine speed probe: {probe_ms():.0f} ms after (simsp/scenario/work_constants.py "
          "names the probe its constants were measured at)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    run_main(main)
