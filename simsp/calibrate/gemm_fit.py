"""Fit a GPU profile's GEMM parameters to measured GEMM times (`simsp probe gemm`'s CSV).

The model is the compute rule's additive form (simsp.hardware.costmodel.gemm_seconds): one GEMM takes
t = L + F / C + bytes / B, F = 2mkn its FLOPs, bytes its operands read and written once (2-byte
BF16; 1-byte FP8 inputs with a 2-byte output). It is linear in (L, 1/C, 1/B), so the fit is one
weighted linear least-squares solve per dtype, minimising relative errors (each row divided by
its measured time). Written back as the profile's [compute] / [compute_fp8]: gemm_max_efficiency
= C / peak, gemm_half_intensity = C / B, launch_overhead_s = L.
"""

import csv
from dataclasses import dataclass
import re

import numpy as np

from simsp import io_in
from simsp.hardware.costmodel import gemm_operand_bytes
from simsp.errors import UserError
from simsp.io_out import toml_string

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


MAX_ROWS = 10000  # a probe writes ~40; README "Limits", input files
MAX_DIM = 2**31 - 1  # a GEMM dimension CUDA's 32-bit sizes allow
MAX_SECONDS = 3600.0  # one GEMM taking an hour is a broken measurement
_DIGITS = re.compile(r"[0-9]{1,10}")  # ASCII digits only: no '1_024', no other scripts
_NUMBER = re.compile(r"[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?|\.[0-9]+([eE][-+]?[0-9]+)?")


def read_probe_csv(path: str) -> list[GemmRow]:
    """Rows of a probe CSV (`#` lines are comments: the probe's GPU, driver and versions), read
    through simsp/io_in.py (a regular UTF-8 file within its size limit) and checked line by
    line: the header's columns once each, every field typed and bounded."""
    text = io_in.read_text(path, "probe")
    numbered = [(number, line) for number, line in enumerate(text.splitlines(), start=1)
                if line.strip() and not line.startswith("#")]
    if len(numbered) > MAX_ROWS + 1:
        raise UserError(f"{path}:{numbered[MAX_ROWS + 1][0]}", f"more than {MAX_ROWS} rows")
    if not numbered:
        raise UserError(str(path), f"no header line (need {', '.join(COLUMNS)})")
    header_line, *body = numbered
    header = next(csv.reader([header_line[1]]))
    where = f"{path}:{header_line[0]}"
    repeated = sorted({c for c in header if header.count(c) > 1})
    missing = [c for c in COLUMNS if c not in header]
    unknown = [c for c in header if c not in COLUMNS + ("label",)]
    if repeated or missing or unknown:
        what = (f"column {repeated[0]!r} twice" if repeated else f"missing column(s) "
                f"{', '.join(missing)}" if missing else f"unknown column {unknown[0]!r}")
        raise UserError(where, f"{what} (the columns: {', '.join(COLUMNS)}[, label])")
    return [_row(f"{path}:{number}", header, line) for number, line in body]


def _shown(text: str, most: int = 40) -> str:
    """A field as an error quotes it: at most `most` characters."""
    return text if len(text) <= most else text[:most - 1] + "…"


def _row(where: str, header: list, line: str) -> GemmRow:
    """One data line: as many fields as the header, dims ASCII integers, seconds a decimal."""
    fields = next(csv.reader([line]), [])
    if len(fields) != len(header):
        raise UserError(where, f"{len(fields)} fields, the header has {len(header)}")
    record = dict(zip(header, fields))
    if record["dtype"] not in DTYPES:
        raise UserError(where, f"dtype must be one of {', '.join(DTYPES)}, got "
                               f"{record['dtype']!r}")
    dims = [record[c].strip() for c in "mkn"]
    if not all(_DIGITS.fullmatch(d) and 1 <= int(d) <= MAX_DIM for d in dims):
        raise UserError(where, f"m, k, n must be whole numbers in [1, {MAX_DIM}], got "
                               f"{_shown(', '.join(dims))}")
    seconds = record["seconds"].strip()
    if not (_NUMBER.fullmatch(seconds) and 0 < float(seconds) <= MAX_SECONDS):
        raise UserError(where, f"seconds must be a positive decimal number at most "
                               f"{MAX_SECONDS:g}, got {_shown(seconds)!r}")
    label = record.get("label") or ""
    if not label.isprintable():
        raise UserError(where, "label must be one line of printable text")
    m, k, n = map(int, dims)
    return GemmRow(record["dtype"], m, k, n, float(seconds), label)


def fit_dtype(rows: list[GemmRow], where: str = "FILE") -> GemmFit:
    """Weighted linear least squares of t = L + F/C + bytes/B over one dtype's rows; `where`
    (the file) names the error when the rows cannot determine the three parameters."""
    dtype = rows[0].dtype if rows else "a dtype"
    measured = np.array([r.seconds for r in rows])  # (rows,)
    design = np.array([[1.0, float(r.flops), float(r.nbytes)] for r in rows])  # (rows, 3): floats,
    # as 2mkn of three 2**31 dimensions is beyond int64
    scale = design.max(axis=0) if rows else np.ones(3)  # (3,) columns to O(1) for conditioning
    weighted = design / scale / measured[:, None] if rows else design  # (rows, 3)
    if len({(r.m, r.k, r.n) for r in rows}) < 3 or np.linalg.matrix_rank(weighted) < 3:
        raise UserError(where, f"{dtype}: need at least 3 shapes whose FLOPs and bytes grow "
                               "differently to fit launch, ceiling and bandwidth")
    solution, *_ = np.linalg.lstsq(weighted, np.ones(len(rows)), rcond=None)
    launch, per_flop, per_byte = solution / scale  # (3,)
    if per_flop <= 0 or per_byte <= 0:
        raise UserError(where, f"{rows[0].dtype}: the times do not grow with FLOPs and bytes "
                                f"(fit gives 1/C={per_flop:.3g}, 1/B={per_byte:.3g}); probe a "
                                f"wider size sweep")
    model = design @ np.array([launch, per_flop, per_byte])  # (rows,)
    return GemmFit(rows[0].dtype, 1 / per_flop, 1 / per_byte, float(launch), tuple(rows),
                   tuple(float(t) for t in model))


def fit_all(rows: list[GemmRow], where: str = "FILE") -> dict:
    """dtype -> GemmFit for every dtype present."""
    fits = {dtype: fit_dtype([r for r in rows if r.dtype == dtype], where)
            for dtype in DTYPES if any(r.dtype == dtype for r in rows)}
    if not fits:
        raise UserError(where, "no rows")
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
        source = toml_string(body["_source"])
        for key in ("gemm_max_efficiency", "gemm_half_intensity", "launch_overhead_s"):
            lines.append(f'{key} = {{ value = {float(body[key])!r}, source = {source} }}')
        lines.append("")
    return "\n".join(lines)
