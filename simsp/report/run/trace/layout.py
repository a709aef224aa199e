"""Spans of one rank laid out for the Chrome trace: merged when over budget, split into lanes
that nest, and each pipeline transfer tied to the p2p call spans that enclose it."""

import numpy as np


def ns_array(seconds: list) -> np.ndarray:
    """Seconds -> whole nanoseconds, (n,) float (rounded half to even, as round() does)."""
    return np.rint(np.asarray(seconds, dtype=float) * 1e9)


def coarsen(spans: list, steps: list) -> list:
    """Merge a detail track's spans that fall in the same schedule step into one span each.

    Spans outside every step (embedding, gradient reduction, optimizer) are kept as they are.
    The merged span covers first start to last end and records how many spans it holds."""
    bounds = sorted((s.start_s, s.end_s, s.name) for s in steps)
    begins = [b[0] for b in bounds]
    groups, loose = {}, []
    for span in spans:
        i = int(np.searchsorted(begins, span.start_s, side="right")) - 1
        if i >= 0 and span.end_s <= bounds[i][1]:
            groups.setdefault(i, []).append(span)
        else:
            loose.append(span)
    merged = []
    for i, members in groups.items():
        first = members[0]
        busy = sum(s.end_s - s.start_s for s in members)
        count = sum(int(s.args.get("spans", 1)) for s in members)
        merged.append(first._replace(
            name=f"{first.track} {bounds[i][2]}", start_s=min(s.start_s for s in members),
            end_s=max(s.end_s for s in members), args={"busy_s": busy, "spans": count}))
    return merged + loose


def lane_members(start: np.ndarray, end: np.ndarray) -> list[np.ndarray]:
    """Spans (start, end in ns (n,)) in lanes: each lane's indices (k,), sorted by start,
    longest first.

    Perfetto needs the slices of one thread to nest; sends and receives of the pipeline track
    overlap, so a span goes to the first lane whose previous span has ended."""
    if not len(start):
        return []
    end = np.maximum(end, start)  # (n,)
    order = np.lexsort((np.arange(len(start)), -end, start))  # (n,) by start, longest first
    start, end = start[order], end[order]
    if np.all(start[1:] >= end[:-1]):  # nothing overlaps: one lane
        return [order]
    return [order[members] for members in _greedy_lanes(start.tolist(), end.tolist())]


def _greedy_lanes(start: list, end: list) -> list[np.ndarray]:
    """The members (positions, in start order) of each lane: each span into the first lane
    whose last span has ended."""
    placed, lane_end = [], []
    for i, begin in enumerate(start):
        lane = 0
        while lane < len(placed) and lane_end[lane] > begin:
            lane += 1
        if lane == len(placed):
            placed.append([])
            lane_end.append(end[i])
        placed[lane].append(i)
        lane_end[lane] = end[i]
    return [np.array(members, dtype=np.int64) for members in placed]  # (lane size,) each


def enclosing_calls(call_start: np.ndarray, call_end: np.ndarray, start: np.ndarray,
                    end: np.ndarray) -> np.ndarray:
    """For each transfer over [start, end] (n,), the index of the call (calls sorted by start:
    call_start, call_end (c,)) that encloses it, or -1: the latest starting one with start <=
    the transfer's start and end >= its end. One searchsorted; only a transfer whose
    latest-starting call ended too early is searched backwards, one by one."""
    latest = np.searchsorted(call_start, start, side="right") - 1  # (n,)
    if not len(call_start):
        return latest  # all -1
    fits = (latest >= 0) & (call_end[np.maximum(latest, 0)] >= end)  # (n,)
    found = np.where(fits, latest, -1)  # (n,)
    for i in np.flatnonzero(~fits & (latest >= 0)).tolist():
        earlier = np.flatnonzero(call_end[:latest[i] + 1] >= end[i])  # (k,)
        found[i] = earlier[-1] if len(earlier) else -1
    return found
