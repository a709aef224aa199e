"""Chrome trace event format (opens in Perfetto, ui.perfetto.dev): one process per simulated rank.

Each process has one thread per track (compute, TP communication, pipeline transfers, DP
communication, schedule) holding complete ("X") events for the spans, and a memory counter
("C") built from the rank's ledger. Timestamps are microseconds rounded to the nanosecond.
Output is deterministic: events in a fixed order, compact JSON.

Paper-scale runs record hundreds of thousands of spans and millions of ledger events, so the
file is kept to a budget (~50 MB for the 530B model): the memory counter is downsampled to at
most `MAX_MEMORY_POINTS` per rank and `MEMORY_POINTS_BUDGET` over all ranks (the peak kept
exactly), and a detail track (compute, TP communication) with more spans than its share of
`SPAN_BUDGET` has its spans merged per schedule step. Schedule and pipeline tracks stay complete.
"""

import gc
import json
from operator import itemgetter
from pathlib import Path

import numpy as np

from simsp.engine.ledger import CATEGORIES
from simsp.engine.mem_log import sort_log

TRACKS = (("compute", "compute"), ("tp_comm", "TP communication"),
          ("pp_comm", "pipeline transfers"), ("dp_comm", "DP communication"),
          ("schedule", "schedule"))
COARSENED = ("compute", "tp_comm")  # tracks whose spans may be merged within a schedule step
MAX_MEMORY_POINTS = 2000  # per rank
MEMORY_POINTS_BUDGET = 80_000  # over all ranks
MIN_MEMORY_POINTS = 200  # per rank, whatever the budget
SPAN_BUDGET = 300_000  # spans of the detail tracks over all ranks, before merging
MIN_DETAIL_SPANS = 1000  # per rank and detail track, whatever the budget


def _us(seconds: float) -> float:
    """Seconds -> microseconds, rounded to the nanosecond (short, exact JSON numbers)."""
    return round(seconds * 1e6, 3)


# ---------------------------------------------------------------- memory timeline

def memory_timeline(log, max_points: int = MAX_MEMORY_POINTS):
    """A ledger (or a list of MemEvents) -> (times_s, bytes per category (n, 6) int64), at most
    `max_points` rows.

    The log is read in time order (stable, ties in recording order, as the ledger's summary
    does). Beyond `max_points` changes, the timeline is split into (max_points - 2) // 2 equal
    time buckets that each keep their highest and lowest state, plus the first and last, so the
    maximum of the total is exactly the ledger's peak."""
    records = log.records if hasattr(log, "records") else list(log)
    if not records:
        return np.zeros(0), np.zeros((0, len(CATEGORIES)), dtype=np.int64)
    times, codes, deltas, _ = log.sorted_log() if hasattr(log, "records") else sort_log(
        records, CATEGORIES)
    n = len(times)
    steps = np.zeros((n, len(CATEGORIES)), dtype=np.int64)  # (n, 6)
    steps[np.arange(n), codes] = deltas
    state = np.cumsum(steps, axis=0)  # (n, 6): bytes per category after each change
    keep = _downsample(times, state.sum(axis=1), max_points)
    return times[keep], state[keep]


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


def _counter_events(pid: int, ledger, max_points: int) -> list[dict]:
    """The "memory" counter (bytes per category; the stack is the total) and "memory total"."""
    times, state = memory_timeline(ledger, max_points)
    out = []
    for t, row in zip(times.tolist(), state.tolist()):
        ts = _us(t)
        out.append({"ph": "C", "pid": pid, "name": "memory", "ts": ts,
                    "args": dict(zip(CATEGORIES, row))})
        out.append({"ph": "C", "pid": pid, "name": "memory total", "ts": ts,
                    "args": {"bytes": sum(row)}})
    return out


# ---------------------------------------------------------------- spans

def _coarsen(spans: list, steps: list) -> list:
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


def _lanes(spans: list) -> list[list[tuple[float, float, object]]]:
    """Spans as [(ts_us, end_us, span)] per lane, each lane sorted by start, longest first.

    Perfetto needs the slices of one thread to nest; sends and receives of the pipeline track
    overlap, so a span goes to the first lane whose previous span has ended."""
    rows = sorted(((_us(s.start_s), _us(s.end_s), i) for i, s in enumerate(spans)),
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


def _args(args: dict) -> dict:
    """Span arguments for JSON, floats rounded to 1e-9 (seconds: nanoseconds)."""
    return {k: round(v, 9) if isinstance(v, float) else v for k, v in args.items()}


def _rank_events(pid: int, spans_by_track: dict,
                 max_detail: int) -> tuple[list[dict], list[dict]]:
    """(thread metadata, X events) of one rank; tracks in TRACKS order, unknown ones after."""
    known = [t for t, _ in TRACKS]
    names = dict(TRACKS)
    order = known + sorted(t for t in spans_by_track if t not in names)
    meta, xs = [], []
    tid = 0  # threads numbered 1, 2, ... in display order: each track, then its extra lanes
    for track in order:
        spans = spans_by_track.get(track, [])
        if track in COARSENED and len(spans) > max_detail:
            spans = _coarsen(spans, spans_by_track.get("schedule", []))
        for lane, placed in enumerate(_lanes(spans) or [[]]):
            tid += 1
            label = names.get(track, track) + (f" #{lane + 1}" if lane else "")
            meta.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                         "args": {"name": label}})
            meta.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                         "args": {"sort_index": tid}})
            for ts, end, span in placed:
                event = {"ph": "X", "pid": pid, "tid": tid, "name": span.name,
                         "ts": ts, "dur": round(max(end - ts, 0.0), 3)}
                if span.args:
                    event["args"] = _args(span.args)
                xs.append(event)
    return meta, xs


# ---------------------------------------------------------------- document

def trace_events(run) -> list[dict]:
    """Every trace event of `run`: per rank (in pipeline order) metadata, spans, memory."""
    grid = run.world.grid
    by_rank = {rank: {} for rank in run.world.ranks}
    for span in run.world.trace.spans:
        if span.rank in by_rank:
            by_rank[span.rank].setdefault(span.track, []).append(span)
    ranks = sorted(run.world.ranks, key=lambda r: (grid.coords(r).pp, grid.coords(r).dp, r))
    max_detail = max(MIN_DETAIL_SPANS, SPAN_BUDGET // (len(COARSENED) * len(ranks)))
    max_points = min(MAX_MEMORY_POINTS,
                     max(MIN_MEMORY_POINTS, MEMORY_POINTS_BUDGET // max(len(ranks), 1)))
    events = []
    for position, rank in enumerate(ranks):
        c = grid.coords(rank)
        events.append({"ph": "M", "pid": rank, "tid": 0, "name": "process_name",
                       "args": {"name": f"rank {rank} (tp {c.tp}, pp {c.pp}, dp {c.dp})"}})
        events.append({"ph": "M", "pid": rank, "tid": 0, "name": "process_sort_index",
                       "args": {"sort_index": position}})
        meta, xs = _rank_events(rank, by_rank[rank], max_detail)
        events += meta + xs
        events += _counter_events(rank, run.world.ranks[rank].ledger, max_points)
    return events


def write_chrome_trace(run, path) -> Path:
    """Write `run`'s trace as Chrome trace JSON to `path` and return the path."""
    path = Path(path)
    collecting = gc.isenabled()
    gc.disable()  # ~10^6 fresh dicts: the cyclic collector would rescan them over and over
    try:
        doc = {"displayTimeUnit": "ms", "traceEvents": trace_events(run),
               "otherData": {"scenario": run.sc.run.name, "mode": run.sc.run.mode,
                             "memory_unit": "bytes", "time_unit": "us"}}
        path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    finally:
        if collecting:
            gc.enable()
    return path
