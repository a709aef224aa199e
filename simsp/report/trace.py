"""trace.json, the Chrome trace of a run (open it in Perfetto): each simulated rank's spans by
track, the pipeline transfers with a flow arrow from each send to its receive, and every
stage's memory by category as counters.

Sections, bottom up: text columns (rows of text assembled a column at a time with numpy),
span layout (merging over budget, lanes that nest, the calls enclosing each transfer), event
text (complete events, flows and metadata as JSON text), the plan (threads, lanes and spans as
numeric columns), and the writer. The spans themselves are recorded by engine/trace.py during
the simulation. Formatting a column at a time instead of an event at a time is what keeps a
paper-scale trace to a fraction of a second
(docs/PERFORMANCE.md#reports-formatting-a-column-at-a-time); tests/test_text_columns.py
shows the text equals what str() and repr() write.
"""

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from simsp.engine.memory import CATEGORIES
from simsp.engine.trace import DETAIL_TRACKS
from simsp.io_out import open_atomic
from simsp.report.figures import MAX_MEMORY_POINTS, memory_timeline


# ---------------------------------------------------------------------------------------------
# Text columns
# ---------------------------------------------------------------------------------------------
#
# Rows of text assembled column by column with numpy: the trace's compact encoder
# (docs/PERFORMANCE.md#reports-formatting-a-column-at-a-time).
#
# A column is a byte matrix (one row of characters per text row, or one row shared by all) and a
# mask of the characters that belong to the text. Integers and microsecond timestamps are written
# as decimal digits by integer arithmetic, strings are taken from a table, and a row's text is its
# columns side by side with the unmasked bytes dropped: one boolean gather for a whole chunk of
# rows, where formatting row by row in Python costs a microsecond or more per number.

ZERO = ord("0")
CHUNK_ROWS = 32_768  # rows assembled at a time: bounds the byte matrices (~10 MB)


class Column(NamedTuple):
    """Characters (rows, width) uint8 and which of them are text (rows, width) bool; `rows`
    is the row count, or 1 for a column every row shares."""

    chars: np.ndarray
    keep: np.ndarray


def constant(text: str) -> Column:
    """The same ASCII text in every row."""
    chars = np.frombuffer(text.encode("ascii"), dtype=np.uint8)[None, :]  # (1, w)
    return Column(chars, np.ones(chars.shape, dtype=bool))


def _digits(values: np.ndarray, width: int) -> np.ndarray:
    """Decimal digits of non-negative integers (n,), right-aligned and zero-padded to `width`:
    (n, width) uint8 characters."""
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.uint64)  # (width,)
    return (values.astype(np.uint64)[:, None] // powers % 10 + ZERO).astype(np.uint8)


def _width(values: np.ndarray) -> int:
    """Digits of the largest of non-negative integers (n,); 1 for none."""
    return len(str(int(values.max()))) if len(values) else 1


def integers(values) -> Column:
    """Integers (n,) as str() writes them."""
    values = np.asarray(values, dtype=np.int64)  # (n,)
    negative = values < 0  # (n,)
    magnitude = np.abs(values).astype(np.uint64)  # (n,) |int64 min| fits
    width = _width(magnitude)
    digits = _digits(magnitude, width)  # (n, width)
    lengths = 1 + (magnitude[:, None] >= 10 ** np.arange(1, width, dtype=np.uint64)).sum(axis=1)
    keep = np.arange(width) >= width - lengths[:, None]  # (n, width)
    if not negative.any():
        return Column(digits, keep)
    sign = np.full((len(values), 1), ord("-"), dtype=np.uint8)
    return Column(np.concatenate([sign, digits], axis=1),
                  np.concatenate([negative[:, None], keep], axis=1))


def microseconds(ns) -> Column:
    """Whole nanoseconds (n,) as microseconds, as repr(ns / 1e3) writes them: "12.5", "7.0",
    "0.001". Exact for 0 <= ns < 2**52: below 2**43 a double's spacing is under 1e-3, so no
    string shorter than the decimal ns / 1000 reads back as the same double, and repr writes
    the shortest (and never an exponent between 1e-4 and 1e16)."""
    ns = np.asarray(ns, dtype=np.int64)  # (n,)
    if len(ns) and (ns.min() < 0 or ns.max() >= 2 ** 52):
        raise ValueError("microseconds() writes 0 <= ns < 2**52 only")
    return _decimal(ns, 3)


def seconds_9(values) -> Column:
    """Floats (n,) as repr(round(v, 9)) writes them. Rows where the decimal rounding is not
    certain from v * 1e9 in floating point (a tie within a few ulps), and values outside
    [1e-4, 4e6) where repr would use an exponent or the decimal may not be the shortest
    string, are written by Python itself."""
    values = np.asarray(values, dtype=float)  # (n,)
    with np.errstate(over="ignore", invalid="ignore"):  # huge, inf, NaN: written by Python
        scaled = values * 1e9  # (n,)
        tie = np.abs(scaled - np.floor(scaled) - 0.5) <= 8 * np.spacing(np.abs(scaled))  # (n,)
    nano = np.rint(scaled)  # (n,) the rounded value in units of 1e-9
    zero = (values == 0.0) & ~np.signbit(values)  # (n,) "0.0" (-0.0 is Python's)
    python = tie | ~((values >= 1e-4) & (values < 4e6) | zero)  # (n,) NaN included
    column = _decimal(np.where(python, 0.0, nano).astype(np.int64), 9)
    if not python.any():
        return column
    rows = np.flatnonzero(python)  # (k,)
    exact = table([repr(round(v, 9)) for v in values[rows].tolist()])
    return _replace_rows(column, rows, exact)


def _decimal(units: np.ndarray, places: int) -> Column:
    """Non-negative integers (n,) counting 10**-places as decimals with trailing zeros dropped
    (one kept after the point): 12345 at 3 places is "12.345", 7000 is "7.0"."""
    scale = 10 ** places
    whole = integers(units // scale)
    fraction = _digits(units % scale, places)  # (n, places)
    nonzero = fraction != ZERO  # (n, places)
    last = places - np.argmax(nonzero[:, ::-1], axis=1)  # (n,) digits up to the last nonzero
    kept = np.where(nonzero.any(axis=1), last, 1)  # (n,) ".0" for a whole number
    point = np.full((len(units), 1), ord("."), dtype=np.uint8)
    return Column(np.concatenate([whole.chars, point, fraction], axis=1),
                  np.concatenate([whole.keep, np.ones((len(units), 1), bool),
                                  np.arange(places) < kept[:, None]], axis=1))


def _replace_rows(column: Column, rows: np.ndarray, new: Column) -> Column:
    """`column` with rows `rows` (k,) replaced by the rows of `new` (k rows), left-aligned."""
    width = max(column.chars.shape[1], new.chars.shape[1])
    chars, keep = (np.zeros((len(column.chars), width), dtype) for dtype in (np.uint8, bool))
    for target, source in ((chars, column.chars), (keep, column.keep)):
        target[:, width - source.shape[1]:] = source
    chars[rows], keep[rows] = 0, False
    chars[rows, :new.chars.shape[1]] = new.chars
    keep[rows, :new.chars.shape[1]] = new.keep
    return Column(chars, keep)


def table(values: list[str]) -> Column:
    """Row i is `values[i]` (ASCII strings; also a table to `take` rows from): the strings
    joined and encoded once, each row a window of that buffer."""
    lengths = np.fromiter(map(len, values), np.int64, len(values))  # (rows,)
    width = max(1, int(lengths.max()) if len(values) else 0)
    buffer = np.frombuffer("".join(values).encode("ascii") + bytes(width), dtype=np.uint8)
    starts = np.cumsum(lengths) - lengths  # (rows,)
    return Column(buffer[starts[:, None] + np.arange(width)],  # (rows, width)
                  np.arange(width) < lengths[:, None])


def take(rows: Column, index) -> Column:
    """Row i is row `index[i]` of `rows` (a table)."""
    index = np.asarray(index, dtype=np.int64)  # (n,)
    return Column(rows.chars[index], rows.keep[index])


def rows_text(columns: list[Column], rows: int) -> str:
    """Each row's columns side by side, rows joined by commas ("" for no rows)."""
    pieces = []
    for start in range(0, rows, CHUNK_ROWS):
        stop = min(rows, start + CHUNK_ROWS)
        pieces.append(_chunk(columns, start, stop))
    return ",".join(pieces)


def _chunk(columns: list[Column], start: int, stop: int) -> str:
    """Rows [start, stop) as text, joined by commas."""
    count = stop - start
    part = [c if len(c.chars) == 1 else Column(c.chars[start:stop], c.keep[start:stop])
            for c in columns + [constant(",")]]
    chars = np.concatenate([np.broadcast_to(c.chars, (count, c.chars.shape[1])) for c in part],
                           axis=1)  # (count, width)
    keep = np.concatenate([np.broadcast_to(c.keep, (count, c.keep.shape[1])) for c in part],
                          axis=1)  # (count, width)
    return chars[keep].tobytes()[:-1].decode("ascii")


# ---------------------------------------------------------------------------------------------
# Span layout
# ---------------------------------------------------------------------------------------------
#
# Spans of one rank laid out for the Chrome trace: merged when over budget, split into lanes
# that nest, and each pipeline transfer tied to the p2p call spans that enclose it.

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


# ---------------------------------------------------------------------------------------------
# Event text
# ---------------------------------------------------------------------------------------------
#
# Trace events as JSON text from the plan's columns (the plan, below): the formatting
# half of writing trace.json, done a column at a time (text columns, above).
#
# A thread's complete ("X") events are a Lane: their timestamps, durations and name indices as
# arrays, and their arguments either as one float matrix (every span has the same float-valued
# keys: the common case) or as text.

def plain(text: str) -> bool:
    """Whether json.dumps only quotes `text`: printable ASCII but '"' and '\\'."""
    return text.isascii() and text.isprintable() and '"' not in text and "\\" not in text


def string(text: str) -> str:
    """A JSON string literal, as json.dumps writes it."""
    return f'"{text}"' if plain(text) else json.dumps(text)


def args_text(args: dict) -> str:
    """`,"args":{...}` for span arguments (floats rounded to 1e-9 s), or "" when empty."""
    if not args:
        return ""
    return ',"args":{' + ",".join(f"{string(k)}:{_value(v)}" for k, v in args.items()) + "}"


def _value(value) -> str:
    """One argument value as JSON (floats rounded to 1e-9)."""
    kind = type(value)
    if kind is int:
        return str(value)
    if kind is str:
        return string(value)
    if kind is float:
        return repr(round(value, 9))
    return json.dumps(value, separators=(",", ":"))  # bools, lists...: the general encoder


def metadata(pid: int, tid: int, name: str, args: dict) -> str:
    """A metadata ("M") event: a process or thread name or sort index."""
    return (f'{{"ph":"M","cat":"__metadata","pid":{pid},"tid":{tid},"name":{string(name)}'
            f'{args_text(args)}}}')


@dataclass(frozen=True)
class Lane:
    """One thread's complete events in display order; names index the plan's name table."""

    pid: int
    tid: int
    cat: str
    start_ns: np.ndarray  # (n,) int: start, whole nanoseconds
    dur_ns: np.ndarray  # (n,) int: duration, the same
    names: np.ndarray  # (n,) int: index into the name table (JSON string literals)
    arg_keys: tuple = ()  # float-valued argument keys every span has (with arg_values)
    arg_values: np.ndarray | None = None  # (n, len(arg_keys)) float
    arg_texts: list | None = None  # (n,) `,"args":{...}` each, when spans' arguments differ


@dataclass(frozen=True)
class Flows:
    """The pipeline transfers' arrows: per transfer, its two ends' process, thread and time."""

    src: np.ndarray  # (n,) int: sender rank (pid)
    dst: np.ndarray  # (n,) int: receiver rank
    send_tid: np.ndarray  # (n,) int: thread of the sender's p2p call span
    recv_tid: np.ndarray  # (n,) int: thread of the receiver's p2p call span
    leave_ns: np.ndarray  # (n,) int: where the arrow leaves, whole nanoseconds
    land_ns: np.ndarray  # (n,) int: where it lands
    labels: list  # (n,) str: the transfer's name


def lane_args(args: list[dict]) -> dict:
    """Spans' arguments (m,) as Lane fields: one float matrix when every span has the same
    float-valued keys, else each span's text."""
    keys = tuple(args[0])
    values = list(itertools.chain.from_iterable(map(dict.values, args)))  # (m * keys,)
    if keys and set(map(type, values)) == {float} and all(map(keys.__eq__, map(tuple, args))):
        return {"arg_keys": keys,
                "arg_values": np.array(values, dtype=float).reshape(len(args), len(keys))}
    return {"arg_texts": [args_text(a) for a in args]}


def lane_text(lane: Lane, names: Column) -> str:
    """The lane's X events as JSON text, joined by commas (`names`: the name table)."""
    head = f'{{"ph":"X","cat":{string(lane.cat)},"pid":{lane.pid},"tid":{lane.tid},"name":'
    columns = [constant(head), take(names, lane.names), constant(',"ts":'),
               microseconds(lane.start_ns), constant(',"dur":'), microseconds(lane.dur_ns)]
    if lane.arg_texts is not None:
        columns.append(table(lane.arg_texts))
    for i, key in enumerate(lane.arg_keys):  # float arguments: `,"args":{"key":value,...}`
        columns += [constant(("," if i else ',"args":{') + string(key) + ":"),
                    seconds_9(lane.arg_values[:, i])]
    if lane.arg_keys:
        columns.append(constant("}"))
    return rows_text(columns + [constant("}")], len(lane.names))


def ranks_text(ranks: list[list], names: list[str]) -> list[str]:
    """Each rank's events (ready JSON text, or Lanes to format) joined by commas."""
    name_table = table(names)
    return [",".join(item if isinstance(item, str) else lane_text(item, name_table)
                     for item in items) for items in ranks]


def flows_text(flows: Flows) -> str:
    """Every arrow's two events ("s" binds to the slice around it, "f" to the enclosing one),
    numbered from 1, joined by commas."""
    ids = integers(np.arange(1, len(flows.labels) + 1))
    names = _flow_names(flows.labels)
    columns = [constant('{"ph":"s","cat":"p2p","id":'), ids, constant(',"pid":'),
               integers(flows.src), constant(',"tid":'), integers(flows.send_tid),
               constant(',"name":'), *names, constant(',"ts":'), microseconds(flows.leave_ns),
               constant('},{"ph":"f","cat":"p2p","id":'), ids, constant(',"pid":'),
               integers(flows.dst), constant(',"tid":'), integers(flows.recv_tid),
               constant(',"name":'), *names, constant(',"ts":'), microseconds(flows.land_ns),
               constant(',"bp":"e"}')]
    return rows_text(columns, len(flows.labels))


def _flow_names(labels: list[str]) -> list[Column]:
    """The arrows' names, each transfer's label less "p2p " as a JSON string literal: when
    every label is plain text with that prefix, the labels between two quotes."""
    try:
        column = table(labels)
    except UnicodeEncodeError:  # not ASCII: escaped by json.dumps
        column = None
    if column is not None and _plain_with_prefix(column, b"p2p "):
        column.keep[:, :len(b"p2p ")] = False
        return [constant('"'), column, constant('"')]
    return [table([string(label.removeprefix("p2p ")) for label in labels])]


def _plain_with_prefix(column: Column, prefix: bytes) -> bool:
    """Whether every row starts with `prefix` and all its text is plain (see `plain`)."""
    head = np.frombuffer(prefix, dtype=np.uint8)  # (k,)
    if column.chars.shape[1] < len(head) or not column.keep[:, len(head) - 1].all() \
            or not (column.chars[:, :len(head)] == head).all():
        return False
    text = column.chars[column.keep]  # (characters,)
    return bool(((text >= 0x20) & (text <= 0x7E) & (text != ord('"'))
                 & (text != ord("\\"))).all())


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------
#
# The trace laid out, less the formatting: each simulated rank's threads (a track, or one of its
# extra lanes), their spans as numeric columns, and the flow arrows between the p2p calls.
#
# The recorded spans and transfers are transposed once into arrays; grouping, ordering, lanes and
# the calls that enclose each transfer are numpy work on those, and no per-span object is made
# (event text, above, formats the result; the writer, below, writes it).

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
    ranks = sorted(run.inputs.world.ranks, key=lambda r: (grid.coords(r).pp, grid.coords(r).dp, r))
    names: dict[str, int] = {}
    spans = _recorded(run.inputs.world.trace.spans, set(ranks), detail, names)
    groups = _groups(spans)
    max_detail = max(MIN_DETAIL_SPANS, SPAN_BUDGET // (len(DETAIL_TRACKS) * len(ranks)))
    tid_of = np.zeros(len(spans.spans), dtype=np.int64)  # (n,) thread of each span drawn
    items = [(rank, _rank_head(run, rank, position)
              + _rank_threads(rank, spans, groups.get(rank, {}), detail, max_detail, names,
                              tid_of))
             for position, rank in enumerate(ranks)]
    flows = _flows(run.inputs.world.trace.transfers, spans, groups, tid_of)
    return TracePlan(items, [string(name) for name in names], flows)


def _recorded(spans: list, ranks: set, detail: str, names: dict) -> Recorded:
    """The spans of the simulated ranks on the tracks drawn at `detail`, as columns; their
    names join the `names` table."""
    skip = () if detail == "full" else DETAIL_TRACKS
    kept = [s for s in spans if s.rank in ranks and s.track not in skip]
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
                  names: dict, tid_of: np.ndarray) -> list:
    """Thread metadata and Lanes of one rank, threads numbered 1, 2, ... in display order
    (each track, then its extra lanes); `tid_of` gets each drawn span's thread."""
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
                out.append(_lane(pid, tid, track, drawn))
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
    """A detail track over budget: its spans merged per schedule step (coarsen, in the span layout),
    then laid out like any track (merged spans are no arrow's end: no indices)."""
    steps = [spans.spans[i] for i in tracks.get("schedule", np.zeros(0, np.int64)).tolist()]
    merged = coarsen([spans.spans[i] for i in members.tolist()], steps)
    start = ns_array([s.start_s for s in merged])  # (m,)
    end = ns_array([s.end_s for s in merged])  # (m,)
    ids = np.array([names.setdefault(s.name, len(names)) for s in merged], dtype=np.int64)
    return [LaneSpans(np.zeros(0, np.int64), start[order], end[order], ids[order],
                      [merged[i].args for i in order.tolist()])
            for order in lane_members(start, end)]


def _lane(pid: int, tid: int, track: str, drawn: LaneSpans) -> Lane:
    """The Lane (columns for the event text) of one thread's spans."""
    start = drawn.start_ns.astype(np.int64)  # (m,) whole ns
    end = np.maximum(drawn.end_ns.astype(np.int64), start)  # (m,)
    fields = lane_args(drawn.args) if drawn.args is not None else {}
    return Lane(pid, tid, track, start, end - start, drawn.names, **fields)


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


# ---------------------------------------------------------------------------------------------
# The writer
# ---------------------------------------------------------------------------------------------
#
# Chrome trace event format (opens in Perfetto, ui.perfetto.dev): one process per simulated rank.
#
# Detail (`simsp run --trace`): "steps" keeps the schedule steps, pipeline transfers, DP
# communication and a memory counter ("C") built from the rank's ledger; "full" adds the compute
# and TP-communication tracks, each its own thread. Every event carries a category (`cat`: its
# track, "memory", "p2p" for flows, "__metadata"), and a flow arrow (ph "s" -> "f") links each
# pipeline send to its receive (the two p2p calls that moved it). Timestamps are microseconds rounded to the nanosecond.
#
# The file is written in one pass: each event is encoded straight to compact JSON text (no
# intermediate dicts), in a fixed order, so the same run gives the same bytes: laid out as numeric
# columns (the plan), then formatted a column at a time (event text). It is
# kept to a budget (~50 MB for the 530B model): the memory counter is downsampled to at most
# `MAX_MEMORY_POINTS` per rank and `MEMORY_POINTS_BUDGET` over all ranks (the peak kept exactly),
# and a detail track with more spans than its share of `SPAN_BUDGET` (the plan) has its
# spans merged per schedule step.


DETAILS = ("steps", "full")  # `--trace none` writes no file
MEMORY_POINTS_BUDGET = 80_000  # over all ranks
MIN_MEMORY_POINTS = 200  # per rank, whatever the budget


# ---------------------------------------------------------------- memory counter

def counter_points(run) -> int:
    """Memory samples per rank: MEMORY_POINTS_BUDGET shared by the simulated ranks, within
    [MIN_MEMORY_POINTS, MAX_MEMORY_POINTS]."""
    share = MEMORY_POINTS_BUDGET // max(len(run.inputs.world.ranks), 1)
    return min(MAX_MEMORY_POINTS, max(MIN_MEMORY_POINTS, share))


def counter_lines(pid: int, times: np.ndarray, state: np.ndarray) -> str:
    """The memory counters of one rank from its timeline (times (n,), bytes (n, 6)) as JSON
    text: per sample the "memory" counter (bytes per category; the stack is the total) and the
    "memory total" counter at the same timestamp, joined by commas ("" for no samples)."""
    head = '{"ph":"C","cat":"memory","pid":' + str(pid) + ',"name":'
    stamps = microseconds(ns_array(times).astype(np.int64))
    columns = [constant(head + '"memory","ts":'), stamps, constant(',"args":{')]
    for i, category in enumerate(CATEGORIES):
        columns += [constant(f'{"," if i else ""}"{category}":'), integers(state[:, i])]
    columns += [constant("}}," + head + '"memory total","ts":'), stamps,
                constant(',"args":{"bytes":'), integers(state.sum(axis=1)), constant("}}")]
    return rows_text(columns, len(times))


def stage_counter_lines(memory, max_points: int) -> dict[int, str]:
    """{rank: counter text} of every stage's rank from the memory figures' inputs
    (figures.MemoryFigures: the same timelines), for the painter to make meanwhile."""
    return {stage.rank: counter_lines(stage.rank, *stage.timeline(max_points))
            for stage in memory.memory}


# ---------------------------------------------------------------- document

def _document(run, detail: str, counters=None):
    """The trace's text in pieces: head, each rank's events then its memory counters, the
    arrows, tail; pieces joined by commas, none empty. `counters`: a callable giving {rank:
    counter text} made elsewhere (report/painter.py), asked for once everything else is
    formatted; other ranks' are made here."""
    if detail not in DETAILS:
        raise ValueError(f"trace detail must be one of {DETAILS}, got {detail!r}")
    plan = trace_plan(run, detail)
    ranks = ranks_text([items for _, items in plan.ranks], plan.names)
    flows = flows_text(plan.flows)
    made = counters() if counters is not None else {}
    yield '{"displayTimeUnit":"ms","traceEvents":['
    separator = ""
    for (rank, _), events in zip(plan.ranks, ranks):
        for piece in (events, made[rank] if rank in made else _counters_of(run, rank)):
            if piece:
                yield separator + piece
                separator = ","
    if flows:
        yield separator + flows
    yield '],"otherData":' + _other_data(run, detail) + "}\n"


def _other_data(run, detail: str) -> str:
    """The trace's "otherData": what it shows, and its units."""
    sc = run.inputs.sc
    return json.dumps({"scenario": sc.run.name, "mode": sc.run.mode, "detail": detail,
                       "memory_unit": "bytes", "time_unit": "us"}, separators=(",", ":"))


def _counters_of(run, rank: int) -> str:
    """The rank's memory counters as text, made here."""
    return counter_lines(rank, *memory_timeline(run.inputs.world.ranks[rank].ledger,
                                                counter_points(run)))


def write_chrome_trace(run, path, detail: str = "full", counters=None) -> Path:
    """Write `run`'s trace as Chrome trace JSON to `path` and return the path (`counters`: see
    _document)."""
    path = Path(path)
    # JSON text escapes every non-ASCII character
    with open_atomic(path, "w", encoding="ascii") as out:
        out.writelines(_document(run, detail, counters))  # a rank at a time
    return path
