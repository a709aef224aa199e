"""GEMM throughput by shape: a GPU's measured (m, k, n) -> TFLOP/s table, interpolated with wave
quantisation (docs/gemm_shapes.md).

A table is a CSV in simsp/hardware/data/gemm/ (`dtype,m,k,n,TFLOPs`, a full grid of powers of
two per dtype, its source in the header comments), named by a GPU profile's `gemm_table`. A
shape's rate: the table's rates interpolated linearly in log2(m), log2(k), log2(n) on their log,
coordinates outside the grid clamped to its edge (as XLA's matmul_interpolator.cc clamps to its
table's min/max context), times the shape's wave efficiency relative to the same blend of the
table points' own where the shape's is lower (a shape past the grid whose last wave is emptier).
At a table point this is the table's value exactly.

Wave quantisation (NVIDIA Deep Learning Performance Documentation, "Matrix Multiplication
Background User's Guide", §Tile Quantization and §Wave Quantization): C is computed in tiles of
TILE_M x TILE_N, one per thread block; the tiles run in waves of one per SM, and the last wave is
partly empty: efficiency = tiles / (waves x SMs).
"""

import csv
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from simsp.errors import UserError

GEMM_DATA = Path(__file__).parent / "data" / "gemm"
# the output tile one thread block computes: 128 rows x 256 columns, the largest Hopper cuBLAS /
# CUTLASS SM90 tile (CUTLASS include/cutlass/gemm/collective/builders/sm90_gmma_builder.inl
# tiles up to 256 on N; the Matrix Multiplication Background guide's worked example: 256 x 128)
TILE_M, TILE_N = 128, 256


def wave_efficiency(m: int, n: int, sms: int, copies: int = 1) -> float:
    """Fraction of the SMs' tile slots `copies` (m, n) outputs fill (a batched GEMM's batch):
    tiles = copies·⌈m/128⌉·⌈n/256⌉, waves = ⌈tiles / SMs⌉, efficiency = tiles / (waves · SMs)."""
    tiles = copies * -(-m // TILE_M) * -(-n // TILE_N)
    waves = -(-tiles // sms)
    return tiles / (waves * sms)


@dataclass(frozen=True, eq=False)
class GemmTable:
    """One GPU's measured GEMM rates for one dtype: the grid axes (the powers of two m, k and n
    take), the rates in FLOP/s by (m, k, n), the GPU's SMs and where the numbers come from (the
    CSV's header). Compared and hashed by identity (load_table makes one per table, dtype and
    SMs), so the per-GEMM cache never hashes the rows."""

    name: str
    dtype: str
    sms: int
    axes: tuple  # (m_axis, k_axis, n_axis): each a sorted tuple of the grid's values
    rates: tuple  # ((m, k, n, FLOP/s), ...) sorted, one per grid point
    source: str

    def rate_at(self, m: int, k: int, n: int) -> float:
        """The measured FLOP/s at grid point (m, k, n)."""
        return _rate_map(self)[(m, k, n)]


@lru_cache(maxsize=16)
def _rate_map(table: GemmTable) -> dict:
    return {(m, k, n): rate for m, k, n, rate in table.rates}


def _bracket(axis: tuple, value: int) -> tuple:
    """(low, high, fraction) of `value` between two neighbouring grid values in log2, clamped to
    the grid's ends."""
    x = min(max(math.log2(value), math.log2(axis[0])), math.log2(axis[-1]))
    for low, high in zip(axis, axis[1:]):
        if x <= math.log2(high):
            return low, high, (x - math.log2(low)) / (math.log2(high) - math.log2(low))
    return axis[-1], axis[-1], 0.0


@lru_cache(maxsize=65536)
def table_rate(table: GemmTable, m: int, k: int, n: int, copies: int = 1) -> float:
    """FLOP/s of `copies` (m,k)x(k,n) GEMMs in one kernel: the measured rates interpolated
    (trilinear in log2 of the dims, on log rate), times the kernel's wave efficiency over the
    same blend of the points' own, where that is below 1 (never above the measured points)."""
    brackets = [_bracket(axis, value) for axis, value in zip(table.axes, (m, k, n))]
    log_rate, log_waves = 0.0, 0.0
    for corner in range(8):
        weight, point = 1.0, []
        for bit, (low, high, frac) in enumerate(brackets):
            upper = corner >> bit & 1
            weight *= frac if upper else 1.0 - frac
            point.append(high if upper else low)
        if weight:
            log_rate += weight * math.log(table.rate_at(*point))
            log_waves += weight * math.log(wave_efficiency(point[0], point[2], table.sms))
    waves = wave_efficiency(m, n, table.sms, copies) / math.exp(log_waves)
    return math.exp(log_rate) * min(1.0, waves)


def available_tables() -> list[str]:
    """The bundled table names (data/gemm/*.csv stems), sorted."""
    return sorted(p.stem for p in GEMM_DATA.glob("*.csv"))


@lru_cache(maxsize=16)
def load_table(name: str, dtype: str, sms: int) -> GemmTable | None:
    """The bundled table `name`'s rows of `dtype` (None when it has none), checked: a full grid
    of positive rates."""
    field = "cluster.gpu"
    path = GEMM_DATA / f"{name}.csv"
    if name not in available_tables():
        raise UserError(field, f"gemm_table: unknown table {name!r} (bundled: "
                               f"{', '.join(available_tables())})")
    text = path.read_text(encoding="utf-8")  # a bundled file (profiles name only these)
    comments = [line[1:].strip() for line in text.splitlines() if line.startswith("#")]
    rows = [row for row in csv.DictReader(line for line in text.splitlines()
                                          if line and not line.startswith("#"))
            if row["dtype"] == dtype]
    if not rows:
        return None
    rates = tuple(sorted((int(r["m"]), int(r["k"]), int(r["n"]), float(r["TFLOPs"]) * 1e12)
                         for r in rows))
    axes = tuple(tuple(sorted({rate[i] for rate in rates})) for i in range(3))
    if len(rates) != math.prod(len(axis) for axis in axes) or min(r[3] for r in rates) <= 0:
        raise UserError(field, f"{path}: {dtype} rows must be a full (m, k, n) grid of "
                               f"positive TFLOP/s")
    return GemmTable(name, dtype, sms, axes, rates, " ".join(comments))
