"""Peaks and the out-of-memory verdict of one rank, as a pure function of its ledger events.

Events are read in time order (ties in the order recorded), so events stamped ahead of the
simulation clock (replayed layer templates) count exactly where they belong.
"""

from dataclasses import dataclass
from operator import itemgetter


@dataclass(frozen=True)
class LiveTensor:
    key: str
    category: str
    nbytes: int
    op: str


@dataclass(frozen=True)
class OutOfMemory:
    """The first allocation that did not fit: who asked, for what, and what was in the way."""

    rank: int
    op: str
    key: str
    time_s: float
    bytes_asked: int
    bytes_in_use: int
    capacity_bytes: int
    largest_live: tuple[LiveTensor, ...]


@dataclass(frozen=True)
class MemorySummary:
    peak_total: int
    peak_time_s: float
    peak_by_category: dict  # each category's own peak
    at_peak: dict  # each category's bytes at the moment of the total peak
    oom: OutOfMemory | None


def largest(live: dict, count: int = 5) -> tuple[LiveTensor, ...]:
    """The biggest live tensors, largest first (ties by key, for determinism)."""
    return tuple(sorted(live.values(), key=lambda t: (-t.nbytes, t.key))[:count])


def summarize(events: list, categories: tuple, rank: int, capacity: int) -> MemorySummary:
    """Replay `events` in time order: total and per-category peaks, and the first OOM."""
    current = dict.fromkeys(categories, 0)
    peaks = dict.fromkeys(categories, 0)
    live, total, peak, peak_time, oom = {}, 0, 0, 0.0, None
    at_peak = dict(current)
    for event in sorted(events, key=itemgetter(0)):  # time_s; stable for equal times
        if event.delta_bytes > 0 and oom is None and total + event.delta_bytes > capacity:
            oom = OutOfMemory(rank, event.op, event.key, event.time_s, event.delta_bytes, total,
                              capacity, largest(live))
        total += event.delta_bytes
        current[event.category] += event.delta_bytes
        if event.delta_bytes > 0:
            live[event.key] = LiveTensor(event.key, event.category, event.delta_bytes, event.op)
            peaks[event.category] = max(peaks[event.category], current[event.category])
            if total > peak:
                peak, peak_time, at_peak = total, event.time_s, dict(current)
        else:
            live.pop(event.key, None)
    return MemorySummary(peak, peak_time, peaks, at_peak, oom)
