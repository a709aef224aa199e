"""How much of each pixel column a set of time intervals covers, with numpy: what an exact
(area-weighted) rasteriser would paint, at a cost that does not grow with bars per pixel.

Intervals are (n, 2) arrays of [start, end]; pixel columns are given by their n + 1 edges.
"""

import numpy as np


def union(intervals: np.ndarray) -> np.ndarray:
    """(m, 2): the disjoint, sorted union of `intervals` (n, 2); touching ones merge."""
    spans = intervals[intervals[:, 1] > intervals[:, 0]]  # (k, 2) non-empty only
    if not len(spans):
        return np.zeros((0, 2))
    spans = spans[np.argsort(spans[:, 0], kind="stable")]
    reach = np.maximum.accumulate(spans[:, 1])  # (k,) furthest end so far
    new = np.r_[True, spans[1:, 0] > reach[:-1]]  # (k,) starts a new group
    first = np.flatnonzero(new)  # (m,)
    last = np.r_[first[1:] - 1, len(spans) - 1]  # (m,)
    return np.column_stack([spans[first, 0], reach[last]])


def covered_up_to(disjoint: np.ndarray, points: np.ndarray) -> np.ndarray:
    """(p,): length of `disjoint` (m, 2, sorted, non-overlapping) that lies before each point."""
    if not len(disjoint):
        return np.zeros(len(points))
    lengths = disjoint[:, 1] - disjoint[:, 0]  # (m,)
    before = np.cumsum(lengths) - lengths  # (m,) covered before each interval starts
    xp = disjoint.reshape(-1)  # (2m,) start0, end0, start1, ...
    fp = np.column_stack([before, before + lengths]).reshape(-1)  # (2m,)
    return np.interp(points, xp, fp)


def pixel_coverage(intervals: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """(w,): the fraction of each pixel column (between consecutive `edges`, (w + 1,)) that the
    union of `intervals` covers."""
    covered = covered_up_to(union(intervals), edges)  # (w + 1,)
    return np.diff(covered) / np.diff(edges)


def painted_shares(layers: list[np.ndarray], edges: np.ndarray) -> np.ndarray:
    """(k, w): the share of each pixel column each layer shows when the k layers (each (n, 2)
    intervals) are painted in order, later ones on top; the shares of a column sum to <= 1."""
    shares, above = [], np.zeros((0, 2))
    hidden = np.zeros(len(edges) - 1)  # (w,) covered by the layers above
    for layer in reversed(layers):
        above = np.vstack([above, layer])
        seen = pixel_coverage(above, edges)  # (w,)
        shares.append(np.clip(seen - hidden, 0.0, 1.0))
        hidden = seen
    return np.array(shares[::-1]).reshape(len(layers), len(edges) - 1)
