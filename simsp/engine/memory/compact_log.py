"""The ledger's compact log: its two kinds of record, their expansion, and numpy columns.

A single change is one alloc (+bytes) or free (-bytes), kept as a plain tuple of MemEvent's
fields (an exact tuple of atoms, which the garbage collector stops tracking); a BlockRecord
stands for every change of an OpBlock applied at a start time under a key scope. Summaries read
the log as columns sorted by time (stable: ties keep recording order, blocks expanded in place),
built with one argsort.
"""

import struct
from itertools import repeat
from typing import NamedTuple

import numpy as np

from simsp.engine.memory.op_block import OpBlock, resolve


class MemEvent(NamedTuple):
    """One change of the ledger: +bytes on alloc, -bytes on free, at simulated time."""

    time_s: float
    key: str
    category: str
    delta_bytes: int
    op: str


_new_event = tuple.__new__


class BlockRecord(NamedTuple):
    """An OpBlock applied at `start_s` with keys under `scope` (its input tensor: `input_key`,
    of category `input_code` when the block frees it, else -1)."""

    start_s: float
    block: OpBlock
    scope: str
    input_key: str
    input_code: int


class SortedLog(NamedTuple):
    """Every change of a log as columns in time order (ties in recording order)."""

    times: np.ndarray  # (n,) float seconds
    codes: np.ndarray  # (n,) int64 index into the categories
    deltas: np.ndarray  # (n,) int64 signed bytes
    order: np.ndarray  # (n,) int64 position of each change in the expanded recording order


def expand(records: list):
    """Yield the MemEvents of a compact log, blocks expanded, in recording order."""
    for record in records:
        if type(record) is not BlockRecord:
            yield _new_event(MemEvent, record)
            continue
        start, block, scope, input_key, input_code = record
        for i, (offset, delta, rel, category, op) in enumerate(block.ops):
            if i == block.input_free:
                category = block.categories[input_code]
            yield MemEvent(start + offset, resolve(rel, scope, input_key), category, delta, op)


_ROW = struct.Struct("=dqqq").pack  # (time or start s, category code, delta bytes, kind)
_ROW_DTYPE = np.dtype([("time", "=f8"), ("code", "=i8"), ("delta", "=i8"), ("kind", "=i8")])


class NumericLog:
    """The log's numbers, one packed row per record, kept beside the records as they are made
    (the summaries then read no Python object: a paper-scale log's records lie scattered in
    memory, and reading them back costs more than packing these rows did). A single change is
    (time, category code, delta, -1); a block record is (start, code of its input's category or
    -1, 0, index of its OpBlock in `blocks`)."""

    __slots__ = ("rows", "blocks", "_kind_of")

    def __init__(self):
        self.rows = bytearray()  # (records,) rows of _ROW_DTYPE, packed
        self.blocks: list[OpBlock] = []  # the distinct blocks, in order of first use
        self._kind_of: dict[int, int] = {}  # id(block) -> its index in `blocks`

    @classmethod
    def of(cls, records: list, categories: tuple) -> "NumericLog":
        """The rows of a list of records (MemEvent fields or BlockRecords)."""
        numbers, code = cls(), {c: i for i, c in enumerate(categories)}
        for record in records:
            if type(record) is BlockRecord:
                numbers.block(record.start_s, record.block, record.input_code)
            else:
                numbers.single(record[0], code[record[2]], record[3])
        return numbers

    def single(self, time_s: float, code: int, delta: int) -> None:
        """One alloc (+bytes) or free (-bytes) of the category of `code`."""
        self.rows += _ROW(time_s, code, delta, -1)

    def singles(self, times, codes, deltas) -> None:
        """Several single changes at once, as `single` one after the other (iterables)."""
        self.rows += b"".join(map(_ROW, times, codes, deltas, repeat(-1)))

    def block(self, start_s: float, block: OpBlock, input_code: int) -> None:
        """One block applied at `start_s` (input_code as in BlockRecord)."""
        kind = self._kind_of.get(id(block))
        if kind is None:
            kind = self._kind_of[id(block)] = len(self.blocks)
            self.blocks.append(block)
        self.rows += _ROW(start_s, input_code, 0, kind)

    def columns(self) -> np.ndarray:
        """(records,) structured rows (time, code, delta, kind): a copy."""
        return np.frombuffer(bytes(self.rows), dtype=_ROW_DTYPE)

    def record_of(self, position: int) -> tuple[int, int]:
        """(record index, change within it) of the change at `position` of the expanded log."""
        kinds = self.columns()["kind"]  # (records,)
        block_sizes = np.array([b.size for b in self.blocks] + [1], dtype=np.int64)
        ends = np.cumsum(block_sizes[kinds])  # (records,) position after each record's changes
        index = int(np.searchsorted(ends, position, side="right"))
        return index, position - int(ends[index] - block_sizes[kinds[index]])


def sort_log(records, categories: tuple) -> SortedLog:
    """The compact log (a list of records, or its NumericLog) as time-ordered columns: one
    stable argsort over all changes."""
    numbers = records if type(records) is NumericLog else NumericLog.of(records, categories)
    times, codes, deltas = _columns(numbers)
    order = np.argsort(times, kind="stable")  # (n,)
    return SortedLog(times[order], codes[order], deltas[order], order)


def _columns(numbers: NumericLog) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(times, category codes, deltas) of every change, in expanded recording order.

    Each block's changes are written for all its records at once: start (m, 1) + offsets (k,)."""
    rows = numbers.columns()  # (records,)
    starts, input_codes, kinds = rows["time"], rows["code"], rows["kind"]  # (records,) each
    block_sizes = np.array([b.size for b in numbers.blocks] + [1], dtype=np.int64)  # (kinds + 1,)
    sizes = block_sizes[kinds]  # (records,): a single (kind -1) is one change
    firsts = np.cumsum(sizes) - sizes  # (records,) first change's position
    n = int(sizes.sum())
    times, codes, deltas = np.empty(n), np.empty(n, np.int64), np.empty(n, np.int64)
    singles = np.flatnonzero(kinds < 0)  # (singles,)
    times[firsts[singles]] = starts[singles]
    codes[firsts[singles]] = input_codes[singles]
    deltas[firsts[singles]] = rows["delta"][singles]
    for kind, block in enumerate(numbers.blocks):
        applied = np.flatnonzero(kinds == kind)  # (m,) the records of this block
        at = firsts[applied][:, None] + np.arange(block.size)  # (m, k)
        times[at] = starts[applied][:, None] + block.offsets  # float adds exactly as t0 + offset
        codes[at], deltas[at] = block.codes, block.deltas
        if block.input_free is not None:
            codes[at[:, block.input_free]] = input_codes[applied]
    return times, codes, deltas
