"""A GPU or system profile file read and checked: the TOML files of simsp/hardware/data (or a
user's own), every key known, every number an inline table `{ value = ..., source = "..." }`,
positive, finite and within physical limits."""

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
import tomllib

from simsp import io_in
from simsp.errors import UserError
from simsp.hardware.fabric import FABRIC_KEYS, FABRIC_LIMITS
from simsp.hardware.gemm_shapes import available_tables

DATA = Path(__file__).parent / "data"
KINDS = {"gpu": "gpus", "system": "systems"}
NIC_GBPS = {"HDR": 200, "NDR": 400, "XDR": 800}  # InfiniBand generations, Gb/s per port
GPU_NUMBERS = ("memory_GiB", "peak_bf16_TFLOPs", "hbm_TBps", "nvlink_generation", "nvlink_GBps",
               "ceiling_bf16_TFLOPs")
GPU_OPTIONAL = ("peak_fp8_TFLOPs", "ceiling_fp8_TFLOPs", "host_link_GBps", "cuda_context_MiB",
                "cublas_workspace_MiB", "gemm_table", "launch_overhead_us", "graph_node_us",
                "graph_launch_us")
LAUNCH_KEYS = ("launch_overhead_us", "graph_node_us", "graph_launch_us")  # hardware/launch.py
SYSTEM_NUMBERS = ("gpus_per_nvlink_domain", "nvswitch_generation", "nics_per_node", "nic",
                  "nic_Gbps")
SYSTEM_OPTIONAL = ("cpu_vendor",)  # the host CPU NCCL tunes for (engine/collectives/nccl_platform)
CPU_VENDORS = ("amd", "intel", "arm")
COMPUTE_KEYS = ("gemm_max_efficiency", "gemm_half_intensity", "memory_efficiency",
                "launch_overhead_s")
# [attention]: the SMs and the fused attention kernels' published TFLOP/s at the benchmarks'
# shape (simsp/hardware/attention_kernels.py; docs/attention_kernels.md)
ATTENTION_KEYS = ("sm_count", "fa2_fwd_TFLOPs", "fa2_bwd_TFLOPs", "fa3_fwd_TFLOPs",
                  "fa3_bwd_TFLOPs", "cudnn_fwd_TFLOPs", "cudnn_bwd_TFLOPs",
                  "cudnn_fp8_fwd_TFLOPs", "int32_TOPS")  # int32: FlashAttention-2's dropout mask
# the shape a profile's figures were measured at, when not the FA3 paper's (no mask; all five)
ATTENTION_REFERENCE_KEYS = ("reference_batch", "reference_heads", "reference_kv_heads",
                            "reference_seq", "reference_head_dim")
SECTION_KEYS = {"compute": COMPUTE_KEYS, "compute_fp8": COMPUTE_KEYS,
                "attention": ATTENTION_KEYS + ATTENTION_REFERENCE_KEYS,
                "fabric": FABRIC_KEYS}  # [fabric]: a system's only (hardware/fabric.py)
SYSTEM_SECTIONS = ("fabric",)


@dataclass(frozen=True)
class Sourced:
    """One number of a profile and where it comes from."""

    value: float | int | str
    source: str


@dataclass(frozen=True)
class Profile:
    """A parsed profile: its name, description, file, numbers with sources, sub-tables."""

    kind: str  # "gpu" | "system"
    name: str
    description: str
    path: str
    numbers: dict  # key -> Sourced
    sections: dict  # "compute" / "compute_fp8" / "attention" -> {key: Sourced}
    gpu: str | None = None  # a system's GPU profile
    aliases: tuple = ()

    def value(self, key: str, default=None):
        """The value of `key` (default when the profile leaves it out)."""
        return self.numbers[key].value if key in self.numbers else default


def available(kind: str) -> list[str]:
    """The bundled profile names of `kind`, sorted."""
    return sorted(p.stem for p in (DATA / KINDS[kind]).glob("*.toml"))


def _resolve_path(kind: str, name: str) -> Path:
    """A bundled name (or alias) or a path to a .toml file."""
    if name.endswith(".toml") or "/" in name:
        return Path(name)
    for stem in available(kind):
        if stem == name or name in _aliases(kind, stem):
            return DATA / KINDS[kind] / f"{stem}.toml"
    raise UserError(f"cluster.{kind}", f"unknown {kind} {name!r} (bundled: "
                                       f"{', '.join(available(kind))}; or a path to a .toml file)")


@lru_cache(maxsize=None)
def _aliases(kind: str, stem: str) -> tuple:
    with open(DATA / KINDS[kind] / f"{stem}.toml", "rb") as handle:
        return tuple(tomllib.load(handle).get("aliases", ()))


# key -> (integer?, most allowed): every number is positive; these ceilings are far above any
# real part (a 16 TiB GPU, an exaFLOP/s chip, NVLink generation 100) and keep the arithmetic
# finite; a fraction (an efficiency) is at most 1
LIMITS = {"memory_GiB": (False, 16384), "peak_bf16_TFLOPs": (False, 1e6),
          "peak_fp8_TFLOPs": (False, 1e6), "ceiling_bf16_TFLOPs": (False, 1e6),
          "ceiling_fp8_TFLOPs": (False, 1e6), "hbm_TBps": (False, 1000),
          "nvlink_generation": (True, 100), "nvlink_GBps": (False, 1e5),
          "host_link_GBps": (False, 1e5), "cuda_context_MiB": (False, 65536),
          "cublas_workspace_MiB": (False, 65536), "gpus_per_nvlink_domain": (True, 4096),
          "nvswitch_generation": (True, 100), "nics_per_node": (True, 4096),
          "nic_Gbps": (False, 1e6), "gemm_max_efficiency": (False, 1),
          "memory_efficiency": (False, 1), "gemm_half_intensity": (False, 1e6),
          "launch_overhead_s": (False, 1), "sm_count": (True, 4096),
          **{key: (False, 1000) for key in LAUNCH_KEYS},
          **{key: (False, 1e6) for key in ATTENTION_KEYS[1:]},
          **{key: (True, 1 << 20) for key in ATTENTION_REFERENCE_KEYS},
          **{key: limit[:2] for key, limit in FABRIC_LIMITS.items()}}
# the least each number can physically be, with the reason (a profile below it is a typo or a
# wrong unit: 1e-300 TFLOP/s would make every MFU astronomical)
LOWEST = {"memory_GiB": (1, "no training GPU has under 1 GiB"),
          "peak_bf16_TFLOPs": (1, "a V100 already does 125 (FP16)"),
          "peak_fp8_TFLOPs": (1, "FP8 tensor cores start at Hopper's 1979"),
          "ceiling_bf16_TFLOPs": (0.1, "a measured GEMM ceiling in TFLOP/s"),
          "ceiling_fp8_TFLOPs": (0.1, "a measured GEMM ceiling in TFLOP/s"),
          "hbm_TBps": (0.05, "HBM/GDDR memory runs at 0.5 TB/s and up"),
          "nvlink_GBps": (1, "an NVLink port alone carries 25 GB/s"),
          "host_link_GBps": (1, "PCIe Gen3 x16 carries 16 GB/s"),
          "nic_Gbps": (1, "InfiniBand HDR is 200 Gb/s"),
          "gemm_max_efficiency": (0.01, "a fraction of peak a GEMM reaches"),
          "memory_efficiency": (0.01, "a fraction of HBM bandwidth a kernel reaches"),
          "gemm_half_intensity": (1e-3, "FLOPs per byte; GEMMs sit at 10 to 1000"),
          "launch_overhead_s": (1e-8, "a kernel launch takes microseconds, not nanoseconds"),
          "sm_count": (1, "a GPU has at least one streaming multiprocessor"),
          **{key: (0.01, "a launch takes microseconds") for key in LAUNCH_KEYS},
          **{key: (1, "an attention kernel's TFLOP/s") for key in ATTENTION_KEYS[1:]},
          "int32_TOPS": (1, "a GPU's 32-bit integer units do at least 1 TOPS"),
          **{key: (limit[2], "a fabric's counts and ratio (1:1 is non-blocking)")
             for key, limit in FABRIC_LIMITS.items()}}
TEXT_KEYS = {"name", "description", "gpu"}  # plain strings (a system's gpu: a name or path)


@lru_cache(maxsize=64)
def load_profile(kind: str, name: str) -> Profile:
    """Read and check one profile (simsp/io_in.py: size-capped, a regular UTF-8 file): every
    key known, every number positive, finite and in LIMITS, with a source."""
    path = _resolve_path(kind, name)
    field = f"cluster.{kind}"
    if not path.exists() and not path.is_symlink():
        raise UserError(field, f"file not found: {path}")
    data = io_in.read_toml(path, "profile")
    required = GPU_NUMBERS if kind == "gpu" else SYSTEM_NUMBERS
    optional = GPU_OPTIONAL if kind == "gpu" else SYSTEM_OPTIONAL
    _check_keys(field, path, data, required + optional, kind)
    numbers = {key: _sourced(field, path, key, data[key]) for key in required + optional
               if key in data}
    missing = [key for key in required if key not in numbers]
    if missing:
        raise UserError(field, f"{path}: missing {', '.join(missing)}")
    sections = {section: _section(field, path, section, data[section])
                for section in SECTION_KEYS if section in data
                and (section in SYSTEM_SECTIONS) == (kind == "system")}
    if kind == "system" and not isinstance(data.get("gpu"), str):
        raise UserError(field, f"{path}: a system names its gpu (gpu = \"h100-sxm-80gb\")")
    return Profile(kind, str(data.get("name", path.stem)), str(data.get("description", "")),
                   str(path), numbers, sections, data.get("gpu"), tuple(data.get("aliases", ())))


def _check_keys(field: str, path: Path, data: dict, numbers: tuple, kind: str) -> None:
    """Only known keys; names and descriptions one line of text; aliases a list of names."""
    known = set(numbers) | TEXT_KEYS | {"aliases"} | (set(SYSTEM_SECTIONS) if kind == "system"
                                                    else set(SECTION_KEYS) - {"fabric"})
    for key, value in data.items():
        if key not in known:
            raise UserError(field, f"{path}:{key}: unknown key (known: {', '.join(sorted(known))})")
        if key in TEXT_KEYS and not (isinstance(value, str) and value.isprintable()):
            raise UserError(field, f"{path}:{key}: must be one line of text, got {value!r}")
    aliases = data.get("aliases", [])
    if not (isinstance(aliases, list) and all(isinstance(a, str) and a.isprintable() and a
                                              for a in aliases)):
        raise UserError(field, f"{path}:aliases: must be a list of names, got {aliases!r}")


def _section(field: str, path: Path, section: str, body) -> dict:
    """A [compute] / [compute_fp8] / [attention] table: known keys, each a sourced number."""
    if not isinstance(body, dict):
        raise UserError(field, f"{path}:{section}: must be a table ([{section}]), got {body!r}")
    unknown = set(body) - set(SECTION_KEYS[section])
    if unknown:
        raise UserError(field, f"{path}:{section}.{sorted(unknown)[0]}: unknown key "
                               f"(known: {', '.join(SECTION_KEYS[section])})")
    return {k: _sourced(field, path, f"{section}.{k}", v) for k, v in body.items()}


def _sourced(field: str, path: Path, key: str, entry) -> Sourced:
    """`{ value = ..., source = "..." }`, checked: text only where the key is text (nic), else a
    number, positive, finite and within LIMITS (an integer where the key counts things)."""
    if not (isinstance(entry, dict) and "value" in entry and isinstance(entry.get("source"), str)
            and entry["source"].strip()):
        raise UserError(field, f"{path}:{key}: must be {{ value = ..., source = \"...\" }} "
                               f"(every number names its source)")
    value = entry["value"]
    if key == "nic":
        if value not in NIC_GBPS:
            raise UserError(field, f"{path}:nic: must be one of {', '.join(NIC_GBPS)}, "
                                   f"got {value!r}")
        return Sourced(value, entry["source"])
    if key == "cpu_vendor":
        if value not in CPU_VENDORS:
            raise UserError(field, f"{path}:cpu_vendor: must be one of {', '.join(CPU_VENDORS)}, "
                                   f"got {value!r}")
        return Sourced(value, entry["source"])
    if key == "gemm_table":
        if value not in available_tables():
            raise UserError(field, f"{path}:gemm_table: must name a bundled GEMM table "
                                   f"({', '.join(available_tables())}), got {value!r}")
        return Sourced(value, entry["source"])
    integer, high = LIMITS[key.split(".")[-1]]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(field, f"{path}:{key}: value must be a number, got {value!r}")
    if not 0 < value <= high:  # nan and inf fail here too
        raise UserError(field, f"{path}:{key}: value must be positive and at most {high:g}, "
                               f"got {value!r}")
    if integer and value != int(value):
        raise UserError(field, f"{path}:{key}: value must be a whole number, got {value!r}")
    low, why = LOWEST.get(key.split(".")[-1], (0, ""))
    if value < low:
        raise UserError(field, f"{path}:{key}: value must be at least {low:g} ({why}), "
                               f"got {value!r}")
    return Sourced(int(value) if integer else value, entry["source"])
