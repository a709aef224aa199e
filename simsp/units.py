"""Byte and time units: parsing nccl-tests style sizes and formatting for humans."""

import re

from simsp.errors import UserError

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
GB = 1e9  # bandwidths are quoted in GB/s = 1e9 bytes/s (nccl-tests convention)

_SUFFIXES = {"": 1, "K": KiB, "M": MiB, "G": GiB}  # nccl-tests: powers of 1024, see parse_size
MAX_SIZE_BYTES = 1 << 40  # 1 TiB: far above any one collective's message (a GPU holds 80 GiB)
# ASCII digits (at most 13, an optional fraction of at most 9), then an optional K, M or G
# (either case) that a B or iB may follow, or a bare B; no sign, no '1_024', no other digits.
_SIZE = re.compile(r"([0-9]{1,13}(?:\.[0-9]{1,9})?)(?:([KMG])(?:i?B)?|B)?",
                   re.ASCII | re.IGNORECASE)


def _shown(text) -> str:
    """The user's text quoted, cut to 40 characters so a huge argument stays one short line."""
    text = str(text)
    return repr(text if len(text) <= 40 else text[:37] + "...")


def parse_size(text: str, field: str = "size") -> int:
    """Bytes from a size as nccl-tests reads -b/-e (NVIDIA/nccl-tests src/common.cu
    `parsesize`: `sscanf(value, "%lf %1s")`, then K, M, G in either case multiply by 1024,
    1024², 1024³ and what follows the letter is ignored; the double is cut to whole bytes).
    So `1G`, `1GB` and `1GiB` are all 2^30 bytes, `1.5M` is 1,572,864 and `64k` is 65,536; a
    plain number is bytes. From 1 B up to MAX_SIZE_BYTES."""
    match = _SIZE.fullmatch(str(text))
    if match is None:
        raise UserError(field, f"{_shown(text)} is not a size (a number and an optional K, M or G, "
                               f"powers of 1024 as in nccl-tests: 8, 256K, 1.5M, 1G)")
    value = int(float(match[1]) * _SUFFIXES[(match[2] or "").upper()])
    if value <= 0:
        raise UserError(field, f"{text!r} must be at least 1 byte")
    if value > MAX_SIZE_BYTES:
        raise UserError(field, f"{text!r} is above the limit of {format_bytes(MAX_SIZE_BYTES)}")
    return value


def format_bytes(n: float) -> str:
    """Human-readable binary size: 1536 -> '1.50 KiB'."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def format_seconds(t: float) -> str:
    """Human-readable duration: picks s, ms or us."""
    if abs(t) >= 1:
        return f"{t:.3f} s"
    if abs(t) >= 1e-3:
        return f"{t * 1e3:.3f} ms"
    return f"{t * 1e6:.3f} us"
