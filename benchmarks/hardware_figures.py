"""The figures of docs/hardware.md §3 and §4, regenerated: ring and NVLS bus bandwidth per
system and size (with NCCL's pick), a layer on NVL72 at t 8 and 72, and the 175B model on A100
and H100 in BF16 and FP8 by exposure category and memory category.

    python benchmarks/hardware_figures.py

Each figure is a `simsp` command's --json output (nothing here is fitted or tuned). The
`nemo-24.07-h100` table of §6 is `simsp validate --only nemo-24.07-h100`.
"""

import json
import subprocess
import sys

GIB = 2**30
SIZES = ("64K", "1M", "256M", "4G", "16G")  # the sizes of the ring/NVLS table
RINGS = [("dgx-a100", 8, 1), ("dgx-h100", 8, 1), ("dgx-h100", 16, 2), ("dgx-h100", 32, 4),
         ("dgx-h200", 8, 1), ("dgx-b200", 8, 1), ("gb200-nvl72", 72, 1)]  # system, ranks, nodes
H100 = ["--gpu", "h100-sxm-80gb", "--system", "dgx-h100"]
RUNS = [("A100 (default)", []), ("H100 BF16", H100),
        ("H100 FP8 hybrid", H100 + ["--fp8-format", "hybrid"]),
        ("H100 FP8 + param gather", H100 + ["--fp8-format", "hybrid", "--fp8-param-gather"])]
EXPOSED = ("compute", "tp_comm", "pp_transfer", "pp_wait", "dp_comm", "optimizer")
MEMORY = ("weights", "gradients", "optimizer", "activations")


def simsp(*args) -> dict | None:
    """The --json result of one simsp command, or None where it refuses (exit 2)."""
    done = subprocess.run([sys.executable, "-m", "simsp.cli", *args, "--json"],
                          capture_output=True, text=True)
    if done.returncode == 2:
        return None
    done.check_returncode()
    return json.loads(done.stdout)


def ring_cell(system: str, ranks: int, nodes: int, size: str, algo: str) -> str:
    """'busbw algo/proto' of one all-reduce, or '—' where the algorithm cannot run."""
    found = simsp("ring", "--system", system, "--ranks", str(ranks), "--nodes", str(nodes),
                  "--size", size, "--nccl-algo", algo)
    if found is None:
        return "—"
    pick = f" {found['algorithm']}/{found['protocol']}" if algo == "auto" else ""
    return f"{found['busbw_GBps']:.1f}{pick}"


def ring_rows() -> list[str]:
    """Per system and size: NCCL's ring/tree pick and NVLS, bus bandwidth in GB/s."""
    lines = ["| system | ranks | nodes | " + " | ".join(f"{s}: pick / nvls" for s in SIZES)
             + " |", "|---|---:|---:|" + "---|" * len(SIZES)]
    for system, ranks, nodes in RINGS:
        cells = [f"{ring_cell(system, ranks, nodes, size, 'auto')} / "
                 f"{ring_cell(system, ranks, nodes, size, 'nvls')}" for size in SIZES]
        lines.append(f"| {system} | {ranks} | {nodes} | " + " | ".join(cells) + " |")
    return lines


def run_rows() -> list[str]:
    """paper-175b per exposure category (stage 0, seconds) and memory category (GiB)."""
    lines = ["| run | iteration s | MFU | bubble | " + " | ".join(EXPOSED) + " | "
             + " / ".join(MEMORY) + " / peak GiB (stage 0) |",
             "|---|" + "---:|" * (len(EXPOSED) + 4)]
    for name, flags in RUNS:
        m = simsp("run", "scenarios/paper-175b.toml", "--quiet", *flags)
        stage0, rank0 = m["exposed_s_per_stage"][0], m["ranks"][0]
        memory = [rank0["peak_by_category_bytes"][k] / GIB for k in MEMORY]
        lines.append(f"| {name} | {m['iteration_time_s']:.3f} | {100 * m['mfu']:.1f}% | "
                     f"{100 * m['bubble_fraction']:.1f}% | "
                     + " | ".join(f"{stage0[k]:.3f}" for k in EXPOSED) + " | "
                     + " / ".join(f"{x:.2f}" for x in memory)
                     + f" / {rank0['peak_bytes'] / GIB:.2f} |")
    return lines


def nvl72_rows() -> list[str]:
    """One layer (h 9216, 72 heads, s 4608, SP) on gb200-nvl72 at t 8 and t 72, and two racks'
    144-rank all-reduce of 1 GiB."""
    lines = []
    for t in (8, 72):
        m = simsp("layer", "--system", "gb200-nvl72", "--hidden-size", "9216",
                  "--num-attention-heads", "72", "--seq-length", "4608", "--sequence-parallel",
                  "--tensor-model-parallel-size", str(t), "--mode", "meta")
        lines.append(f"NVL72 layer t {t}: forward {1e3 * m['forward_time_s']:.2f} ms, backward "
                     f"{1e3 * m['backward_time_s']:.2f} ms, activations "
                     f"{m['activation_bytes_per_rank'][0] / 1e9:.2f} GB per rank")
    racks = simsp("ring", "--system", "gb200-nvl72", "--ranks", "144", "--nodes", "2",
                  "--size", "1G")
    lines.append(f"two NVL72 racks, 144 ranks, 1 GiB all-reduce: {racks['busbw_GBps']:.1f} GB/s "
                 f"busbw ({racks['algorithm']}/{racks['protocol']})")
    return lines


if __name__ == "__main__":
    print("\n".join(ring_rows() + [""] + nvl72_rows() + [""] + run_rows()))
