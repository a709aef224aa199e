"""Byte and time units: parsing nccl-tests style sizes and formatting for humans."""

import re

from simsp.errors import UserError

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
GB = 1e9  # bandwidths are quoted in GB/s = 1e9 bytes/s (nccl-tests convention)

_SUFFIXES = {"": 1, "K": KiB, "M": MiB, "G": GiB, "T": 1 << 40}
MAX_SIZE_BYTES = 1 << 40  # 1 TiB: far above any one collective's message (a GPU holds 80 GiB)
# ASCII digits only (no '1_024', no non-ASCII digits, no sign), at most 13 of them, then a unit.
_SIZE = re.compile(r"([0-9]{1,13})([KMGT]?)B?", re.ASCII | re.IGNORECASE)


def _shown(text) -> str:
    """The user's text quoted, cut to 40 characters so a huge argument stays one short line."""
    text = str(text)
    return repr(text if len(text) <= 40 else text[:37] + "...")


def parse_size(text: str, field: str = "size") -> int:
    """Parse '8', '256K', '1M', '1G' (binary multiples, as nccl-tests does) into bytes, from 1 B
    up to MAX_SIZE_BYTES."""
    match = _SIZE.fullmatch(str(text))
    if match is None:
        raise UserError(field, f"{_shown(text)} is not a size (ASCII digits and an optional unit: "
                               f"8, 256K, 1M, 1G)")
    value = int(match[1]) * _SUFFIXES[match[2].upper()]
    if value <= 0:
        raise UserError(field, f"{text!r} must be positive")
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
