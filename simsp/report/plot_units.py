"""Display units of the report figures: bytes in GiB or MiB, seconds in s, ms or us."""

from simsp.units import GiB, MiB


def memory_unit(nbytes: float) -> tuple[str, int]:
    """GiB for paper models, MiB for the toys."""
    return ("GiB", GiB) if nbytes >= GiB else ("MiB", MiB)


def time_unit(seconds: float) -> tuple[str, float]:
    """s, ms or us for the time axis."""
    return next(((n, v) for n, v in (("s", 1.0), ("ms", 1e-3)) if seconds >= v), ("us", 1e-6))
