"""`simsp hardware`: the GPU and system profiles, every number with its source.

    simsp hardware [PROFILE ...] [--json]

With no argument, every bundled profile (simsp/hardware/data); a name or a .toml path shows that
one. Each GPU also shows the compute model simsp times its kernels with: the rule's derivation
from the datasheet peak, the HBM bandwidth and the measured GEMM ceiling, or the fitted values
its [compute] section states (docs/hardware.md), and what times its GEMMs: a measured table by
shape where the profile names one, else that curve as the fallback (docs/gemm_shapes.md); and how
each fused --attention-backend's core is priced: the tiled kernel at its published figures, or the
GEMM pricing as the fallback (docs/attention_kernels.md).
"""

import os
from pathlib import Path

from simsp import io_in
from simsp.scenario.flags import nonempty
from simsp.hardware.attention_kernels import backend_pricing
from simsp.hardware.constants import NVLS_NVSWITCH_GENERATION, gpu_compute
from simsp.hardware.costmodel import calibration_table
from simsp.jsonout import dumps
from simsp.hardware.profile_file import DATA, SYSTEM_NUMBERS, available, load_profile
from simsp.hardware.profiles import gpu_profile, system_profile


def add_parser(subparsers) -> None:
    """Register `simsp hardware`."""
    parser = subparsers.add_parser("hardware", help="list GPU and system profiles with sources",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("profiles", nargs="*", type=nonempty, metavar="PROFILE",
                        help="profile names or .toml paths (default: every bundled one)")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.set_defaults(handler=run)


def _which(names: list[str]) -> list[tuple[str, str]]:
    """(kind, name) of each requested profile: a GPU if one loads by that name, else a system."""
    if not names:
        return [("gpu", n) for n in available("gpu")] + [("system", n) for n in available("system")]
    found = []
    for name in names:
        kind = "system" if name in available("system") else "gpu"
        if name.endswith(".toml"):
            kind = "system" if _is_system_file(name) else "gpu"
        found.append((kind, name))
    return found


def _is_system_file(path: str) -> bool:
    """A system profile names its GPU or its NVLink domain and NICs; else it is read as a GPU
    (so a broken system file's error speaks of the system's keys, not a GPU's)."""
    if not os.path.lexists(path):
        return False  # load_profile names the missing file
    data = io_in.read_toml(path, "profile")
    return "gpu" in data or any(key in data for key in SYSTEM_NUMBERS)


def _shown_path(path: str) -> str:
    """A bundled profile's path inside the package (the same on every machine), else as given."""
    try:
        return str(Path(path).relative_to(DATA.parent.parent))
    except ValueError:
        return path


def describe(kind: str, name: str) -> dict:
    """One profile as plain data: numbers with sources, and a GPU's compute models."""
    prof = load_profile(kind, name)
    entry = {"kind": kind, "name": prof.name, "description": prof.description,
             "file": _shown_path(prof.path),
             "numbers": {k: {"value": s.value, "source": s.source} for k, s in prof.numbers.items()}}
    if kind == "system":
        system = system_profile(name)  # its checks
        entry["gpu"] = prof.gpu
        entry["fabric"] = {k: {"value": s.value, "source": s.source}
                           for k, s in prof.sections.get("fabric", {}).items()}
        entry["fabric_sizes"] = _fabric_sizes(system)
        entry["in_network"] = _in_network(system)
        return entry
    gpu = gpu_profile(name)
    entry["model"] = _model(gpu, "bf16", "fitted [compute]" if gpu.fitted else "rule")
    hopper = gpu.peak_fp8_flops is not None
    entry["model"]["attention"] = {backend: backend_pricing(backend, gpu.attention, hopper)
                                   for backend in ("flash", "fused", "auto")}
    if gpu.peak_fp8_flops is not None and gpu.ceiling_fp8_flops is not None:
        entry["model"].update(_model(gpu, "fp8", "fitted [compute_fp8]" if gpu.fitted_fp8
                                     else "rule"))
    for section, body in prof.sections.items():
        entry[section] = {k: {"value": s.value, "source": s.source} for k, s in body.items()}
    return entry


def _model(gpu, dtype: str, curve: str) -> dict:
    """A GPU's compute model for one dtype: the curve's constants, where they come from, and what
    times its GEMMs (a measured shape table, or the curve as the fallback; docs/gemm_shapes.md)."""
    cal = gpu_compute(gpu, fp8=dtype == "fp8")
    if cal.gemm_table is not None:
        table = cal.gemm_table
        low, high = table.axes[0][0], table.axes[0][-1]
        gemms = (f"measured table {table.name} ({len(table.rates)} shapes, m, k, n {low}-{high}, "
                 f"clamped outside), wave-quantised over {table.sms} SMs")
    elif cal.gemm_sms:
        gemms = (f"{curve} (fallback: no measured {dtype} table), its FLOP term wave-quantised "
                 f"over {cal.gemm_sms} SMs")
    else:
        gemms = f"{curve} (fallback: no measured {dtype} table)"
    return {dtype: calibration_table(cal), f"{dtype}_from": curve, f"{dtype}_gemms": gemms}
def _fabric_sizes(system) -> list[dict]:
    """The fabric's tiers and switch counts at 1 to 64 scalable units (hardware/fabric.py)."""
    fabric, sizes = system.fabric, []
    for units in (1, 2, 4, 8, 16, 64):
        nodes = units * fabric.nodes_per_leaf
        tiers = "leaf/spine/core" if fabric.three_tier(nodes) else "leaf/spine"
        sizes.append({"units": units, "nodes": nodes,
                      "gpus": nodes * system.gpus_per_nvlink_domain, "tiers": tiers,
                      "switches": fabric.switch_counts(nodes, system.nics_per_node),
                      "oversubscription": fabric.oversubscription})
    return sizes


def _in_network(system) -> str:
    """Which of NCCL's in-network all-reduces the system can run (docs/nccl.md)."""
    nvls = system.nvswitch_generation >= NVLS_NVSWITCH_GENERATION
    sharp = system.fabric.sharp_generation
    words = ["NVLS in one node, NVLS_TREE across nodes" if nvls else "no NVLS (NVSwitch < 3)"]
    if sharp is None:
        return words[0] + "; no SHARP in the switches: --use-sharp refused"
    across = "CollNet Direct/Chain" + (" and NVLS" if nvls else "")
    return (f"{words[0]}; SHARPv{sharp} in the switches: {across} across nodes with "
            f"--use-sharp (NCCL_COLLNET_ENABLE=1 on the DP-CP groups)")


def _fabric_lines(entry: dict) -> list[str]:
    """A system's [fabric] numbers and its tiers and switches per size."""
    lines = [f"  fabric.{key} = {item['value']:<8}  [{item['source']}]"
             for key, item in entry.get("fabric", {}).items()]
    if "in_network" in entry:
        lines.append(f"  in-network reduction: {entry['in_network']}")
    for size in entry.get("fabric_sizes", []):
        switches = ", ".join(f"{count} {tier}" for tier, count in size["switches"].items()
                             if count)
        lines.append(f"  fabric at {size['units']} scalable unit(s) ({size['nodes']} nodes, "
                     f"{size['gpus']} GPUs): {size['tiers']}, "
                     f"{size['oversubscription']:g}:1" + (f"; {switches}" if switches else ""))
    return lines


def _lines(entry: dict) -> list[str]:
    lines = [f"## {entry['kind']} {entry['name']}: {entry['description']}", f"file: {entry['file']}"]
    if entry["kind"] == "system":
        lines.append(f"gpu: {entry['gpu']}")
    for key, item in entry["numbers"].items():
        lines.append(f"  {key} = {item['value']:<8}  [{item['source']}]")
    lines += _fabric_lines(entry)
    for section in ("compute", "compute_fp8", "attention"):
        if section in entry:
            for key, item in entry[section].items():
                lines.append(f"  {section}.{key} = {item['value']:<8}  [{item['source']}]")
    compute = entry.get("model", {})
    for dtype in ("bf16", "fp8"):
        if dtype in compute:
            cal = compute[dtype]
            lines.append(f"  model {dtype} ({compute[dtype + '_from']}): gemm_max_efficiency="
                         f"{cal['gemm_max_efficiency']:.4g} gemm_half_intensity="
                         f"{cal['gemm_half_intensity']:.4g} FLOP/B memory_efficiency="
                         f"{cal['memory_efficiency']:g} launch_overhead_s="
                         f"{cal['launch_overhead_s']:g}")
            lines.append(f"  GEMMs {dtype}: {compute[dtype + '_gemms']}")
    for backend, pricing in compute.get("attention", {}).items():
        lines.append(f"  attention --attention-backend {backend}: {pricing}")
    return lines


def _fabric_cells(entry: dict) -> str:
    """Nodes per leaf, the size above which a core tier is built, the oversubscription."""
    sizes = entry["fabric_sizes"]
    core = next((s for s in sizes if s["tiers"].endswith("core")), None)
    fabric = {k: v["value"] for k, v in entry["fabric"].items()}
    two_tier = fabric.get("two_tier_max_units")
    above = f"{two_tier * sizes[0]['nodes']} nodes" if core and two_tier else "never"
    return f"{sizes[0]['nodes']} | {above} | {sizes[0]['oversubscription']:g}:1"


def _summary(entries: list[dict]) -> list[str]:
    gpus = [e for e in entries if e["kind"] == "gpu"]
    systems = [e for e in entries if e["kind"] == "system"]
    lines = []
    if gpus:
        lines += ["| gpu | memory GiB | BF16 TFLOP/s | FP8 TFLOP/s | HBM TB/s | NVLink | "
                  "GB/s/dir | GEMM ceiling BF16 / FP8 |", "|---|---:|---:|---:|---:|---:|---:|---|"]
        for e in gpus:
            n = {k: v["value"] for k, v in e["numbers"].items()}
            lines.append(f"| {e['name']} | {n['memory_GiB']} | {n['peak_bf16_TFLOPs']} | "
                         f"{n.get('peak_fp8_TFLOPs', '—')} | {n['hbm_TBps']} | "
                         f"{n['nvlink_generation']} | {n['nvlink_GBps']} | "
                         f"{n['ceiling_bf16_TFLOPs']} / {n.get('ceiling_fp8_TFLOPs', '—')} |")
    if systems:
        lines += ["", "| system | gpu | GPUs per NVLink domain | NVSwitch | NICs per node | NIC | "
                      "nodes per leaf | core above | ratio |", "|---|---|---:|---:|---:|---|---:|---|---:|"]
        for e in systems:
            n = {k: v["value"] for k, v in e["numbers"].items()}
            lines.append(f"| {e['name']} | {e['gpu']} | {n['gpus_per_nvlink_domain']} | "
                         f"{n['nvswitch_generation']} | {n['nics_per_node']} | "
                         f"{n['nic']} {n['nic_Gbps']} Gb/s | {_fabric_cells(e)} |")
    return lines


def run(args) -> int:
    """Print the profiles (summary tables, then every number with its source) or JSON."""
    entries = [describe(kind, name) for kind, name in _which(args.profiles)]
    if args.json:
        print(dumps({"profiles": entries}))
        return 0
    lines = ["# simsp hardware profiles (every number: value [source])", ""] + _summary(entries)
    for entry in entries:
        lines += [""] + _lines(entry)
    print("\n".join(lines))
    return 0
