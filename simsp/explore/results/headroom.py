"""A result row's memory verdict: the one definition of simsp/memory_verdict.py (what "fits"
means, and the reserve: the row's itemised non-tensor memory unless overridden) applied to a
sweep or search row."""

from simsp.memory_verdict import (DEFAULT_MEMORY_RESERVE_GIB, chosen_reserve, memory_verdict,
                                  reserve_bytes)

__all__ = ["DEFAULT_MEMORY_RESERVE_GIB", "add_headroom", "reserve_bytes", "row_reserve"]


def row_reserve(row: dict, override_bytes: float | None) -> float:
    """The reserve the row is judged with: the override, else its `non_tensor_bytes`."""
    return chosen_reserve(override_bytes, row.get("non_tensor_bytes", 0.0))


def add_headroom(row: dict, override_bytes: float | None) -> dict:
    """The row with `memory_reserve_bytes`, `headroom_bytes` (capacity − reserve − peak) and
    `fits` (simulated, not out of memory, headroom ≥ 0); rows that did not simulate are left."""
    if row.get("status") not in ("ok", "oom"):
        return row
    verdict = memory_verdict(row["capacity_bytes"], row["peak_bytes_max"],
                             row["status"] == "oom", row_reserve(row, override_bytes))
    row["memory_reserve_bytes"] = verdict.reserve_bytes
    row["headroom_bytes"] = verdict.headroom_bytes
    row["fits"] = verdict.fits
    return row
