"""Byte and time units: parsing nccl-tests style sizes and formatting for humans."""

from simsp.errors import UserError

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
GB = 1e9  # bandwidths are quoted in GB/s = 1e9 bytes/s (nccl-tests convention)

_SUFFIXES = {"": 1, "K": KiB, "M": MiB, "G": GiB, "T": 1 << 40}


def parse_size(text: str, field: str = "size") -> int:
    """Parse '8', '256K', '1M', '1G' (binary multiples, as nccl-tests does) into bytes."""
    raw = str(text).strip().upper().removesuffix("B")
    number, suffix = (raw[:-1], raw[-1]) if raw and raw[-1] in "KMGT" else (raw, "")
    try:
        value = int(number) * _SUFFIXES[suffix]
    except ValueError:
        raise UserError(field, f"{text!r} is not a size (examples: 8, 256K, 1M, 1G)") from None
    if value <= 0:
        raise UserError(field, f"{text!r} must be positive")
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
