"""Spans of one rank laid out for the Chrome trace: merged when over budget, split into lanes
that nest, and the receiving side of every pipeline send made visible (for its flow arrow)."""

import numpy as np

from simsp.engine.trace import Span


def us(seconds: float) -> float:
    """Seconds -> microseconds, rounded to the nanosecond (short, exact JSON numbers)."""
    return round(seconds * 1e6, 3)


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


def lanes(spans: list) -> list[list[tuple[float, float, object]]]:
    """Spans as [(ts_us, end_us, span)] per lane, each lane sorted by start, longest first.

    Perfetto needs the slices of one thread to nest; sends and receives of the pipeline track
    overlap, so a span goes to the first lane whose previous span has ended."""
    rows = sorted(((us(s.start_s), us(s.end_s), i) for i, s in enumerate(spans)),
                  key=lambda r: (r[0], -r[1], r[2]))
    lanes, lane_end = [], []
    for ts, end, i in rows:
        lane = 0
        while lane < len(lanes) and lane_end[lane] > ts:
            lane += 1
        if lane == len(lanes):
            lanes.append([])
            lane_end.append(end)
        lanes[lane].append((ts, end, spans[i]))
        lane_end[lane] = end
    return lanes


def is_send(span: Span) -> bool:
    """A pipeline send: it names its receiver (p2p.send records `to`)."""
    return span.track == "pp_comm" and span.name.startswith("send ") and "to" in span.args


def is_visible(span: Span) -> bool:
    """A span that lasts at least a nanosecond once rounded for the trace."""
    return us(span.end_s) > us(span.start_s)


def receive_key(rank: int, span: Span) -> tuple:
    """(receiving rank, "act mb3", arrival time) of a send, or of a receive that waited."""
    return rank, span.name.split(" ", 1)[1], span.end_s


def with_arrivals(by_rank: dict) -> dict:
    """Add an "arrive" span on the receiver for each send whose receiver did not wait for it.

    A receive that waited is a span ending at the arrival; one that did not wait (or for less
    than a nanosecond) left none that can be seen, so the transfer (send start to arrival) is shown on the receiver, for the flow arrow to land."""
    waited = {receive_key(rank, s) for rank, tracks in by_rank.items()
              for s in tracks.get("pp_comm", ()) if s.name.startswith("recv ") and is_visible(s)}
    for rank, tracks in list(by_rank.items()):
        for send in [s for s in tracks.get("pp_comm", ()) if is_send(s)]:
            dst = send.args["to"]
            key = receive_key(dst, send)
            if dst in by_rank and key not in waited:
                arrive = Span(dst, "pp_comm", f"arrive {key[1]}", send.start_s, send.end_s,
                              {"from": rank, "bytes": send.args.get("bytes", 0)})
                by_rank[dst].setdefault("pp_comm", []).append(arrive)
    return by_rank
