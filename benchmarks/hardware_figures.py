"""The figures of docs/hardware.md §3 and §4, regenerated: ring and NVLS bus bandwidth per
system, and the 175B model on A100 and H100 in BF16 and FP8 by exposure category.

    python benchmarks/hardware_figures.py

Each figure is a `simsp` command's --json output (nothing here is fitted or tuned).
"""

import json
import subprocess
import sys

GIB = 2**30
RINGS = [("dgx-a100", 8, 1, 8), ("dgx-h100", 8, 1, 16), ("dgx-h200", 8, 1, 16),
         ("dgx-b200", 8, 1, 16), ("gb200-nvl72", 72, 1, 16), ("dgx-h100", 16, 2, 4),
         ("dgx-h100", 32, 4, 4)]  # system, ranks, nodes, GiB
RUNS = [("A100 (default)", []), ("H100 BF16", ["--system", "dgx-h100"]),
        ("H100 FP8 hybrid", ["--system", "dgx-h100", "--fp8-format", "hybrid"]),
        ("H100 FP8 + param gather", ["--system", "dgx-h100", "--fp8-format", "hybrid",
                                     "--fp8-param-gather"])]


def simsp(*args) -> dict:
    out = subprocess.run([sys.executable, "-m", "simsp.cli", *args, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def ring_rows() -> list[str]:
    lines = ["| system | ranks | nodes | size | ring busbw GB/s | NVLS busbw GB/s |",
             "|---|---:|---:|---|---:|---:|"]
    for system, ranks, nodes, gib in RINGS:
        base = ["ring", "--system", system, "--ranks", str(ranks), "--nodes", str(nodes),
                "--size", f"{gib}G"]
        ring = simsp(*base)["busbw_GBps"]
        try:
            nvls = f"{simsp(*base, '--nccl-algo', 'nvls')['busbw_GBps']:.1f}"
        except subprocess.CalledProcessError:
            nvls = "—"
        lines.append(f"| {system} | {ranks} | {nodes} | {gib} GiB | {ring:.1f} | {nvls} |")
    return lines


def run_rows() -> list[str]:
    keys = ("compute", "tp_comm", "pp_transfer", "pp_wait", "dp_comm", "optimizer")
    lines = ["| run | iteration s | MFU | " + " | ".join(keys) + " | peak GiB (stage 0) |",
             "|---|" + "---:|" * (len(keys) + 3)]
    for name, flags in RUNS:
        m = simsp("run", "scenarios/paper-175b.toml", "--quiet", *flags)
        stage0 = m["exposed_s_per_stage"][0]
        lines.append(f"| {name} | {m['iteration_time_s']:.3f} | {100 * m['mfu']:.1f}% | "
                     + " | ".join(f"{stage0[k]:.3f}" for k in keys)
                     + f" | {m['ranks'][0]['peak_bytes'] / GIB:.2f} |")
    return lines


if __name__ == "__main__":
    print("\n".join(ring_rows() + [""] + run_rows()))
