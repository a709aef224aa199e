"""GPU and system profiles as data: the TOML files of simsp/hardware/data (or a user's own).

Every number in a profile is an inline table `{ value = ..., source = "..." }`: the value and
where it comes from (a datasheet, a paper, a public measurement). A GPU file gives memory, dense
BF16/FP8 peaks, HBM and NVLink bandwidth and the measured large-GEMM ceilings; a system file gives
its GPU, the NVLink domain (simsp's node), the NVSwitch generation and the NICs. `--gpu NAME` or
`--gpu PATH.toml` (and `--system`) select one; `simsp hardware` lists them with their sources.
A file is read and checked by profile_file.py; what a cluster takes from its profiles is
cluster_hardware.py.
"""

from dataclasses import dataclass, field as dc_field
from functools import lru_cache

from simsp.errors import UserError
from simsp.hardware.fabric import DEFAULT, FABRIC_KEYS, Fabric
from simsp.hardware.profile_file import (ATTENTION_REFERENCE_KEYS, LAUNCH_KEYS, Sourced,
                                         load_profile)
from simsp.units import GiB


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
