"""A rank's memory over time from its ledger: bytes per category after each change, downsampled.

Shared by the Chrome trace's memory counter (report/run/trace/) and the memory figures
(report/run/figures/), so all show the exact peak: beyond a point budget the timeline keeps each
time bucket's highest and lowest state. A ledger's timeline at MAX_MEMORY_POINTS is computed once
(kept beside the ledger until it changes); smaller budgets downsample that one again, which keeps
the peak too.
"""

from weakref import finalize

import numpy as np

from simsp.engine.memory import CATEGORIES, sort_log


MAX_MEMORY_POINTS = 2000  # per rank
_FINEST: dict = {}  # id(ledger) -> (records, times, state) while that ledger lives


def memory_timeline(log, max_points: int = MAX_MEMORY_POINTS):
    """A ledger (or a list of MemEvents) -> (times_s, bytes per category (n, 7) int64), at most
    `max_points` rows.

    The log is read in time order (stable, ties in recording order, as the ledger's summary
    does). Beyond `max_points` changes, the timeline is split into (max_points - 2) // 2 equal
    time buckets that each keep their highest and lowest state, plus the first and last, so the
    maximum of the total is exactly the ledger's peak."""
    if not hasattr(log, "records") or max_points > MAX_MEMORY_POINTS:
        return _timeline(log, max_points)
    return coarser(*_finest(log), max_points)


def coarser(times: np.ndarray, state: np.ndarray, max_points: int):
    """A timeline (times (n,), state (n, 7)) at most `max_points` rows long, each time bucket's
    highest and lowest state kept (the peak stays exact)."""
    if len(times) <= max_points:
        return times, state
    keep = _downsample(times, state.sum(axis=1), max_points)
    return times[keep], state[keep]


def _finest(ledger) -> tuple[np.ndarray, np.ndarray]:
    """The ledger's timeline at MAX_MEMORY_POINTS, computed once per state of its log."""
    count, key = len(ledger.records), id(ledger)
    cached = _FINEST.get(key)
    if cached is None:
        finalize(ledger, _FINEST.pop, key, None)  # forget it with the ledger
    if cached is None or cached[0] != count:
        times, state = _timeline(ledger, MAX_MEMORY_POINTS)
        times.flags.writeable = state.flags.writeable = False  # shared: callers only read
        cached = _FINEST[key] = (count, times, state)
    return cached[1], cached[2]


def _timeline(log, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """memory_timeline computed from the whole log."""
    records = log.records if hasattr(log, "records") else list(log)
    if not records:
        return np.zeros(0), np.zeros((0, len(CATEGORIES)), dtype=np.int64)
    times, codes, deltas, _ = log.sorted_log() if hasattr(log, "records") else sort_log(
        records, CATEGORIES)
    total = np.cumsum(deltas)  # (n,) bytes in use after each change
    keep = _downsample(times, total, max_points)  # (m,)
    return times[keep], state_at(codes, deltas, keep)


def state_at(codes: np.ndarray, deltas: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """(m, 7) int64: bytes per category after each kept change (`keep`, sorted, ending at the
    last change), from the changes' category `codes` (n,) and byte `deltas` (n,).

    Each change is summed into the segment that ends at the next kept change (np.bincount; its
    float64 sums of whole bytes are exact below 2**53 bytes), then the segments run-summed."""
    starts = np.zeros(len(codes), dtype=np.int64)  # (n,) 1 where a new segment begins
    starts[keep[:-1] + 1] = 1
    segment = np.cumsum(starts)  # (n,)
    width = len(CATEGORIES)
    sums = np.bincount(segment * width + codes, weights=deltas, minlength=len(keep) * width)
    return np.cumsum(np.rint(sums).astype(np.int64).reshape(len(keep), width), axis=0)


def _downsample(times: np.ndarray, total: np.ndarray, max_points: int) -> np.ndarray:
    """Indices to keep: all if few enough, else each time bucket's max and min (and the ends).

    The first maximum and first minimum of each bucket, so the choice is deterministic."""
    n = len(times)
    if n <= max_points:
        return np.arange(n)
    buckets = max(1, (max_points - 2) // 2)
    span = times[-1] - times[0]
    ids = np.zeros(n, dtype=np.int64) if span <= 0 else np.minimum(
        ((times - times[0]) / span * buckets).astype(np.int64), buckets - 1)
    new_bucket = np.r_[True, ids[1:] != ids[:-1]]
    starts, bucket = np.flatnonzero(new_bucket), np.cumsum(new_bucket) - 1
    keep = [[0, n - 1]]
    for reduce in (np.maximum, np.minimum):
        hits = np.flatnonzero(total == reduce.reduceat(total, starts)[bucket])
        keep.append(hits[np.r_[True, bucket[hits][1:] != bucket[hits][:-1]]])
    return np.unique(np.concatenate(keep))
