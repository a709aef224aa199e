"""Chrome trace event format (opens in Perfetto, ui.perfetto.dev): one process per simulated rank.

Detail (`simsp run --trace`): "steps" keeps the schedule steps, pipeline transfers, DP
communication and a memory counter ("C") built from the rank's ledger; "full" adds the compute
and TP-communication tracks, each its own thread. Every event carries a category (`cat`: its
track, "memory", "p2p" for flows, "__metadata"), and a flow arrow (ph "s" -> "f") links each
pipeline send to its receive (the two p2p calls that moved it). Timestamps are microseconds rounded to the nanosecond.

The file is written in one pass: each event is encoded straight to compact JSON text (no
intermediate dicts), in a fixed order, so the same run gives the same bytes. It is kept to a
budget (~50 MB for the 530B model): the memory counter is downsampled to at most
`MAX_MEMORY_POINTS` per rank and `MEMORY_POINTS_BUDGET` over all ranks (the peak kept exactly),
and a detail track with more spans than its share of `SPAN_BUDGET` has its spans merged per
schedule step.
"""

import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from simsp.engine.ledger import CATEGORIES
from simsp.engine.trace import DETAIL_TRACKS  # only at "full"; merged per step over budget
from simsp.report.memory_timeline import MAX_MEMORY_POINTS, memory_timeline
from simsp.report.trace_spans import coarsen, lanes, ns_array, pipeline_links

__all__ = ["DETAILS", "MAX_MEMORY_POINTS", "TRACKS", "memory_timeline", "trace_events",
           "write_chrome_trace"]

TRACKS = (("compute", "compute"), ("tp_comm", "TP communication"),
          ("pp_comm", "pipeline transfers"), ("dp_comm", "DP communication"),
          ("schedule", "schedule"))
DETAILS = ("steps", "full")  # `--trace none` writes no file
MEMORY_POINTS_BUDGET = 80_000  # over all ranks
MIN_MEMORY_POINTS = 200  # per rank, whatever the budget
SPAN_BUDGET = 300_000  # spans of the detail tracks over all ranks, before merging
MIN_DETAIL_SPANS = 1000  # per rank and detail track, whatever the budget


def string(text: str) -> str:
    """A JSON string literal, as json.dumps writes it: plain text (printable ASCII but '"' and
    '\\') is only quoted."""
    plain = text.isascii() and text.isprintable() and '"' not in text and "\\" not in text
    return f'"{text}"' if plain else json.dumps(text)


name_string = lru_cache(maxsize=4096)(string)  # span names repeat across steps and ranks


# ---------------------------------------------------------------- encoders

FLOAT_ARGS: dict[tuple, str] = {}  # keys -> %-template of args that are all floats


def _args(args: dict) -> str:
    """`,"args":{...}` for span arguments (floats rounded to 1e-9 s), or "" when empty."""
    if not args:
        return ""
    values = tuple(args.values())
    if tuple(map(type, values)) == (float,) * len(values):  # the common case: one template
        keys = tuple(args)
        template = FLOAT_ARGS.get(keys) or FLOAT_ARGS.setdefault(keys, _float_template(keys))
        return template % tuple([round(value, 9) for value in values])
    return ',"args":{' + ",".join(f"{string(k)}:{_value(v)}" for k, v in args.items()) + "}"


def _float_template(keys: tuple) -> str:
    """`,"args":{"key":%r,...}`: the args text of float-valued `keys`, as a %-template."""
    return ',"args":{' + ",".join(f"{string(k).replace('%', '%%')}:%r" for k in keys) + "}"


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


def _complete_events(pid: int, tid: int, cat: str, rows: list) -> list[str]:
    """Complete ("X") events, one span each, of one thread: rows are (ts_us, dur_us, span)."""
    head = f'{{"ph":"X","cat":{string(cat)},"pid":{pid},"tid":{tid},"name":'
    return [f'{head}{name_string(span.name)},"ts":{ts!r},"dur":{dur!r}{_args(span.args)}}}'
            for ts, dur, span in rows]


def _metadata(pid: int, tid: int, name: str, args: dict) -> str:
    """A metadata ("M") event: a process or thread name or sort index."""
    return (f'{{"ph":"M","cat":"__metadata","pid":{pid},"tid":{tid},"name":{string(name)}'
            f'{_args(args)}}}')


FLOW = ('{"ph":"s","cat":"p2p","id":%d,"pid":%d,"tid":%d,"name":%s,"ts":%r},'
        '{"ph":"f","cat":"p2p","id":%d,"pid":%d,"tid":%d,"name":%s,"ts":%r,"bp":"e"}')
# a flow arrow's two ends: "s" binds to the slice around it, "f" to the enclosing one


# ---------------------------------------------------------------- memory counter

def _counter_template(pid: int) -> str:
    """%-template of one memory sample: the "memory" counter (bytes per category; the stack is
    the total) and the "memory total" counter, at the same timestamp."""
    head = '{"ph":"C","cat":"memory","pid":' + str(pid) + ',"name":'
    values = ",".join(f'"{c}":%d' for c in CATEGORIES)
    return (f'{head}"memory","ts":%r,"args":{{{values}}}}},'
            f'{head}"memory total","ts":%r,"args":{{"bytes":%d}}}}')


def counter_points(run) -> int:
    """Memory samples per rank: MEMORY_POINTS_BUDGET shared by the simulated ranks, within
    [MIN_MEMORY_POINTS, MAX_MEMORY_POINTS]."""
    share = MEMORY_POINTS_BUDGET // max(len(run.world.ranks), 1)
    return min(MAX_MEMORY_POINTS, max(MIN_MEMORY_POINTS, share))


def counter_lines(pid: int, times: np.ndarray, state: np.ndarray) -> list[str]:
    """The memory counters of one rank from its timeline (times (n,), bytes (n, 6)), one
    string per sample (two events each)."""
    template = _counter_template(pid)
    stamps = (ns_array(times) / 1e3).tolist()
    columns = state.T.tolist()  # 6 lists of (points,): bytes per category
    totals = state.sum(axis=1).tolist()  # (points,)
    return [template % row for row in zip(stamps, *columns, stamps, totals)]


def stage_counter_lines(memory, max_points: int) -> dict[int, list[str]]:
    """{rank: counter lines, joined into one text} of every stage's rank from the memory
    figures' inputs (figure_inputs.MemoryFigures: the same timelines), for the painter to make
    meanwhile (one string crosses a pipe at memcpy speed; a rank without samples has none)."""
    lines = {stage.rank: counter_lines(stage.rank, *stage.timeline(max_points))
             for stage in memory.memory}
    return {rank: [",".join(made)] if made else [] for rank, made in lines.items()}


# ---------------------------------------------------------------- spans

def _tracks_in_order(spans_by_track: dict, detail: str) -> list[str]:
    """The rank's tracks to draw: TRACKS order (detail tracks only at "full"), unknown after."""
    known = [t for t, _ in TRACKS if detail == "full" or t not in DETAIL_TRACKS]
    names = dict(TRACKS)
    return known + sorted(t for t in spans_by_track if t not in names)


def _rank_events(pid: int, spans_by_track: dict, max_detail: int, detail: str,
                 placed: dict) -> list[str]:
    """Thread metadata and X events of one rank; `placed[id(span)]` gets each pp span's thread."""
    names, out = dict(TRACKS), []
    tid = 0  # threads numbered 1, 2, ... in display order: each track, then its extra lanes
    for track in _tracks_in_order(spans_by_track, detail):
        spans = spans_by_track.get(track, [])
        if track in DETAIL_TRACKS and len(spans) > max_detail:
            spans = coarsen(spans, spans_by_track.get("schedule", []))
        for lane, rows in enumerate(lanes(spans) or [[]]):
            tid += 1
            label = names.get(track, track) + (f" #{lane + 1}" if lane else "")
            out.append(_metadata(pid, tid, "thread_name", {"name": label}))
            out.append(_metadata(pid, tid, "thread_sort_index", {"sort_index": tid}))
            out += _complete_events(pid, tid, track, rows)
            if track == "pp_comm":
                placed.update((id(span), tid) for _, _, span in rows)
    return out


def _flow_events(links: list, placed: dict) -> list[str]:
    """An arrow per pipeline transfer, from the sender's p2p call to the receiver's: it leaves
    a quarter into the transfer and lands a quarter before its end, both strictly inside the
    two call slices (which enclose the transfer), so viewers bind it without ambiguity."""
    transfers = [t for t, _, _ in links]
    starts = np.array([t.start_s for t in transfers], dtype=float)  # (n,)
    ends = np.array([t.end_s for t in transfers], dtype=float)  # (n,)
    quarter = (ends - starts) / 4  # (n,)
    leave = (ns_array(starts + quarter) / 1e3).tolist()
    land = (ns_array(ends - quarter) / 1e3).tolist()
    ids = range(1, len(links) + 1)
    names = [string(t.label.removeprefix("p2p ")) for t in transfers]
    senders = [placed[id(send)] for _, send, _ in links]
    receivers = [placed[id(recv)] for _, _, recv in links]
    return [FLOW % row for row in zip(ids, [t.src for t in transfers], senders, names, leave,
                                      ids, [t.dst for t in transfers], receivers, names, land)]


# ---------------------------------------------------------------- document

def _spans_by_rank(run, detail: str) -> tuple[dict, list]:
    """{rank: {track: [Span]}} for the simulated ranks (detail tracks only at "full"), and the
    (send, receive) pairs of the pipeline transfers."""
    by_rank = {rank: {} for rank in run.world.ranks}
    skip = () if detail == "full" else DETAIL_TRACKS
    for span in run.world.trace.spans:
        if span.rank in by_rank and span.track not in skip:
            by_rank[span.rank].setdefault(span.track, []).append(span)
    return by_rank, pipeline_links(by_rank, run.world.trace.transfers)


def _event_parts(run, detail: str, counters=None) -> list[str]:
    """Every event of the trace as JSON text: per rank (pipeline order) metadata, spans, memory;
    then the flow arrows. `counters`: a callable giving {rank: counter lines} made elsewhere
    (report/painter.py), asked for once everything else is encoded; other ranks' are made here."""
    grid = run.world.grid
    by_rank, links = _spans_by_rank(run, detail)
    ranks = sorted(run.world.ranks, key=lambda r: (grid.coords(r).pp, grid.coords(r).dp, r))
    max_detail = max(MIN_DETAIL_SPANS, SPAN_BUDGET // (len(DETAIL_TRACKS) * len(ranks)))
    placed = {}
    heads = [_rank_head(run, rank, position, by_rank[rank], max_detail, detail, placed)
             for position, rank in enumerate(ranks)]
    flows = _flow_events(links, placed)
    made = counters() if counters is not None else {}
    parts = []
    for rank, head in zip(ranks, heads):
        parts += head
        parts += made[rank] if rank in made else counter_lines(
            rank, *memory_timeline(run.world.ranks[rank].ledger, counter_points(run)))
    return parts + flows


def _rank_head(run, rank: int, position: int, spans_by_track: dict, max_detail: int,
               detail: str, placed: dict) -> list[str]:
    """One rank's process metadata, thread metadata and span events."""
    c = run.world.grid.coords(rank)
    return [_metadata(rank, 0, "process_name",
                      {"name": f"rank {rank} (tp {c.tp}, pp {c.pp}, dp {c.dp})"}),
            _metadata(rank, 0, "process_sort_index", {"sort_index": position}),
            *_rank_events(rank, spans_by_track, max_detail, detail, placed)]


WRITE_CHUNK = 4096  # events joined per write: the text is never one string in memory


def _document(run, detail: str, counters=None):
    """The trace's text in pieces: head, the events comma-separated a chunk at a time, tail."""
    if detail not in DETAILS:
        raise ValueError(f"trace detail must be one of {DETAILS}, got {detail!r}")
    other = json.dumps({"scenario": run.sc.run.name, "mode": run.sc.run.mode,
                        "detail": detail, "memory_unit": "bytes", "time_unit": "us"},
                       separators=(",", ":"))
    parts = _event_parts(run, detail, counters)
    yield '{"displayTimeUnit":"ms","traceEvents":['
    for start in range(0, len(parts), WRITE_CHUNK):
        yield ("," if start else "") + ",".join(parts[start:start + WRITE_CHUNK])
    yield '],"otherData":' + other + "}\n"


def trace_document(run, detail: str = "full") -> str:
    """The whole Chrome trace JSON text of `run` (compact, newline-terminated)."""
    return "".join(_document(run, detail))


def trace_events(run, detail: str = "full") -> list[dict]:
    """The trace's events as dicts (for tests and tools; the writer never builds them)."""
    return json.loads(trace_document(run, detail))["traceEvents"]


def write_chrome_trace(run, path, detail: str = "full", counters=None) -> Path:
    """Write `run`'s trace as Chrome trace JSON to `path` and return the path (`counters`: see
    _event_parts)."""
    path = Path(path)
    with path.open("w", encoding="ascii") as out:  # JSON text escapes every non-ASCII character
        out.writelines(_document(run, detail, counters))  # a chunk at a time
    return path
