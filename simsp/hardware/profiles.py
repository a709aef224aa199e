"""GPU and system profiles as data: the TOML files of simsp/hardware/data (or a user's own).

Every number in a profile is an inline table `{ value = ..., source = "..." }`: the value and
where it comes from (a datasheet, a paper, a public measurement). A GPU file gives memory, dense
BF16/FP8 peaks, HBM and NVLink bandwidth and the measured large-GEMM ceilings; a system file gives
its GPU, the NVLink domain (simsp's node), the NVSwitch generation and the NICs. `--gpu NAME` or
`--gpu PATH.toml` (and `--system`) select one; `simsp hardware` lists them with their sources.
"""

from dataclasses import dataclass, field as dc_field
from functools import lru_cache
from pathlib import Path
import tomllib

from simsp import io_in
from simsp.errors import UserError
from simsp.hardware.gemm_shapes import available_tables
from simsp.hardware.fabric import (DEFAULT, FABRIC_KEYS, FABRIC_LIMITS, Fabric,
                                   with_oversubscription)
from simsp.units import GiB

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
# without a system: the DGX that pairs with the GPU's NVLink (DGX A100: AMD EPYC 7742; DGX H100
# and DGX B200: Intel Xeon Platinum 8480C / 8570, the DGX user guides)
CPU_BY_NVLINK = {3: "amd", 4: "intel", 5: "intel"}
COMPUTE_KEYS = ("gemm_max_efficiency", "gemm_half_intensity", "memory_efficiency",
                "launch_overhead_s")
# [attention]: the SMs and the fused attention kernels' published TFLOP/s at the benchmarks'
# shape (simsp/hardware/attention_kernels.py; docs/attention_kernels.md)
ATTENTION_KEYS = ("sm_count", "fa2_fwd_TFLOPs", "fa2_bwd_TFLOPs", "fa3_fwd_TFLOPs",
                  "fa3_bwd_TFLOPs", "cudnn_fwd_TFLOPs", "cudnn_bwd_TFLOPs",
                  "cudnn_fp8_fwd_TFLOPs")
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


@dataclass(frozen=True)
class GPUProfile:
    """The GPU numbers the simulator uses, in SI units."""

    name: str
    memory_bytes: int
    peak_flops: float  # dense BF16 tensor-core FLOP/s
    peak_fp8_flops: float | None  # dense FP8 FLOP/s; None: no FP8 tensor cores
    hbm_bandwidth_Bps: float
    nvlink_generation: int
    nvlink_GBps: float  # per GPU per direction
    ceiling_flops: float  # best measured large BF16 GEMM FLOP/s
    ceiling_fp8_flops: float | None
    fitted: dict  # [compute] section values (fitted or calibrated), may be empty
    fitted_fp8: dict  # [compute_fp8]
    host_link_GBps: float | None = None  # PCIe (NVLink-C2C on GB200) to the host, per direction
    cuda_context: Sourced | None = None  # MiB the CUDA context and kernel images take
    cublas_workspace: Sourced | None = None  # MiB of cuBLAS + cuBLASLt workspace per stream
    attention: dict = dc_field(default_factory=dict)  # [attention] values: SMs, kernels' TFLOP/s
    gemm_table: str | None = None  # measured GEMM rates by shape: data/gemm/<name>.csv
    launch: dict = dc_field(default_factory=dict)  # LAUNCH_KEYS stated, in us (hardware/launch.py)


@dataclass(frozen=True)
class SystemProfile:
    """One system: its GPU, NVLink domain size, NVSwitch generation and NICs."""

    name: str
    gpu: str
    gpus_per_nvlink_domain: int
    nvswitch_generation: int
    nics_per_node: int
    nic: str
    nic_Gbps: float
    fabric: Fabric = DEFAULT  # the scale-out fabric ([fabric]; hardware/fabric.py)

    @property
    def ib_bandwidth_GBps(self) -> float:
        """One NIC's speed in GB/s per direction (Gb/s / 8)."""
        return self.nic_Gbps / 8


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


@lru_cache(maxsize=64)
def gpu_profile(name: str) -> GPUProfile:
    """The GPU profile `name` (bundled name, alias or path) in SI units."""
    prof = load_profile("gpu", name)
    fp8, ceiling_fp8 = prof.value("peak_fp8_TFLOPs"), prof.value("ceiling_fp8_TFLOPs")
    gpu = GPUProfile(
        name=prof.name, memory_bytes=int(prof.value("memory_GiB") * GiB),
        peak_flops=prof.value("peak_bf16_TFLOPs") * 1e12,
        peak_fp8_flops=None if fp8 is None else fp8 * 1e12,
        hbm_bandwidth_Bps=prof.value("hbm_TBps") * 1e12,
        nvlink_generation=int(prof.value("nvlink_generation")),
        nvlink_GBps=float(prof.value("nvlink_GBps")),
        ceiling_flops=prof.value("ceiling_bf16_TFLOPs") * 1e12,
        ceiling_fp8_flops=None if ceiling_fp8 is None else ceiling_fp8 * 1e12,
        fitted={k: s.value for k, s in prof.sections.get("compute", {}).items()},
        fitted_fp8={k: s.value for k, s in prof.sections.get("compute_fp8", {}).items()},
        host_link_GBps=prof.value("host_link_GBps"),
        cuda_context=prof.numbers.get("cuda_context_MiB"),
        cublas_workspace=prof.numbers.get("cublas_workspace_MiB"),
        attention={k: s.value for k, s in prof.sections.get("attention", {}).items()},
        gemm_table=prof.value("gemm_table"),
        launch={key: prof.value(key) for key in LAUNCH_KEYS if key in prof.numbers})
    _check_consistent(prof.path, gpu)
    return gpu


def _check_consistent(path: str, gpu: GPUProfile) -> None:
    """A GPU's numbers agree with each other: a measured GEMM ceiling at most the datasheet's
    peak, FP8 numbers only on a GPU with FP8 tensor cores (both or neither), and an FP8 peak
    between 1 and 4 times the BF16 one (2x on Hopper and Blackwell datasheets)."""
    def refuse(key: str, reason: str):
        raise UserError("cluster.gpu", f"{path}:{key}: {reason}")
    if gpu.ceiling_flops > gpu.peak_flops:
        refuse("ceiling_bf16_TFLOPs", f"{gpu.ceiling_flops / 1e12:g} exceeds the peak "
                                      f"peak_bf16_TFLOPs {gpu.peak_flops / 1e12:g}")
    if (gpu.peak_fp8_flops is None) != (gpu.ceiling_fp8_flops is None):
        refuse("ceiling_fp8_TFLOPs", "give peak_fp8_TFLOPs and ceiling_fp8_TFLOPs together (a "
                                     "GPU with FP8 tensor cores has both, one without neither)")
    _check_attention(refuse, gpu.attention)
    if gpu.gemm_table and "sm_count" not in gpu.attention:
        refuse("gemm_table", "a GEMM table needs the GPU's SMs ([attention] sm_count) for its "
                             "wave quantisation")
    if gpu.peak_fp8_flops is None:
        return
    if not gpu.peak_flops <= gpu.peak_fp8_flops <= 4 * gpu.peak_flops:
        refuse("peak_fp8_TFLOPs", f"{gpu.peak_fp8_flops / 1e12:g} is not between 1 and 4 times "
                                  f"peak_bf16_TFLOPs {gpu.peak_flops / 1e12:g}")
    if gpu.ceiling_fp8_flops > gpu.peak_fp8_flops:
        refuse("ceiling_fp8_TFLOPs", f"{gpu.ceiling_fp8_flops / 1e12:g} exceeds the peak "
                                     f"peak_fp8_TFLOPs {gpu.peak_fp8_flops / 1e12:g}")


def _check_attention(refuse, attention: dict) -> None:
    """An [attention] section names its SMs and gives each kernel's forward and backward
    figures together."""
    if attention and "sm_count" not in attention:
        refuse("attention.sm_count", "an [attention] section gives the GPU's SMs")
    given = [key for key in ATTENTION_REFERENCE_KEYS if key in attention]
    if given and len(given) < len(ATTENTION_REFERENCE_KEYS):
        missing = next(key for key in ATTENTION_REFERENCE_KEYS if key not in attention)
        refuse(f"attention.{missing}", "a reference shape gives all of "
                                       + ", ".join(ATTENTION_REFERENCE_KEYS))
    for kernel in ("fa2", "fa3", "cudnn"):
        if (f"{kernel}_fwd_TFLOPs" in attention) != (f"{kernel}_bwd_TFLOPs" in attention):
            refuse(f"attention.{kernel}_bwd_TFLOPs", f"give {kernel}_fwd_TFLOPs and "
                                                     f"{kernel}_bwd_TFLOPs together")


@lru_cache(maxsize=64)
def system_profile(name: str) -> SystemProfile:
    """The system profile `name` (bundled name or path)."""
    prof = load_profile("system", name)
    nic = str(prof.value("nic"))
    system = SystemProfile(prof.name, prof.gpu, int(prof.value("gpus_per_nvlink_domain")),
                           int(prof.value("nvswitch_generation")),
                           int(prof.value("nics_per_node")), nic, float(prof.value("nic_Gbps")),
                           _fabric(prof.sections.get("fabric", {})))
    if system.nics_per_node != system.gpus_per_nvlink_domain:
        raise UserError("cluster.system", f"{prof.path}: simsp's fabric has one NIC per GPU "
                                          f"(rails): nics_per_node {system.nics_per_node} != "
                                          f"gpus_per_nvlink_domain {system.gpus_per_nvlink_domain}")
    gpu_profile(system.gpu)  # the GPU it names must load
    return system


def _fabric(section: dict) -> Fabric:
    """A system's [fabric] table as a Fabric (what it leaves out: DEFAULT's)."""
    values = {key: entry.value for key, entry in section.items()}
    for ratio in ("oversubscription", "core_oversubscription"):
        if ratio in values:
            values[ratio] = float(values[ratio])
    sources = tuple((key, entry.source) for key, entry in section.items())
    if ("two_tier_max_units" in values) != ("units_per_pod" in values):
        raise UserError("cluster.system", "[fabric]: give two_tier_max_units and units_per_pod "
                                          "together (a core tier's pods need both)")
    return Fabric(**{**{k: getattr(DEFAULT, k) for k in FABRIC_KEYS}, **values}, sources=sources)


def fabric_of(cluster) -> Fabric:
    """The fabric of a cluster: its system's (DEFAULT without one), with the scenario's
    cluster.fabric_oversubscription override."""
    fabric = system_profile(cluster.system).fabric if cluster.system else DEFAULT
    return with_oversubscription(fabric, getattr(cluster, "fabric_oversubscription", None))


def system_cluster_fields(name: str) -> dict:
    """The [cluster] values a system implies: its GPU, NVLink domain, NVLink and NIC speeds."""
    system = system_profile(name)
    return {"gpu": system.gpu, "gpus_per_node": system.gpus_per_nvlink_domain,
            "nvlink_bandwidth_GBps": gpu_profile(system.gpu).nvlink_GBps,
            "ib_bandwidth_GBps": system.ib_bandwidth_GBps}


def gpu_cluster_fields(name: str) -> dict:
    """The [cluster] values a GPU implies: its NVLink speed per direction."""
    return {"nvlink_bandwidth_GBps": gpu_profile(name).nvlink_GBps}


def cpu_vendor(cluster) -> str:
    """The host CPU vendor of a cluster: its system's, else the DGX's that pairs with its GPU."""
    if cluster.system:
        stated = load_profile("system", cluster.system).value("cpu_vendor")
        if stated:
            return str(stated)
    return CPU_BY_NVLINK.get(gpu_profile(cluster.gpu).nvlink_generation, "intel")


def nvswitch_generation(cluster) -> int:
    """The NVSwitch generation of a cluster: its system's, else the one that pairs with its GPU's
    NVLink (NVLink 3 -> NVSwitch 2 in DGX A100, 4 -> 3 in DGX H100, 5 -> 4 in DGX B200)."""
    if cluster.system:
        return system_profile(cluster.system).nvswitch_generation
    return gpu_profile(cluster.gpu).nvlink_generation - 1
