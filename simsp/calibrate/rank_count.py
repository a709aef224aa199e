"""How many ranks an nccl-tests table was run on, read from its own numbers (for a log whose
Rank lines are abbreviated or cut short).

nccl-tests (src/common.cu setupArgs, src/*.cu getCollByteCount / GetBw) prints for each size:
- reduce_scatter, all_gather, alltoall: count = the per-rank elements, so size = ranks x count
  x type bytes;
- all_reduce: count = every element (size = count x type bytes), and busbw = algbw x 2(n-1)/n;
  the ratio, bounded by the `%6.2f` rounding of both bandwidths, bounds n. Each row narrows the
  interval; a run's rows together usually leave one integer.
"""

import math

from simsp.calibrate.nccl_log import TYPE_BYTES, NcclTestsLog, Row


def rank_candidates(log: NcclTestsLog, at_least: int = 2) -> range:
    """Every rank count the table's numbers allow, from `at_least` up (empty: none does)."""
    from_counts = {row.size_bytes / (row.count * TYPE_BYTES[row.dtype]) for row in log.rows
                   if row.count > 0 and row.size_bytes != row.count * TYPE_BYTES[row.dtype]}
    if from_counts:
        n = max(from_counts)
        ok = len(from_counts) == 1 and n.is_integer() and n >= at_least
        return range(int(n), int(n) + 1) if ok else range(0)
    low, high = float(at_least), math.inf
    for row in log.rows:
        row_low, row_high = _all_reduce_interval(row)
        low, high = max(low, row_low), min(high, row_high)
    if math.isinf(high):
        return range(math.ceil(low), math.ceil(low))  # no row bounds n from above
    return range(math.ceil(low - 1e-9), math.floor(high + 1e-9) + 1)


def _all_reduce_interval(row: Row) -> tuple[float, float]:
    """(lowest, highest) n with busbw = algbw x 2(n-1)/n within the printed rounding of both
    bandwidths, in either half of the row; (0, inf) when a row is too small to say."""
    low, high = 0.0, math.inf
    half = row.bandwidth_half_unit
    for algbw, busbw in zip(row.algbw_GBps, row.busbw_GBps):
        if algbw - half <= 0:
            continue
        ratio_low, ratio_high = (busbw - half) / (algbw + half), (busbw + half) / (algbw - half)
        low = max(low, _n_of_ratio(ratio_low))
        high = min(high, _n_of_ratio(ratio_high))
    return low, high


def _n_of_ratio(ratio: float) -> float:
    """n from busbw/algbw = 2(n-1)/n, i.e. n = 2 / (2 - ratio); inf at or above 2."""
    return math.inf if ratio >= 2 else 2.0 / (2.0 - max(ratio, 0.0))


def describe(candidates: range) -> str:
    """`128` or `126 to 130`: the rank counts the table allows, for a message."""
    if len(candidates) == 1:
        return str(candidates[0])
    return f"{candidates[0]} to {candidates[-1]}"
