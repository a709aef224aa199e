"""The trace laid out, less the formatting: each simulated rank's threads (a track, or one of its
extra lanes), their spans as numeric columns, and the flow arrows between the p2p calls.

The recorded spans and transfers are transposed once into arrays; grouping, ordering, lanes and
the calls that enclose each transfer are numpy work on those, and no per-span object is made
(report/run/trace/events.py formats the result; report/run/trace/writer.py writes it).
"""

from typing import NamedTuple

import numpy as np

from simsp.engine.trace import DETAIL_TRACKS
from simsp.report.run.trace.events import Flows, Lane, lane_args, metadata, string
from simsp.report.run.trace.overlaps import annotate
from simsp.report.run.trace.layout import coarsen, enclosing_calls, lane_members, ns_array
from simsp.report.run.step_kinds import TRACE_COLOURS, paired_steps, span_kind


TRACKS = (("compute", "compute"), ("tp_comm", "TP communication"),
          ("pp_comm", "pipeline transfers"), ("dp_comm", "DP communication"),
          ("schedule", "schedule"))
SPAN_BUDGET = 300_000  # spans of the detail tracks over all ranks, before merging
MIN_DETAIL_SPANS = 1000  # per rank and detail track, whatever the budget


class TracePlan(NamedTuple):
    """Per rank in display order its events (ready text, and Lanes of X events), the name
    table the Lanes index (JSON string literals), and the flow arrows."""

    ranks: list  # (rank, [str | Lane])
    names: list
    flows: Flows


class Recorded(NamedTuple):
    """The spans to draw as columns (n,) each, and the per-span fields kept as lists."""

    spans: list  # Span
    rank: np.ndarray  # (n,) int
    track: np.ndarray  # (n,) int: index into `tracks`
    start_s: np.ndarray  # (n,) float: seconds
    end_s: np.ndarray  # (n,) float
    start_ns: np.ndarray  # (n,) float: whole nanoseconds
    end_ns: np.ndarray  # (n,) float
    name: np.ndarray  # (n,) int: index into the name table
    has_args: np.ndarray  # (n,) bool
    tracks: list  # str


def trace_plan(run, detail: str) -> TracePlan:
    """Every event of the trace but the memory counters, laid out: per rank (pipeline order)
    process and thread metadata and its spans' Lanes; then the flow arrows."""
    grid = run.inputs.world.grid
    ranks = sorted(set(run.inputs.world.ranks) - run.inputs.replayed,  # replayed: untraced
                   key=lambda r: (grid.coords(r).pp, grid.coords(r).dp, r))
    names: dict[str, int] = {}
    spans = _recorded(run.inputs.world.trace.spans, set(ranks), detail, names)
    groups = _groups(spans)
    max_detail = max(MIN_DETAIL_SPANS, SPAN_BUDGET // (len(DETAIL_TRACKS) * len(ranks)))
    tid_of = np.zeros(len(spans.spans), dtype=np.int64)  # (n,) thread of each span drawn
    items = [(rank, _rank_head(run, rank, position)
              + _rank_threads(rank, spans, groups.get(rank, {}), detail, max_detail, names,
                              tid_of, paired_steps(run, rank)))
             for position, rank in enumerate(ranks)]
    flows = _flows(run.inputs.world.trace.transfers, spans, groups, tid_of)
    return TracePlan(items, [string(name) for name in names], flows)


def _recorded(spans: list, ranks: set, detail: str, names: dict) -> Recorded:
    """The spans of the simulated ranks on the tracks drawn at `detail`, as columns; their
    names join the `names` table."""
    skip = () if detail == "full" else DETAIL_TRACKS
    kept = [s for s in spans if s.rank in ranks and s.track not in skip]
    if detail == "full":  # communication spans say what compute hid them (overlaps.py)
        kept = annotate(kept)
    rank, track, name, start, end, args = zip(*kept) if kept else ((),) * 6
    for distinct in dict.fromkeys(name):  # first appearance order, once each
        names.setdefault(distinct, len(names))
    tracks = {t: i for i, t in enumerate(dict.fromkeys(track))}
    start, end = np.array(start, dtype=float), np.array(end, dtype=float)  # (n,) each
    return Recorded(kept, np.array(rank, dtype=np.int64),
                    np.fromiter(map(tracks.__getitem__, track), np.int64, len(kept)),
                    start, end, ns_array(start), ns_array(end),
                    np.fromiter(map(names.__getitem__, name), np.int64, len(kept)),
                    np.fromiter(map(bool, args), bool, len(kept)), list(tracks))


def _groups(spans: Recorded) -> dict[int, dict[str, np.ndarray]]:
    """{rank: {track: indices of its spans in recording order (m,)}}."""
    key = spans.rank * len(spans.tracks) + spans.track  # (n,)
    order = np.argsort(key, kind="stable")  # (n,)
    cuts = np.flatnonzero(np.diff(key[order])) + 1  # (groups - 1,)
    groups: dict[int, dict[str, np.ndarray]] = {}
    for members in np.split(order, cuts) if len(order) else []:
        first = members[0]
        groups.setdefault(int(spans.rank[first]), {})[spans.tracks[spans.track[first]]] = members
    return groups


def _tracks_in_order(tracks: dict, detail: str) -> list[str]:
    """The rank's tracks to draw: TRACKS order (detail tracks only at "full"), unknown after."""
    known = [t for t, _ in TRACKS if detail == "full" or t not in DETAIL_TRACKS]
    labels = dict(TRACKS)
    return known + sorted(t for t in tracks if t not in labels)


def _rank_head(run, rank: int, position: int) -> list[str]:
    """One rank's process metadata."""
    c = run.inputs.world.grid.coords(rank)
    return [metadata(rank, 0, "process_name",
                     {"name": f"rank {rank} (tp {c.tp}, pp {c.pp}, dp {c.dp})"}),
            metadata(rank, 0, "process_sort_index", {"sort_index": position})]


class LaneSpans(NamedTuple):
    """One lane's spans in display order, less its thread: (m,) columns."""

    indices: np.ndarray  # int: the spans' indices among those recorded (none when merged)
    start_ns: np.ndarray  # float
    end_ns: np.ndarray  # float
    names: np.ndarray  # int: index into the name table
    args: list | None  # each span's args dict, or None when no span has any


def _rank_threads(pid: int, spans: Recorded, tracks: dict, detail: str, max_detail: int,
                  names: dict, tid_of: np.ndarray, paired: frozenset) -> list:
    """Thread metadata and Lanes of one rank, threads numbered 1, 2, ... in display order
    (each track, then its extra lanes); `tid_of` gets each drawn span's thread; schedule
    steps are coloured by kind (`paired`: the rank's F&B pair steps, report/run/step_kinds.py)."""
    labels, out, tid = dict(TRACKS), [], 0
    for track in _tracks_in_order(tracks, detail):
        members = tracks.get(track, np.zeros(0, dtype=np.int64))
        if track in DETAIL_TRACKS and len(members) > max_detail:
            lanes = _merged_lanes(spans, members, tracks, names)
        else:
            lanes = _lanes(spans, members)
        for lane, drawn in enumerate(lanes or [None]):
            tid += 1
            label = labels.get(track, track) + (f" #{lane + 1}" if lane else "")
            out.append(metadata(pid, tid, "thread_name", {"name": label}))
            out.append(metadata(pid, tid, "thread_sort_index", {"sort_index": tid}))
            if drawn is not None:
                cnames = _step_colours(drawn, names, paired) if track == "schedule" else None
                out.append(_lane(pid, tid, track, drawn, cnames))
                tid_of[drawn.indices] = tid
    return out


def _lanes(spans: Recorded, members: np.ndarray) -> list[LaneSpans]:
    """A track's spans (indices `members` (m,)) in lanes that nest."""
    start, end = spans.start_ns[members], spans.end_ns[members]  # (m,) each
    with_args = spans.has_args[members].any()
    lanes = []
    for order in lane_members(start, end):
        drawn = members[order]  # (k,)
        args = [spans.spans[i].args for i in drawn.tolist()] if with_args else None
        lanes.append(LaneSpans(drawn, start[order], end[order], spans.name[drawn], args))
    return lanes


def _merged_lanes(spans: Recorded, members: np.ndarray, tracks: dict,
                  names: dict) -> list[LaneSpans]:
    """A detail track over budget: its spans merged per schedule step (layout.py coarsen),
    then laid out like any track (merged spans are no arrow's end: no indices)."""
    steps = [spans.spans[i] for i in tracks.get("schedule", np.zeros(0, np.int64)).tolist()]
    merged = coarsen([spans.spans[i] for i in members.tolist()], steps)
    start = ns_array([s.start_s for s in merged])  # (m,)
    end = ns_array([s.end_s for s in merged])  # (m,)
    ids = np.array([names.setdefault(s.name, len(names)) for s in merged], dtype=np.int64)
    return [LaneSpans(np.zeros(0, np.int64), start[order], end[order], ids[order],
                      [merged[i].args for i in order.tolist()])
            for order in lane_members(start, end)]


def _step_colours(drawn: LaneSpans, names: dict, paired: frozenset) -> list[str]:
    """(m,) the trace-viewer colour of each schedule step by its kind (F, B, W, F&B)."""
    text = list(names)  # the name table in index order
    return [TRACE_COLOURS[span_kind(text[i], paired)] for i in drawn.names.tolist()]


def _lane(pid: int, tid: int, track: str, drawn: LaneSpans, cnames: list | None = None) -> Lane:
    """The Lane (columns for events.py's text) of one thread's spans (`cnames`: (m,) colours)."""
    start = drawn.start_ns.astype(np.int64)  # (m,) whole ns
    end = np.maximum(drawn.end_ns.astype(np.int64), start)  # (m,)
    fields = lane_args(drawn.args) if drawn.args is not None else {}
    return Lane(pid, tid, track, start, end - start, drawn.names, cnames=cnames, **fields)


def _flows(transfers: list, spans: Recorded, groups: dict, tid_of: np.ndarray) -> Flows:
    """An arrow per pipeline transfer between simulated ranks, from the sender's p2p call span
    (the one that encloses the transfer) to the receiver's; it leaves a quarter into the
    transfer and lands a quarter before its end, strictly inside both call slices."""
    p2p = [t for t in transfers if t.label.startswith("p2p")]
    src, dst, _, start, end, labels = zip(*p2p) if p2p else ((),) * 6
    src, dst = np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)  # (n,)
    start, end = np.array(start, dtype=float), np.array(end, dtype=float)  # (n,)
    sends = _calls(spans, groups, src, start, end)  # (n,) span index or -1
    recvs = _calls(spans, groups, dst, start, end)  # (n,)
    kept = np.flatnonzero((sends >= 0) & (recvs >= 0))  # (k,)
    quarter = (end[kept] - start[kept]) / 4  # (k,)
    return Flows(src[kept], dst[kept], tid_of[sends[kept]], tid_of[recvs[kept]],
                 ns_array(start[kept] + quarter).astype(np.int64),
                 ns_array(end[kept] - quarter).astype(np.int64),
                 [labels[i] for i in kept.tolist()])


def _calls(spans: Recorded, groups: dict, ranks: np.ndarray, start: np.ndarray,
           end: np.ndarray) -> np.ndarray:
    """For each transfer (on `ranks` (n,), over [start, end] (n,) seconds), the index of the
    p2p call span on its rank that encloses it, or -1 (and -1 off the simulated ranks)."""
    found = np.full(len(ranks), -1, dtype=np.int64)  # (n,)
    for rank in np.unique(ranks).tolist():
        calls = groups.get(rank, {}).get("pp_comm")
        if calls is None:
            continue
        calls = calls[np.argsort(spans.start_s[calls], kind="stable")]  # (c,) by start
        on_rank = np.flatnonzero(ranks == rank)  # (m,)
        at = enclosing_calls(spans.start_s[calls], spans.end_s[calls], start[on_rank],
                             end[on_rank])  # (m,)
        found[on_rank[at >= 0]] = calls[at[at >= 0]]
    return found
