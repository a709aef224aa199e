"""trace.json in the Chrome trace event format (opens in Perfetto, ui.perfetto.dev): one process
per simulated rank.

Detail (`simsp run --trace`): "steps" keeps the schedule steps, pipeline transfers, DP
communication and a memory counter ("C") built from the rank's ledger; "full" adds the compute
and TP-communication tracks, each its own thread. Every event carries a category (`cat`: its
track, "memory", "p2p" for flows, "__metadata"), and a flow arrow (ph "s" -> "f") links each
pipeline send to its receive (the two p2p calls that moved it). Timestamps are microseconds
rounded to the nanosecond.

The file is written in one pass: each event is encoded straight to compact JSON text (no
intermediate dicts), in a fixed order, so the same run gives the same bytes: laid out as numeric
columns (plan.py), then formatted a column at a time (events.py). It is kept to a budget (~50 MB
for the 530B model): the memory counter is downsampled to at most `MAX_MEMORY_POINTS` per rank
and `MEMORY_POINTS_BUDGET` over all ranks (the peak kept exactly), and a detail track with more
spans than its share of `SPAN_BUDGET` (plan.py) has its spans merged per schedule step.
"""

import json
from pathlib import Path

import numpy as np

from simsp.engine.memory import CATEGORIES
from simsp.io_out import open_atomic
from simsp.report.run.memory_timeline import MAX_MEMORY_POINTS, memory_timeline
from simsp.report.run.trace.columns import constant, integers, microseconds, rows_text
from simsp.report.run.trace.events import flows_text, ranks_text
from simsp.report.run.trace.layout import ns_array
from simsp.report.run.trace.plan import trace_plan


DETAILS = ("steps", "full")  # `--trace none` writes no file
MEMORY_POINTS_BUDGET = 80_000  # over all ranks
MIN_MEMORY_POINTS = 200  # per rank, whatever the budget


# ---------------------------------------------------------------- memory counter

def counter_points(run) -> int:
    """Memory samples per rank: MEMORY_POINTS_BUDGET shared by the traced ranks (simulated,
    not replayed), within [MIN_MEMORY_POINTS, MAX_MEMORY_POINTS]."""
    traced = len(run.inputs.world.ranks) - len(run.inputs.replayed)
    share = MEMORY_POINTS_BUDGET // max(traced, 1)
    return min(MAX_MEMORY_POINTS, max(MIN_MEMORY_POINTS, share))


def counter_lines(pid: int, times: np.ndarray, state: np.ndarray) -> str:
    """The memory counters of one rank from its timeline (times (n,), bytes (n, 7)) as JSON
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
    (figures/inputs.py MemoryFigures: the same timelines), for the painter to make meanwhile."""
    return {stage.rank: counter_lines(stage.rank, *stage.timeline(max_points))
            for stage in memory.memory}


# ---------------------------------------------------------------- document

def _document(run, detail: str, counters=None):
    """The trace's text in pieces: head, each rank's events then its memory counters, the
    arrows, tail; pieces joined by commas, none empty. `counters`: a callable giving {rank:
    counter text} made elsewhere (report/run/painter.py), asked for once everything else is
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
