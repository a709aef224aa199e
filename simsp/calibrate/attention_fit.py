"""A GPU profile's fused attention figures from measured kernel times (`simsp probe gemm`'s
attention CSV; docs/attention_kernels.md).

The profile's [attention] section holds, per kernel and direction, the TFLOP/s at the published
benchmarks' shape (16k tokens in one sequence, 16 heads of 128, no mask), counted as the
flash-attention benchmarks count them (simsp/hardware/attention_kernels.py published_flops). A
probe measures that shape directly, so each figure is published_flops / the median measured
seconds of its rows; the other shapes measured (the scenario layer's) are printed against what
the tiled model then predicts for them, as a check.
"""

import csv
from dataclasses import dataclass
import re
import statistics

from simsp import io_in
from simsp.errors import UserError
from simsp.hardware.attention_kernels import (AttentionRates, AttentionShape, attention_seconds,
                                              published_flops, reference_shape)
from simsp.io_out import toml_string

# simsp's kernel names -> PyTorch's SDPBackend member (torch.nn.attention.SDPBackend)
ATTENTION_BACKENDS = {"fa2": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION"}
ATTENTION_COLUMNS = ("kernel", "direction", "batch", "heads", "kv_heads", "seq", "head_dim",
                     "causal", "seconds", "label")
ATTENTION_HEADER = ",".join(ATTENTION_COLUMNS)
DIRECTIONS = ("fwd", "bwd")
MAX_ROWS = 10000  # a probe writes 8
MAX_DIM = 2**31 - 1
MAX_SECONDS = 3600.0
_DIGITS = re.compile(r"[0-9]{1,10}")
_NUMBER = re.compile(r"[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?|\.[0-9]+([eE][-+]?[0-9]+)?")


@dataclass(frozen=True)
class AttentionRow:
    """One measured attention call: kernel, direction, shape and seconds."""

    kernel: str
    direction: str
    shape: AttentionShape
    seconds: float
    label: str = ""


def read_attention_csv(path: str) -> list[AttentionRow]:
    """The rows of a probe's attention CSV (`#` lines are comments), each field checked."""
    text = io_in.read_text(path, "probe")
    numbered = [(number, line) for number, line in enumerate(text.splitlines(), start=1)
                if line.strip() and not line.startswith("#")]
    if not numbered or next(csv.reader([numbered[0][1]])) != list(ATTENTION_COLUMNS):
        raise UserError(str(path), f"the header must be {ATTENTION_HEADER}")
    if len(numbered) > MAX_ROWS + 1:
        raise UserError(f"{path}:{numbered[MAX_ROWS + 1][0]}", f"more than {MAX_ROWS} rows")
    return [_row(f"{path}:{number}", line) for number, line in numbered[1:]]


def _row(where: str, line: str) -> AttentionRow:
    """One data line: a known kernel and direction, whole-number dims, causal 0/1, seconds."""
    fields = next(csv.reader([line]), [])
    if len(fields) != len(ATTENTION_COLUMNS):
        raise UserError(where, f"{len(fields)} fields, the header has {len(ATTENTION_COLUMNS)}")
    record = dict(zip(ATTENTION_COLUMNS, (f.strip() for f in fields)))
    if record["kernel"] not in ATTENTION_BACKENDS or record["direction"] not in DIRECTIONS:
        raise UserError(where, f"kernel must be one of {', '.join(ATTENTION_BACKENDS)} and "
                               f"direction one of {', '.join(DIRECTIONS)}")
    dims = [record[c] for c in ("batch", "heads", "kv_heads", "seq", "head_dim")]
    if not all(_DIGITS.fullmatch(d) and 1 <= int(d) <= MAX_DIM for d in dims):
        raise UserError(where, f"batch, heads, kv_heads, seq, head_dim must be whole numbers "
                               f"in [1, {MAX_DIM}]")
    if record["causal"] not in ("0", "1"):
        raise UserError(where, f"causal must be 0 or 1, got {record['causal'][:40]!r}")
    if not (_NUMBER.fullmatch(record["seconds"]) and 0 < float(record["seconds"]) <= MAX_SECONDS):
        raise UserError(where, f"seconds must be a positive decimal number at most "
                               f"{MAX_SECONDS:g}")
    batch, heads, kv_heads, seq, dim = map(int, dims)
    if heads % kv_heads:
        raise UserError(where, f"heads {heads} must be a multiple of kv_heads {kv_heads}")
    shape = AttentionShape(batch, heads, kv_heads, seq, seq, dim, dim, record["causal"] == "1")
    return AttentionRow(record["kernel"], record["direction"], shape, float(record["seconds"]),
                        record["label"] if record["label"].isprintable() else "")


def attention_figures(rows: list[AttentionRow], where: str = "FILE") -> dict:
    """{'<kernel>_<fwd|bwd>_TFLOPs': TFLOP/s} from the rows at the published shape (the median
    of a key's rows); a kernel needs both directions (a profile gives them together)."""
    figures = {}
    for kernel in ATTENTION_BACKENDS:
        for direction in DIRECTIONS:
            times = [r.seconds for r in rows if (r.kernel, r.direction) == (kernel, direction)
                     and r.shape == reference_shape()]
            if times:
                flops = published_flops(reference_shape(), direction == "bwd")
                figures[f"{kernel}_{direction}_TFLOPs"] = flops / statistics.median(times) / 1e12
        if (f"{kernel}_fwd_TFLOPs" in figures) != (f"{kernel}_bwd_TFLOPs" in figures):
            raise UserError(where, f"{kernel}: rows at the published shape in one direction "
                                   f"only (a profile gives forward and backward together)")
    if not figures:
        raise UserError(where, "no row at the published shape (batch 1, 16 heads of 128, "
                               "seq 16384, causal 0)")
    return figures


def model_checks(rows: list[AttentionRow], figures: dict, gpu, cal) -> list[tuple]:
    """(row, model seconds) for each row whose kernel has figures: the tiled model of
    simsp/hardware/attention_kernels.py with the fitted figures on this GPU."""
    checks = []
    for row in rows:
        if f"{row.kernel}_fwd_TFLOPs" not in figures:
            continue
        rates = AttentionRates(row.kernel, int(gpu.attention["sm_count"]), gpu.hbm_bandwidth_Bps,
                               cal.memory_efficiency, cal.launch_overhead_s,
                               figures[f"{row.kernel}_fwd_TFLOPs"] * 1e12,
                               figures[f"{row.kernel}_bwd_TFLOPs"] * 1e12)
        checks.append((row, attention_seconds(rates, row.shape, row.direction == "bwd")))
    return checks


def attention_fragment(figures: dict, sm_count: int, source: str) -> str:
    """TOML text: the [attention] section, every value with its source."""
    quoted = toml_string(source)
    lines = ["[attention]", f"sm_count = {{ value = {sm_count}, source = "
                            f"{toml_string('the GPU profile given to --gpu')} }}"]
    lines += [f"{key} = {{ value = {round(value, 1)!r}, source = {quoted} }}"
              for key, value in sorted(figures.items())]
    return "\n".join(lines) + "\n"
