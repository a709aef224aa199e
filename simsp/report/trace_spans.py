"""Spans of one rank laid out for the Chrome trace: merged when over budget, split into lanes
that nest, and each pipeline transfer tied to the p2p call spans of its two ranks."""

from operator import attrgetter

import numpy as np

from simsp.engine.trace import Span


def us(seconds: float) -> float:
    """Seconds -> microseconds rounded to the nanosecond: ns / 1000, whose repr is short."""
    return round(seconds * 1e9) / 1e3


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


def lanes(spans: list) -> list[list[tuple[float, float, Span]]]:
    """Spans as [(ts_us, dur_us, span)] per lane, each lane sorted by start, longest first.

    Perfetto needs the slices of one thread to nest; sends and receives of the pipeline track
    overlap, so a span goes to the first lane whose previous span has ended."""
    if not spans:
        return []
    start = ns_array([s.start_s for s in spans])  # (n,)
    end = np.maximum(ns_array([s.end_s for s in spans]), start)  # (n,)
    order = np.lexsort((np.arange(len(spans)), -end, start))  # (n,) by start, longest first
    start, end = start[order], end[order]
    ts, dur = (start / 1e3).tolist(), ((end - start) / 1e3).tolist()
    ordered = [spans[i] for i in order.tolist()]
    if np.all(start[1:] >= end[:-1]):  # nothing overlaps: one lane
        return [list(zip(ts, dur, ordered))]
    return _greedy_lanes(start.tolist(), end.tolist(), ts, dur, ordered)


def _greedy_lanes(start: list, end: list, ts: list, dur: list, spans: list) -> list:
    """Each span (in start order) into the first lane whose last span has ended."""
    placed, lane_end = [], []
    for i, span in enumerate(spans):
        lane = 0
        while lane < len(placed) and lane_end[lane] > start[i]:
            lane += 1
        if lane == len(placed):
            placed.append([])
            lane_end.append(end[i])
        placed[lane].append((ts[i], dur[i], span))
        lane_end[lane] = end[i]
    return placed


_START, _END = attrgetter("start_s"), attrgetter("end_s")
_SRC, _DST, _LABEL = attrgetter("src"), attrgetter("dst"), attrgetter("label")


def pipeline_links(by_rank: dict, transfers: list) -> list[tuple]:
    """(transfer, sender's span, receiver's span) of every pipeline transfer between simulated
    ranks: each side's p2p call span (training/p2p.py) that encloses the transfer, since a call
    is posted before its transfers start and completes after they end."""
    calls = {rank: sorted(tracks.get("pp_comm", ()), key=_START)
             for rank, tracks in by_rank.items()}
    p2p = [t for t in transfers
           if t.label.startswith("p2p") and t.src in calls and t.dst in calls]
    if not p2p:
        return []
    src, dst = (np.fromiter(map(get, p2p), np.int64, len(p2p)) for get in (_SRC, _DST))  # (n,)
    starts, ends = (np.fromiter(map(get, p2p), float, len(p2p)) for get in (_START, _END))
    sends = _enclosing_all(calls, src, starts, ends, p2p)
    recvs = _enclosing_all(calls, dst, starts, ends, p2p)
    return [(t, send, recv) for t, send, recv in zip(p2p, sends, recvs)
            if send is not None and recv is not None]


def _enclosing_all(calls: dict, ranks: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                   transfers: list) -> list:
    """For each transfer (on `ranks` (n,), over [`starts`, `ends`] (n,)), the call span on its
    rank that encloses it, or None: the latest starting one with start <= transfer start and
    end >= transfer end. One searchsorted per rank; only a transfer whose latest-starting call
    ended too early is searched backwards, one by one."""
    found = np.full(len(ranks), None, dtype=object)  # (n,)
    for rank in np.unique(ranks).tolist():
        members = np.flatnonzero(ranks == rank)  # (m,)
        spans = np.empty(len(calls[rank]), dtype=object)  # (calls,) the call spans, by start
        spans[:] = calls[rank]
        call_starts = np.fromiter(map(_START, spans), float, len(spans))  # (calls,)
        call_ends = np.fromiter(map(_END, spans), float, len(spans))  # (calls,)
        latest = np.searchsorted(call_starts, starts[members], side="right") - 1  # (m,)
        fits = (latest >= 0) & (call_ends[np.maximum(latest, 0)] >= ends[members])  # (m,)
        found[members[fits]] = spans[latest[fits]]
        for i, j in zip(members[~fits].tolist(), latest[~fits].tolist()):
            found[i] = _enclosing(calls[rank], transfers[i], j)
    return found.tolist()


def _enclosing(spans: list, t, latest: int) -> Span | None:
    """The latest-starting span at or before index `latest` with end >= t.end_s, if any."""
    for i in range(latest, -1, -1):
        if spans[i].end_s >= t.end_s:
            return spans[i]
    return None
