"""Spans of one rank laid out for the Chrome trace: merged when over budget, split into lanes
that nest, and the receiving side of every pipeline send made visible (for its flow arrow)."""

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


def is_visible(span: Span) -> bool:
    """A span that lasts at least a nanosecond once rounded for the trace."""
    return round(span.end_s * 1e9) > round(span.start_s * 1e9)


def pipeline_links(by_rank: dict) -> list[tuple[Span, Span]]:
    """(send, receive) span pairs of every pipeline transfer between simulated ranks.

    p2p.send names the receiver (`to`); the receive is the receiver's wait ending at the
    arrival. A receiver that did not wait (or for less than a nanosecond) left no visible
    span, so an "arrive" span (send start to arrival) is added to its pipeline track for the
    flow arrow to land on."""
    waits = {(rank, s.name[5:], s.end_s): s for rank, tracks in by_rank.items()
             for s in tracks.get("pp_comm", ()) if s.name[:5] == "recv " and is_visible(s)}
    links = []
    for rank in sorted(by_rank):
        for send in list(by_rank[rank].get("pp_comm", ())):
            dst = send.args.get("to")
            if send.name[:5] != "send " or dst not in by_rank:
                continue
            what = send.name[5:]
            recv = waits.get((dst, what, send.end_s))
            if recv is None:
                recv = Span(dst, "pp_comm", "arrive " + what, send.start_s, send.end_s,
                            {"from": rank, "bytes": send.args.get("bytes", 0)})
                by_rank[dst].setdefault("pp_comm", []).append(recv)
            links.append((send, recv))
    return links
