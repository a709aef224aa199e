"""The ledger's compact log: its two kinds of record, their expansion, and numpy columns.

A single change is one alloc (+bytes) or free (-bytes), kept as a plain tuple of MemEvent's
fields (an exact tuple of atoms, which the garbage collector stops tracking); a BlockRecord
stands for every change of an OpBlock applied at a start time under a key scope. Summaries read the log as columns sorted by
time (stable: ties keep recording order, blocks expanded in place), built with one argsort.
"""

from typing import NamedTuple

import numpy as np

from simsp.engine.op_block import OpBlock, resolve


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


def sort_log(records: list, categories: tuple) -> SortedLog:
    """The compact log as time-ordered columns: one stable argsort over all changes."""
    times, codes, deltas = _columns(records, categories)
    order = np.argsort(times, kind="stable")  # (n,)
    return SortedLog(times[order], codes[order], deltas[order], order)


def _columns(records: list, categories: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(times, category codes, deltas) of every change, in expanded recording order.

    Each block's changes are written for all its records at once: start (m, 1) + offsets (k,)."""
    is_block = np.fromiter((type(r) is BlockRecord for r in records), bool, len(records))
    block_rows = np.flatnonzero(is_block)  # (b,) positions of the block records
    blocks = [records[i] for i in block_rows.tolist()]
    sizes = np.ones(len(records), dtype=np.int64)  # (records,)
    sizes[block_rows] = [r.block.size for r in blocks]
    firsts = np.cumsum(sizes) - sizes  # (records,) first change's position
    n = int(sizes.sum())
    times, codes, deltas = np.empty(n), np.empty(n, np.int64), np.empty(n, np.int64)
    _fill_singles(records, np.flatnonzero(~is_block), firsts, categories, times, codes, deltas)
    _fill_blocks(blocks, firsts[block_rows], times, codes, deltas)
    return times, codes, deltas


def _fill_singles(records, rows, firsts, categories, times, codes, deltas) -> None:
    """Write the single changes (MemEvents at `rows`) into the columns."""
    if not len(rows):
        return
    code = {c: i for i, c in enumerate(categories)}
    stamps, _keys, names, sizes, _ops = zip(*[records[i] for i in rows.tolist()])
    at = firsts[rows]  # (singles,)
    times[at], deltas[at] = stamps, sizes
    codes[at] = [code[c] for c in names]


def _fill_blocks(blocks: list, firsts: np.ndarray, times, codes, deltas) -> None:
    """Write every applied block's changes into the columns, one numpy pass per distinct block."""
    if not blocks:
        return
    starts, kinds, _scopes, _inputs, input_codes = zip(*blocks)
    starts, input_codes = np.array(starts), np.array(input_codes)  # (b,) each
    groups = {}
    for i, block in enumerate(kinds):
        groups.setdefault(id(block), (block, []))[1].append(i)
    for block, rows in groups.values():
        at = firsts[rows][:, None] + np.arange(block.size)  # (m, k)
        times[at] = starts[rows][:, None] + block.offsets  # float adds exactly as t0 + offset
        codes[at], deltas[at] = block.codes, block.deltas
        if block.input_free is not None:
            codes[at[:, block.input_free]] = input_codes[rows]
