"""Fit a GPU profile's GEMM parameters to measured GEMM times (`simsp probe gemm`'s CSV).

The model is the compute rule's additive form (simsp.costmodel.gemm_seconds): one GEMM takes
t = L + F / C + bytes / B, F = 2mkn its FLOPs, bytes its operands read and written once (2-byte
BF16; 1-byte FP8 inputs with a 2-byte output). It is linear in (L, 1/C, 1/B), so the fit is one
weighted linear least-squares solve per dtype, minimising relative errors (each row divided by
its measured time). Written back as the profile's [compute] / [compute_fp8]: gemm_max_efficiency
= C / peak, gemm_half_intensity = C / B, launch_overhead_s = L.
"""

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simsp.costmodel import gemm_operand_bytes
from simsp.errors import UserError

COLUMNS = ("dtype", "m", "k", "n", "seconds")
DTYPES = ("bf16", "fp8")


@dataclass(frozen=True)
class GemmRow:
    """One measured GEMM: dtype, shape (m, k, n), seconds, and where the shape came from."""

    dtype: str
    m: int
    k: int
    n: int
    seconds: float
    label: str = ""

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n

    @property
    def nbytes(self) -> int:
        return gemm_operand_bytes(self.m, self.k, self.n, self.dtype)


@dataclass(frozen=True)
class GemmFit:
    """One dtype's fitted parameters and its rows' model times."""

    dtype: str
    ceiling_flops: float  # C
    memory_Bps: float  # B
    launch_s: float  # L
    rows: tuple
    model_s: tuple

    def relative_errors(self) -> np.ndarray:
        measured = np.array([r.seconds for r in self.rows])  # (rows,)
        return np.array(self.model_s) / measured - 1  # (rows,)


def read_probe_csv(path: str) -> list[GemmRow]:
    """Rows of a probe CSV (`#` lines are comments: the probe's GPU, driver and versions)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError("FILE", f"file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError("FILE", f"cannot read {path}: {exc}") from None
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    reader = csv.DictReader(lines)
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise UserError("FILE", f"{path}: missing column(s) {', '.join(missing)} "
                                f"(need {', '.join(COLUMNS)})")
    return [_row(path, number, record) for number, record in enumerate(reader, start=2)]


def _row(path: str, number: int, record: dict) -> GemmRow:
    where = f"{path} row {number}"
    if record["dtype"] not in DTYPES:
        raise UserError("FILE", f"{where}: dtype must be one of {', '.join(DTYPES)}")
    try:
        m, k, n = (int(record[c]) for c in "mkn")
        seconds = float(record["seconds"])
    except (TypeError, ValueError):
        raise UserError("FILE", f"{where}: m, k, n must be integers and seconds a number") from None
    if min(m, k, n) < 1 or not 0 < seconds < float("inf"):
        raise UserError("FILE", f"{where}: shape and seconds must be positive and finite")
    return GemmRow(record["dtype"], m, k, n, seconds, record.get("label") or "")


def fit_dtype(rows: list[GemmRow]) -> GemmFit:
    """Weighted linear least squares of t = L + F/C + bytes/B over one dtype's rows."""
    if len(rows) < 3:
        raise UserError("FILE", f"{rows[0].dtype if rows else 'a dtype'}: need at least 3 "
                                f"shapes to fit launch, ceiling and bandwidth")
    measured = np.array([r.seconds for r in rows])  # (rows,)
    design = np.array([[1.0, r.flops, r.nbytes] for r in rows])  # (rows, 3)
    scale = design.max(axis=0)  # (3,) columns to O(1) for conditioning
    weighted = design / scale / measured[:, None]  # (rows, 3): relative residuals
    solution, *_ = np.linalg.lstsq(weighted, np.ones(len(rows)), rcond=None)
    launch, per_flop, per_byte = solution / scale  # (3,)
    if per_flop <= 0 or per_byte <= 0:
        raise UserError("FILE", f"{rows[0].dtype}: the times do not grow with FLOPs and bytes "
                                f"(fit gives 1/C={per_flop:.3g}, 1/B={per_byte:.3g}); probe a "
                                f"wider size sweep")
    model = design @ np.array([launch, per_flop, per_byte])  # (rows,)
    return GemmFit(rows[0].dtype, 1 / per_flop, 1 / per_byte, float(launch), tuple(rows),
                   tuple(float(t) for t in model))


def fit_all(rows: list[GemmRow]) -> dict:
    """dtype -> GemmFit for every dtype present."""
    fits = {dtype: fit_dtype([r for r in rows if r.dtype == dtype])
            for dtype in DTYPES if any(r.dtype == dtype for r in rows)}
    if not fits:
        raise UserError("FILE", "no rows")
    return fits


def compute_section(fit: GemmFit, peak_flops: float, source: str) -> dict:
    """The profile's [compute] keys from a fit: E_max = C / peak, I_half = C / B, L."""
    return {"gemm_max_efficiency": fit.ceiling_flops / peak_flops,
            "gemm_half_intensity": fit.ceiling_flops / fit.memory_Bps,
            "launch_overhead_s": max(fit.launch_s, 1e-9), "_source": source}  # a profile value is positive


def fragment(sections: dict) -> str:
    """TOML text: [compute] and [compute_fp8] with every value's source."""
    lines = []
    for name, body in sections.items():
        lines.append(f"[{name}]")
        source = body["_source"].replace('"', "'")
        for key in ("gemm_max_efficiency", "gemm_half_intensity", "launch_overhead_s"):
            lines.append(f'{key} = {{ value = {float(body[key])!r}, source = "{source}" }}')
        lines.append("")
    return "\n".join(lines)
