"""Time `simsp run` on the four paper scenarios, both K22 variants, and print what it reports.

Usage: python benchmarks/paper_runs.py [--quick]   (--quick: the present-work variant only)
Prints a markdown table: wall seconds of the whole command (simulation and reports), simulated
iteration time vs K22 Table 5 where published, MFU, HFU, stage-0 memory by category.
"""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("22b", "175b", "530b", "1t")
# K22 Table 5 (docs/MODEL.md#paper-layouts): seconds per iteration, calibration rows only
PUBLISHED = {("22b", "full"): 1.42, ("22b", "present"): 1.10,
             ("175b", "full"): 18.13, ("175b", "present"): 13.75}
VARIANTS = {"present": [], "full": ["--recompute-granularity", "full", "--no-sequence-parallel"]}
GIB = 2 ** 30


def run_one(model: str, variant: str) -> tuple[float, dict]:
    """Wall seconds of one `simsp run ... --json` and its metrics."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "simsp.cli", "run", f"scenarios/paper-{model}.toml",
                   *VARIANTS[variant], "--json", "--out", out]
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
        return time.perf_counter() - start, json.loads(done.stdout)


def row(model: str, variant: str, wall: float, m: dict) -> str:
    stage0 = m["ranks"][0]
    at_peak = stage0["at_peak_bytes"]
    published = PUBLISHED.get((model, variant))
    vs = f"{published:.2f} ({100 * (m['iteration_time_s'] / published - 1):+.1f}%)" \
        if published else "—"
    oom = "OOM" if m["oom"] else "fits"
    formula = m["first_stage_activation_formula_bytes"]
    versus = f"{100 * (stage0['activation_peak_bytes'] / formula - 1):+.2f}%"
    return (f"| {model} | {variant} | {wall:.1f} | {m['iteration_time_s']:.2f} | {vs} | "
            f"{100 * m['mfu']:.1f}% | {100 * m['hfu']:.1f}% | {stage0['weights_bytes'] / GIB:.1f} | "
            f"{stage0['gradients_bytes'] / GIB:.1f} | {stage0['optimizer_bytes'] / GIB:.1f} | "
            f"{stage0['activation_peak_bytes'] / GIB:.1f} | {versus} | "
            f"{at_peak['temporaries'] / GIB:.2f} | {stage0['peak_bytes'] / GIB:.1f} | {oom} |")


def main() -> None:
    variants = ["present"] if "--quick" in sys.argv else ["present", "full"]
    print("| model | variant | wall s | iteration s | K22 Table 5 s | MFU | HFU | weights GiB | "
          "grads GiB | optimizer GiB | activations GiB | vs K22 formula | temporaries GiB | "
          "stage-0 peak GiB | memory |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for variant in variants:
        for model in MODELS:
            wall, metrics = run_one(model, variant)
            print(row(model, variant, wall, metrics), flush=True)


if __name__ == "__main__":
    main()
