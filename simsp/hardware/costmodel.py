"""A100 compute cost model: one kernel's FLOPs or bytes -> seconds (docs/MODEL.md#hardware).

GEMMs run at a fraction of the tensor-core peak that grows with their arithmetic intensity;
memory-bound kernels (LN, dropout, GeLU, softmax, adds, copies) stream their bytes at a fraction
of HBM bandwidth; every kernel pays a launch overhead. Collectives are timed by the engine.
The constants are `simsp.hardware.constants.ComputeCalibration`; `calibration(cal)` swaps them for a
block of code (the calibration script's fit does).
"""

from contextlib import contextmanager
from dataclasses import asdict

from simsp.hardware.constants import A100_COMPUTE, ComputeCalibration

_ACTIVE = [A100_COMPUTE]  # stack: the last entry times every kernel


def active_calibration() -> ComputeCalibration:
    """The constants kernels are timed with now."""
    return _ACTIVE[-1]


@contextmanager
def calibration(cal: ComputeCalibration):
    """Time every kernel inside the `with` block with `cal`."""
    _ACTIVE.append(cal)
    try:
        yield cal
    finally:
        _ACTIVE.pop()


def gemm_intensity(m: int, k: int, n: int) -> float:
    """FLOPs per byte of a 16-bit (m,k)x(k,n) GEMM reading A, B and writing C once:
    2mkn / 2(mk + kn + mn). Symmetric, so forward, input-grad and weight-grad GEMMs agree."""
    return m * k * n / (m * k + k * n + m * n)


def gemm_efficiency(m: int, k: int, n: int, cal: ComputeCalibration | None = None) -> float:
    """Fraction of peak one GEMM reaches: E_max · I / (I + I_half), saturating in intensity I."""
    cal = cal or active_calibration()
    intensity = gemm_intensity(m, k, n)
    return cal.gemm_max_efficiency * intensity / (intensity + cal.gemm_half_intensity)


def kernel_time(kind: str, flops: int, nbytes: int, gemm: tuple | None = None,
                cal: ComputeCalibration | None = None) -> float:
    """Seconds for one kernel: a "gemm" by its FLOPs and shape (m, k, n), anything else by the
    bytes it reads and writes; plus the launch overhead."""
    cal = cal or active_calibration()
    if kind == "gemm":
        rate = cal.peak_flops * gemm_efficiency(*gemm, cal)
        return cal.launch_overhead_s + flops / rate
    return cal.launch_overhead_s + nbytes / (cal.hbm_bandwidth_Bps * cal.memory_efficiency)


def calibration_table(cal: ComputeCalibration | None = None) -> dict:
    """The constants as a plain dict, for reports."""
    return asdict(cal or active_calibration())


def gemm_operand_bytes(m: int, k: int, n: int, dtype: str = "bf16") -> int:
    """Bytes a (m,k)x(k,n) GEMM reads and writes once: 2-byte A, B and C in BF16; FP8 reads
    1-byte A and B and writes a 2-byte C (Transformer Engine's BF16 output)."""
    return 2 * (m * k + k * n + m * n) if dtype == "bf16" else m * k + k * n + 2 * m * n


def gemm_seconds(flops: int, nbytes: int, cal: ComputeCalibration) -> float:
    """The curve in its additive form (simsp.hardware.constants.rule_calibration): launch + FLOPs at the
    ceiling peak x E_max + operand bytes at peak x E_max / I_half. Equal to kernel_time's GEMM
    for 16-bit bytes; FP8 GEMMs pass their 1-byte operands."""
    ceiling = cal.peak_flops * cal.gemm_max_efficiency
    return cal.launch_overhead_s + flops / ceiling + nbytes * cal.gemm_half_intensity / ceiling
