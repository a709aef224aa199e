"""A100 compute cost model: kernel FLOPs and bytes -> seconds (K22 §6 hardware, REFERENCE.md §6).

GEMMs run at a calibrated fraction of the 312 TFLOP/s tensor-core peak that grows with the GEMM's
size; memory-bound kernels move their bytes at a calibrated fraction of HBM bandwidth; every kernel
pays a launch overhead. All constants live in `A100_COMPUTE` and are reported with results.
"""

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ComputeCalibration:
    """Named constants of the compute model (calibrated against K22 Table 4)."""

    peak_flops: float = 312e12  # A100 dense fp16/bf16 tensor core
    hbm_bandwidth_Bps: float = 2.0e12  # A100-SXM4-80GB HBM2e
    gemm_max_efficiency: float = 0.80  # fraction of peak reached by large GEMMs
    gemm_half_size: float = 256.0  # smallest GEMM dim at which efficiency is half the max
    memory_efficiency: float = 0.75  # fraction of HBM bandwidth reached by element-wise kernels
    launch_overhead_s: float = 4e-6  # per kernel


A100_COMPUTE = ComputeCalibration()


def gemm_efficiency(m: int, k: int, n: int, cal: ComputeCalibration = A100_COMPUTE) -> float:
    """Fraction of peak a GEMM reaches: a saturating curve in its smallest dimension."""
    smallest = min(m, k, n)
    return cal.gemm_max_efficiency * smallest / (smallest + cal.gemm_half_size)


def kernel_time(kind: str, flops: int, nbytes: int, gemm=None,
                cal: ComputeCalibration = A100_COMPUTE) -> float:
    """Seconds for one kernel: GEMMs by FLOPs, everything else by bytes moved."""
    if kind == "gemm":
        m, k, n = gemm
        return cal.launch_overhead_s + flops / (cal.peak_flops * gemm_efficiency(m, k, n, cal))
    return cal.launch_overhead_s + nbytes / (cal.hbm_bandwidth_Bps * cal.memory_efficiency)


def calibration_table(cal: ComputeCalibration = A100_COMPUTE) -> dict:
    """The constants as a plain dict, for reports."""
    return asdict(cal)
