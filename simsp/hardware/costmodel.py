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
from simsp.hardware.gemm_shapes import table_rate, wave_efficiency

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
        copies = max(1, round(flops / (2 * gemm[0] * gemm[1] * gemm[2])))  # a batched GEMM's
        return cal.launch_overhead_s + flops / gemm_rate(gemm, cal, copies)
    return cal.launch_overhead_s + nbytes / (cal.hbm_bandwidth_Bps * cal.memory_efficiency)


def gemm_rate(gemm: tuple, cal: ComputeCalibration, copies: int = 1) -> float:
    """FLOP/s of a 16-bit GEMM of shape (m, k, n), `copies` of it batched in one kernel: the
    GPU's measured table where it has one (simsp/hardware/gemm_shapes.py), else the curve,
    wave-quantised where the GPU's SMs are known (docs/gemm_shapes.md)."""
    m, k, n = gemm
    if cal.gemm_table is not None:
        return table_rate(cal.gemm_table, m, k, n, copies)
    if not cal.gemm_sms:
        return cal.peak_flops * gemm_efficiency(m, k, n, cal)
    # the additive form with the FLOP term wave-quantised: per FLOP 1/(C·w) + (1/I)·I_half/C
    waves = wave_efficiency(m, n, cal.gemm_sms, copies)
    ceiling = cal.peak_flops * cal.gemm_max_efficiency
    return ceiling / (1 / waves + cal.gemm_half_intensity / gemm_intensity(m, k, n))


def calibration_table(cal: ComputeCalibration | None = None) -> dict:
    """The curve's constants as a plain dict, for reports (the shape table is named by
    `simsp hardware`, not repeated in every result)."""
    constants = asdict(cal or active_calibration())
    return {key: value for key, value in constants.items()
            if key not in ("gemm_table", "gemm_sms")}


def gemm_operand_bytes(m: int, k: int, n: int, dtype: str = "bf16") -> int:
    """Bytes a (m,k)x(k,n) GEMM reads and writes once: 2-byte A, B and C in BF16; FP8 reads
    1-byte A and B and writes a 2-byte C (Transformer Engine's BF16 output)."""
    return 2 * (m * k + k * n + m * n) if dtype == "bf16" else m * k + k * n + 2 * m * n


def accumulate_extra_bytes(m: int, n: int, accumulator_bytes: int) -> int:
    """Bytes a GEMM moves beyond gemm_operand_bytes when its (m, n) output is accumulated into
    a tensor of `accumulator_bytes` per element (beta = 1: C read and D written at that width)
    instead of written once in 16 bits: Transformer Engine's weight-gradient GEMM into the
    main gradient (`accumulate=True, out=weight.main_grad` with fuse_wgrad_accumulation,
    transformer_engine/pytorch/module/linear.py; Megatron's gradient_accumulation_fusion)."""
    return (2 * accumulator_bytes - 2) * m * n


def gemm_seconds(flops: int, nbytes: int, cal: ComputeCalibration,
                 shape: tuple | None = None, extra_bytes: int = 0) -> float:
    """The curve in its additive form (simsp.hardware.constants.rule_calibration): launch + FLOPs at the
    ceiling peak x E_max + operand bytes at peak x E_max / I_half. Equal to kernel_time's GEMM
    for 16-bit bytes; FP8 GEMMs pass their 1-byte operands. With the (m, k, n) `shape`: the
    GPU's measured table where it has one, else the FLOP term at the ceiling wave-quantised.
    `extra_bytes`: traffic the plain GEMM (and a measured table's, beta = 0 with a 16-bit
    output) does not have, such as a main-gradient accumulation (accumulate_extra_bytes),
    added at the same memory-bound rate, peak x E_max / I_half."""
    ceiling = cal.peak_flops * cal.gemm_max_efficiency
    extra = extra_bytes * cal.gemm_half_intensity / ceiling
    if shape is not None and cal.gemm_table is not None:
        return cal.launch_overhead_s + flops / table_rate(cal.gemm_table, *shape) + extra
    waves = wave_efficiency(shape[0], shape[2], cal.gemm_sms) if shape and cal.gemm_sms else 1.0
    return (cal.launch_overhead_s + flops / (ceiling * waves)
            + nbytes * cal.gemm_half_intensity / ceiling + extra)
