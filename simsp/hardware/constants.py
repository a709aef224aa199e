"""Hardware specs and every calibration constant, in one place (docs/MODEL.md#hardware).

Sections: GPU specs; link calibration (what fraction of a link's speed NCCL rings achieve);
the compute cost model's constants; the compute rule that derives them for any GPU profile
(simsp/hardware/data, read by simsp/hardware/profile_file.py; docs/hardware.md).
"""

from dataclasses import dataclass, replace
from functools import lru_cache

from simsp.errors import UserError
from simsp.scenario.config import Cluster
from simsp.hardware.gemm_shapes import load_table
from simsp.hardware.cluster_hardware import cpu_vendor, fabric_of, nvswitch_generation
from simsp.hardware.profile_file import available
from simsp.hardware.profiles import GPUProfile, gpu_profile
from simsp.units import GiB


# ---------------------------------------------------------------------------------------------
# GPUs
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GPUSpec:
    """One accelerator: memory capacity, dense 16-bit tensor-core peak and HBM bandwidth."""

    name: str
    memory_bytes: int
    peak_flops: float  # dense fp16/bf16 tensor-core FLOP/s
    hbm_bandwidth_Bps: float  # bytes/s


A100_SXM4_80GB = GPUSpec(
    name="A100-SXM4-80GB",
    memory_bytes=80 * GiB,  # 80 GiB HBM2e (NVIDIA A100 datasheet)
    peak_flops=312e12,  # 312 TFLOP/s dense fp16/bf16 (NVIDIA A100 datasheet)
    hbm_bandwidth_Bps=2.0e12,  # ~2.0 TB/s (NVIDIA A100 datasheet)
)

class _GPUProfiles(dict):
    """`GPUS[name]`: the GPU profile of a bundled name, an alias or a .toml path
    (simsp/hardware/profiles.py); an entry set here (a test's patch) takes its place."""

    def __missing__(self, name: str):
        return gpu_profile(name)

    def items(self) -> list:
        """(name, profile) of every bundled GPU and every entry set here (the sweep cache's
        constants digest)."""
        bundled = {name: gpu_profile(name) for name in available("gpu")}
        return sorted({**bundled, **dict(dict.items(self))}.items())


GPUS = _GPUProfiles()


# ---------------------------------------------------------------------------------------------
# Links
# ---------------------------------------------------------------------------------------------

# DGX SuperPOD scalable unit: the leaf switch of each rail serves 20 nodes (NVIDIA DGX SuperPOD
# reference architecture, DGX A100: 20 nodes per scalable unit; cluster/topology.py builds it).
NODES_PER_LEAF = 20
NVLS_NVSWITCH_GENERATION = 3  # NVLink SHARP is in the third-generation NVSwitch and later


@dataclass(frozen=True)
class LinkCalibration:
    """Achieved fractions of the configured link speeds, and extra software latency.

    The network divides each link's configured bandwidth among the flows crossing it after
    scaling it by the efficiency of its kind, so a ring's busbw lands at link speed x efficiency.
    """

    # The defaults are the scenario's [cluster] defaults (simsp/scenario/table/cluster.py, where their
    # sources are stated): one place, so `--help` and the engine agree.
    nvlink_efficiency: float = Cluster.nvlink_efficiency
    ib_efficiency: float = Cluster.ib_efficiency
    transfer_overhead_s: float = Cluster.transfer_overhead_us * 1e-6
    # NCCL_ALGO / NCCL_PROTO forcing every collective (None: NCCL's own choice,
    # simsp/engine/collectives/nccl_tuning.py); carried here so every timing path sees them
    nccl_algo: str | None = None
    nccl_proto: str | None = None
    # The GPU's NVLink generation where its system's NVSwitch (3 or later) can run NCCL's NVLS
    # all-reduce in one NVLink domain (simsp/engine/collectives/nvls.py); 0 where it cannot (DGX A100)
    nvls_nvlink_generation: int = 0
    # NCCL_COLLNET_ENABLE over switches with SHARP (Megatron's --use-sharp; the system's
    # [fabric] sharp_generation): multi-node all-reduces weigh CollNet and NVLS_TREE
    # (simsp/engine/collectives/collnet.py)
    sharp_collnet: bool = False
    # the platform NCCL tunes for (engine/collectives/nccl_platform.py): the GPU's NVLink
    # generation (3 Ampere, 4 Hopper, 5 Blackwell) and the host CPU vendor; DGX A100's default
    nccl_platform: tuple = (3, "amd")

    @classmethod
    def from_cluster(cls, cluster) -> "LinkCalibration":
        """The link calibration a scenario's [cluster] section states (defaults: the above)."""
        forced = {name: None if getattr(cluster, name, "auto") == "auto" else getattr(cluster, name)
                  for name in ("nccl_algo", "nccl_proto")}
        nvls = (gpu_profile(cluster.gpu).nvlink_generation
                if nvswitch_generation(cluster) >= NVLS_NVSWITCH_GENERATION else 0)
        return cls(cluster.nvlink_efficiency, cluster.ib_efficiency,
                   cluster.transfer_overhead_us * 1e-6, **forced, nvls_nvlink_generation=nvls,
                   sharp_collnet=_sharp_collnet(cluster),
                   nccl_platform=(gpu_profile(cluster.gpu).nvlink_generation,
                                  cpu_vendor(cluster)))

    def efficiency(self, kind: str) -> float:
        """Achieved fraction of bandwidth for a link of `kind` ("nvlink" or "ib")."""
        fractions = {"nvlink": self.nvlink_efficiency, "ib": self.ib_efficiency}
        if kind not in fractions:
            raise ValueError(f"unknown link kind {kind!r} (known: {', '.join(fractions)})")
        return fractions[kind]

    def describe(self) -> str:
        """One line stating the constants, printed with every result that depends on them."""
        return (f"nvlink_efficiency={self.nvlink_efficiency:g} ib_efficiency={self.ib_efficiency:g}"
                f" transfer_overhead_s={self.transfer_overhead_s:g}")


def _sharp_collnet(cluster) -> bool:
    """Megatron's --use-sharp (cluster.use_sharp) where the system's switches have SHARP
    (hardware/fabric.py sharp_generation; scenario/checks/hardware.py refuses it elsewhere)."""
    return (bool(getattr(cluster, "use_sharp", False))
            and fabric_of(cluster).sharp_generation is not None)


# ---------------------------------------------------------------------------------------------
# Compute (kernel FLOPs and bytes -> seconds; the formulas are in simsp/hardware/costmodel.py)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ComputeCalibration:
    """Achieved fractions of an A100's tensor-core peak and HBM bandwidth, and the launch cost.

    A GEMM runs at gemm_max_efficiency x I / (I + gemm_half_intensity) of peak, I being its
    arithmetic intensity in FLOPs per byte of operands (roofline: low-intensity GEMMs such as the
    attention batched GEMMs with inner size d = h/a are partly bandwidth-bound); memory-bound
    kernels stream their bytes at memory_efficiency x HBM bandwidth; every kernel adds
    launch_overhead_s. Fitted by benchmarks/calibrate_table4.py: least squares of the relative
    errors of the ten K22 Table 4 times (22B layer, t = 8, five configurations) over
    gemm_max_efficiency <= 1 and memory_efficiency <= 0.9 (streaming kernels reach ~1.8 TB/s);
    the launch overhead is set, not fitted (the ten times cannot separate it from bandwidth).
    """

    peak_flops: float = A100_SXM4_80GB.peak_flops  # 312 TFLOP/s dense fp16/bf16
    hbm_bandwidth_Bps: float = A100_SXM4_80GB.hbm_bandwidth_Bps  # 2.0 TB/s
    # Fitted (rms error 1.15%, worst 2.2%; memory_efficiency ends at its bound).
    # Resulting GEMM efficiencies: 22B projections (I = 630-1640 FLOP/B) 61-78% of peak,
    # attention batched GEMMs (d = 96, I = 88) 19%.
    gemm_max_efficiency: float = 0.9345  # the curve's asymptote, never reached by a finite GEMM
    gemm_half_intensity: float = 335.6  # FLOP/B at which a GEMM gets half of the maximum
    memory_efficiency: float = 0.9  # 1.8 TB/s for memory-bound kernels
    launch_overhead_s: float = 2e-6  # set: gap between back-to-back kernels on a busy stream
    # GEMMs by shape (simsp/hardware/gemm_shapes.py, docs/gemm_shapes.md): a measured table
    # (GemmTable) replacing the curve above where the GPU's profile names one; else, with the
    # GPU's SMs, the curve's FLOP term wave-quantised (0: not, as the A100 fit)
    gemm_table: object = None
    gemm_sms: int = 0

    def describe(self) -> str:
        """One line stating the constants, printed with every result that depends on them."""
        return (f"gemm_max_efficiency={self.gemm_max_efficiency:g} "
                f"gemm_half_intensity={self.gemm_half_intensity:g} "
                f"memory_efficiency={self.memory_efficiency:g} "
                f"launch_overhead_s={self.launch_overhead_s:g}")


A100_COMPUTE = ComputeCalibration()


# ---------------------------------------------------------------------------------------------
# The compute rule: any GPU's compute model from its datasheet and one measured ceiling
# ---------------------------------------------------------------------------------------------

RULE_MEMORY_EFFICIENCY = 0.9  # streaming kernels reach ~90% of HBM bandwidth (the A100 fit's bound)
RULE_LAUNCH_OVERHEAD_S = 2e-6  # as A100_COMPUTE: a kernel's gap on a busy stream


def rule_calibration(peak_flops: float, ceiling_flops: float, hbm_bandwidth_Bps: float,
                     memory_efficiency: float = RULE_MEMORY_EFFICIENCY) -> ComputeCalibration:
    """The rule (docs/hardware.md): a GEMM takes its FLOPs at the measured ceiling C plus its
    operand bytes at the memory-bound rate B_eff = memory_efficiency x HBM bandwidth, one after
    the other: t = F/C + bytes/B_eff. With F/bytes = I this is peak x E_max I / (I + I_half),
    E_max = C / peak and I_half = C / B_eff: the curve ComputeCalibration states."""
    memory_Bps = memory_efficiency * hbm_bandwidth_Bps
    return ComputeCalibration(peak_flops=peak_flops, hbm_bandwidth_Bps=hbm_bandwidth_Bps,
                              gemm_max_efficiency=ceiling_flops / peak_flops,
                              gemm_half_intensity=ceiling_flops / memory_Bps,
                              memory_efficiency=memory_efficiency,
                              launch_overhead_s=RULE_LAUNCH_OVERHEAD_S)


def gpu_compute(gpu: GPUProfile, fp8: bool = False) -> ComputeCalibration:
    """A GPU's compute model: the rule from its profile, with any [compute] (or [compute_fp8])
    values the profile states (fitted or `simsp calibrate gemm`) taking their place."""
    peak = gpu.peak_fp8_flops if fp8 else gpu.peak_flops
    ceiling = gpu.ceiling_fp8_flops if fp8 else gpu.ceiling_flops
    if peak is None or ceiling is None:
        raise ValueError(f"{gpu.name} has no FP8 tensor cores (no peak_fp8_TFLOPs)")
    derived = rule_calibration(peak, ceiling, gpu.hbm_bandwidth_Bps)
    if "launch_overhead_us" in gpu.launch:  # the profile's sourced figure (docs/launch.md)
        derived = replace(derived, launch_overhead_s=gpu.launch["launch_overhead_us"] * 1e-6)
    stated = gpu.fitted_fp8 if fp8 else gpu.fitted
    return replace(derived, **stated) if stated else replace(derived, **_by_shape(gpu, fp8))


def _by_shape(gpu: GPUProfile, fp8: bool) -> dict:
    """The GEMM-by-shape fields of a GPU without a stated fit: its measured table for the dtype
    (where its profile names one with rows of that dtype) and its SMs (wave quantisation)."""
    sms = int(gpu.attention.get("sm_count", 0))
    if not sms:
        return {}
    table = load_table(gpu.gemm_table, "fp8" if fp8 else "bf16", sms) if gpu.gemm_table else None
    peak = gpu.peak_fp8_flops if fp8 else gpu.peak_flops
    if table and max(rate for *_, rate in table.rates) > peak:
        raise UserError("cluster.gpu", f"{gpu.name}: gemm_table {gpu.gemm_table!r} has a "
                                       f"{table.dtype} rate above the peak {peak / 1e12:g} TFLOP/s")
    return {"gemm_sms": sms, "gemm_table": table}


@lru_cache(maxsize=64)
def compute_for(gpu_name: str, fp8: bool = False) -> ComputeCalibration:
    """The compute model of GPU profile `gpu_name` (frozen: one object per name, shared)."""
    return gpu_compute(gpu_profile(gpu_name), fp8)


def cluster_compute(cluster) -> ComputeCalibration | None:
    """A cluster GPU's compute model for its ranks; None for the default A100 fit, which follows
    simsp.hardware.costmodel.calibration() (benchmarks/calibrate_table4.py swaps it while fitting)."""
    cal = compute_for(cluster.gpu)
    return None if cal == A100_COMPUTE else cal
