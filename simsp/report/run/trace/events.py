"""Trace events as JSON text from the plan's columns (report/run/trace/plan.py): the formatting
half of writing trace.json, done a column at a time (report/run/trace/columns.py).

A thread's complete ("X") events are a Lane: their timestamps, durations and name indices as
arrays, and their arguments either as one float matrix (every span has the same float-valued
keys: the common case) or as text.
"""

import itertools
import json
from dataclasses import dataclass

import numpy as np

from simsp.report.run.trace.columns import (Column, constant, integers, microseconds, rows_text,
                                            seconds_9, table, take)


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
    cnames: list | None = None  # (n,) each event's trace-viewer colour name (schedule steps)


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
    columns = [constant(head), take(names, lane.names)]
    if lane.cnames is not None:  # `,"cname":"rail_load"`: the viewer's colour for its kind
        columns += [constant(',"cname":'), table([string(c) for c in lane.cnames])]
    columns += [constant(',"ts":'), microseconds(lane.start_ns), constant(',"dur":'),
                microseconds(lane.dur_ns)]
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
