"""Each rank's memory ledger: every tensor allocated and freed by name, category, bytes and time.

Sections, bottom up: op blocks (a layer step's ledger changes recorded once and applied many
times), the compact log (its records, their expansion and numpy columns), summaries (peaks and
the out-of-memory verdict as pure functions of the log), the live set (what is live now, a
replayed block as one group), and the ledger itself. The compact log and the grouped live set
exist for speed (docs/PERFORMANCE.md#the-ledger-cheap-changes-summaries-in-numpy); expanding the
log gives exactly the per-tensor log and the same figures (tests/test_ledger_compact.py).
"""

import itertools
import struct
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from simsp.gc_pause import gc_paused


# ---------------------------------------------------------------------------------------------
# Op blocks: a layer step's changes, recorded once
# ---------------------------------------------------------------------------------------------
#
# A block of ledger changes recorded once and applied many times (a replayed layer step).
#
# The ledger logs an applied block as one record (start time, block, key scope, input key); the
# block holds what expanding that record needs: each change's time offset, category, signed bytes,
# relative key and op, as numpy columns for the summaries and as names for the reports that need
# them. It also holds the block's net effect on the live tensors, so applying it touches only the
# tensors that outlive it.

INPUT = "<input>"  # relative key of the step's input tensor, allocated outside the block's scope


class BlockOp(NamedTuple):
    """One ledger change of a block, relative to the block's start time and key scope."""

    offset_s: float
    delta_bytes: int
    key: str  # relative to the scope, or INPUT
    category: str
    op: str


class BlockEntry(NamedTuple):
    """A live tensor a replayed block leaves behind (the live set, below); its key is absolute
    only once applied, so the entry holds the rest."""

    category: str
    nbytes: int
    op: str


def resolve(rel: str, scope: str, input_key: str) -> str:
    """The absolute ledger key of a block's relative key."""
    return input_key if rel == INPUT else scope + rel


class OpBlock:
    """Immutable: the changes of one recorded step and their net effect on the live tensors."""

    def __init__(self, ops: tuple, categories: tuple):
        """`ops`: (offset_s, delta_bytes, relative key, category, op) in recording order."""
        self.ops = tuple(BlockOp(*op) for op in ops)
        self.categories = categories
        code = {c: i for i, c in enumerate(categories)}
        self.size = len(self.ops)
        self.offsets = np.array([op.offset_s for op in self.ops], dtype=float)  # (k,)
        self.codes = np.array([code[op.category] for op in self.ops], dtype=np.int64)  # (k,)
        self.deltas = np.array([op.delta_bytes for op in self.ops], dtype=np.int64)  # (k,)
        self.net_frees, self.net_allocs = _net_live_changes(self.ops)
        self.free_set_in_order = tuple(rel for rel in self.net_frees if rel != INPUT)
        self.input_realloc = any(rel == INPUT for rel, *_ in self.net_allocs)
        self.alloc_rels = tuple(rel for rel, *_ in self.net_allocs)
        self.alloc_entries = tuple(BlockEntry(category, nbytes, op)
                                   for _, category, nbytes, op in self.net_allocs)
        self.alloc_entry_of = dict(zip(self.alloc_rels, self.alloc_entries))
        self.alloc_set = frozenset(self.alloc_rels)
        self.free_set = frozenset(self.free_set_in_order)
        # live tensors kept as one group under the scope (the live set, below): several, and
        # keys that split at the scope's last "."
        self.groupable = (len(self.alloc_rels) > 1 and not self.input_realloc
                          and not any("." in rel for rel in self.alloc_rels))
        self.input_free = _input_free(self.ops)  # index of the input's free, or None
        net = dict.fromkeys(categories, 0)
        for i, op in enumerate(self.ops):
            if i != self.input_free:
                net[op.category] += op.delta_bytes
        self.net_by_category = tuple((c, b) for c, b in net.items() if b)


def _input_free(ops: tuple) -> int | None:
    """Index of the change freeing the step's input tensor (allocated before the block)."""
    for i, op in enumerate(ops):
        if op.key == INPUT:
            return i if op.delta_bytes < 0 else None  # freed after a local alloc: not the input
    return None


def _net_live_changes(ops: tuple) -> tuple[tuple, tuple]:
    """(relative keys freed that the block did not allocate, allocations still live at its end).

    Applying the frees first and then the allocations leaves the live tensors exactly as
    applying every change in order would (a key freed and re-allocated appears in both)."""
    local, frees = {}, []
    for op in ops:
        if op.delta_bytes > 0:
            local[op.key] = (op.key, op.category, op.delta_bytes, op.op)
        elif op.key in local:
            del local[op.key]
        else:
            frees.append(op.key)
    return tuple(frees), tuple(local.values())


# ---------------------------------------------------------------------------------------------
# The compact log
# ---------------------------------------------------------------------------------------------
#
# The ledger's compact log: its two kinds of record, their expansion, and numpy columns.
#
# A single change is one alloc (+bytes) or free (-bytes), kept as a plain tuple of MemEvent's
# fields (an exact tuple of atoms, which the garbage collector stops tracking); a BlockRecord
# stands for every change of an OpBlock applied at a start time under a key scope. Summaries read the log as columns sorted by
# time (stable: ties keep recording order, blocks expanded in place), built with one argsort.

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


# ---------------------------------------------------------------------------------------------
# Summaries: peaks and the out-of-memory verdict
# ---------------------------------------------------------------------------------------------
#
# Peaks and the out-of-memory verdict of one rank, as a pure function of its ledger log.
#
# The log is read in time order (ties in the order recorded), so changes stamped ahead of the
# simulation clock (replayed layer templates) count exactly where they belong. Totals are
# cumulative sums over the sorted columns; tensor names are expanded only for an OOM's report.

class LiveTensor(NamedTuple):
    key: str
    category: str
    nbytes: int
    op: str


@dataclass(frozen=True)
class OutOfMemory:
    """The first allocation that did not fit: who asked, for what, and what was in the way."""

    rank: int
    op: str
    key: str
    time_s: float
    bytes_asked: int
    bytes_in_use: int
    capacity_bytes: int
    largest_live: tuple[LiveTensor, ...]


@dataclass(frozen=True)
class MemorySummary:
    peak_total: int
    peak_time_s: float
    peak_by_category: dict  # each category's own peak
    at_peak: dict  # each category's bytes at the moment of the total peak
    oom: OutOfMemory | None


def largest(live: dict, count: int = 5) -> tuple[LiveTensor, ...]:
    """The biggest live tensors, largest first (ties by key, for determinism)."""
    return tuple(sorted(live.values(), key=lambda t: (-t.nbytes, t.key))[:count])


def summarize(log: SortedLog, categories: tuple, rank: int, capacity: int,
              events=None, event_at=None) -> MemorySummary:
    """Total and per-category peaks, the composition at the total peak, and the first OOM.

    `events()` returns the expanded log in recording order (needed only to name the tensors
    live at an OOM); without it, `event_at(position)` gives the one change that failed and the
    verdict names no live tensors (a sweep row needs only the bytes: the same numbers)."""
    total = np.cumsum(log.deltas)  # (n,) bytes live after each change
    peaks = {c: _category_peak(log, i) for i, c in enumerate(categories)}
    at_peak, peak, peak_time = dict.fromkeys(categories, 0), 0, 0.0
    if len(total) and total.max() > 0:
        i = int(np.argmax(total))  # first maximum: an allocation
        peak, peak_time = int(total[i]), float(log.times[i])
        at_peak = _composition(log, i + 1, categories)
    over = np.flatnonzero((log.deltas > 0) & (total > capacity))  # (k,) allocations that fail
    oom = None
    if len(over) and events is not None:
        oom = _out_of_memory(log, int(over[0]), total, rank, capacity, events())
    elif len(over):
        oom = _unnamed_out_of_memory(log, int(over[0]), total, rank, capacity, event_at)
    return MemorySummary(peak, peak_time, peaks, at_peak, oom)


def _unnamed_out_of_memory(log: SortedLog, j: int, total: np.ndarray, rank: int, capacity: int,
                           event_at) -> OutOfMemory:
    """_out_of_memory's verdict for change j without the tensors live before it (no log
    expansion: only the failing change is read)."""
    asked = event_at(int(log.order[j]))
    return OutOfMemory(rank, asked.op, asked.key, asked.time_s, asked.delta_bytes,
                       int(total[j]) - asked.delta_bytes, capacity, ())


def _category_peak(log: SortedLog, code: int) -> int:
    """A category's highest level (0 if never above): max of its own cumulative sum."""
    deltas = log.deltas[log.codes == code]  # (m,)
    return max(0, int(np.cumsum(deltas).max())) if len(deltas) else 0


def _composition(log: SortedLog, count: int, categories: tuple) -> dict:
    """Bytes per category after the first `count` changes."""
    sums = np.zeros(len(categories), dtype=np.int64)  # (categories,)
    np.add.at(sums, log.codes[:count], log.deltas[:count])
    return dict(zip(categories, sums.tolist()))


def _out_of_memory(log: SortedLog, j: int, total: np.ndarray, rank: int, capacity: int,
                   events: list) -> OutOfMemory:
    """The verdict for the failing change j (sorted position), naming the tensors live before it."""
    live = {}
    for position in log.order[:j].tolist():
        e = events[position]
        if e.delta_bytes > 0:
            live[e.key] = LiveTensor(e.key, e.category, e.delta_bytes, e.op)
        else:
            live.pop(e.key, None)
    asked = events[int(log.order[j])]
    return OutOfMemory(rank, asked.op, asked.key, asked.time_s, asked.delta_bytes,
                       int(total[j]) - asked.delta_bytes, capacity, largest(live))


# ---------------------------------------------------------------------------------------------
# The live set
# ---------------------------------------------------------------------------------------------
#
# The tensors live on one rank now, by key (docs/PERFORMANCE.md: a replayed layer step's
# 60-74 changes must not cost 60-74 Python-level steps).
#
# A single allocation is a LiveTensor in a dict by key. The tensors a replayed step leaves live
# are one group under the step's key scope: its block and the relative keys freed since, so a
# forward leaving 13 tensors and the backward freeing them are one dict operation each. A key
# is found in its group by splitting it at its last "." (grouped blocks' relative keys hold
# none, their scopes end in one). Any other block's tensors are entered one by one.

_new = tuple.__new__  # skips NamedTuple's Python-level constructor on the hot path


class AlreadyLive(KeyError):
    """A tensor was allocated under a key that is live already."""


class _Group:
    """The tensors one applied block left live under its scope, less those freed since."""

    __slots__ = ("block", "gone")

    def __init__(self, block: OpBlock):
        self.block = block
        self.gone: set[str] = set()  # relative keys freed one by one since

    def holds(self, rel: str) -> bool:
        """Whether the block's tensor `rel` is still live."""
        return rel in self.block.alloc_set and rel not in self.gone

    def size(self) -> int:
        """How many of the block's tensors are still live."""
        return len(self.block.alloc_rels) - len(self.gone)


class LiveSet:
    """Live tensors of one rank: single tensors by key, and applied blocks' groups by scope."""

    def __init__(self):
        self._entries: dict[str, LiveTensor] = {}
        self._groups: dict[str, _Group] = {}  # scope -> what its block left live
        self._single_scopes: set[str] = set()  # key[:last "." + 1] of every single ever added
        self._grouped = 0  # tensors live in groups

    def holds(self, key: str) -> bool:
        """Whether a tensor of this key is live."""
        return key in self._entries or self._group_of(key) is not None

    def add(self, key: str, category: str, nbytes: int, op: str) -> None:
        """A new single tensor; a key already live is an error."""
        cut = key.rfind(".") + 1
        scope = key[:cut]
        group = self._groups.get(scope)
        if key in self._entries or group is not None and group.holds(key[cut:]):
            raise AlreadyLive(f"tensor {key!r} allocated twice")
        self._single_scopes.add(scope)
        self._entries[key] = _new(LiveTensor, (key, category, nbytes, op))

    def get(self, key: str) -> LiveTensor:
        """The live tensor of `key` (KeyError if none)."""
        tensor = self._entries.get(key)
        if tensor is not None:
            return tensor
        group, rel = self._found(key)
        return LiveTensor(key, *group.block.alloc_entry_of[rel])

    def pop(self, key: str) -> LiveTensor:
        """Remove the live tensor of `key` and return it (KeyError if none)."""
        tensor = self._entries.pop(key, None)
        if tensor is not None:
            return tensor
        group, rel = self._found(key)
        self._drop(key[:len(key) - len(rel)], group, (rel,))
        return _new(LiveTensor, (key, *group.block.alloc_entry_of[rel]))

    def free_block(self, block: OpBlock, scope: str) -> None:
        """Remove the tensors a block frees (relative keys under `scope`, its input excluded)."""
        group = self._groups.get(scope)
        frees = block.free_set
        if group is not None and frees <= group.block.alloc_set and group.gone.isdisjoint(frees):
            self._drop(scope, group, frees)
            return
        for rel in block.free_set_in_order:  # not one group's: key by key
            self.pop(scope + rel)

    def add_block(self, block: OpBlock, scope: str, input_key: str) -> None:
        """Add the tensors a block leaves live; a key already live is an error."""
        if block.groupable and scope.endswith(".") and scope not in self._groups:
            if scope in self._single_scopes:  # a single under this scope could collide
                self._check_free(block, scope)
            self._groups[scope] = _Group(block)
            self._grouped += len(block.alloc_rels)
            return
        for rel, category, nbytes, op in block.net_allocs:
            self.add(resolve(rel, scope, input_key), category, nbytes, op)

    def as_dict(self) -> dict[str, LiveTensor]:
        """Every live tensor by key: for reports and tests, not the hot path."""
        live = dict(self._entries)
        for scope, group in self._groups.items():
            for rel, entry in group.block.alloc_entry_of.items():
                if rel not in group.gone:
                    live[scope + rel] = LiveTensor(scope + rel, *entry)
        return live

    def __len__(self) -> int:
        return len(self._entries) + self._grouped

    def _group_of(self, key: str) -> _Group | None:
        """The group holding `key` live, if any."""
        return self._split(key)[0] if self._groups else None

    def _found(self, key: str) -> tuple[_Group, str]:
        """(group, relative key) of a grouped live key; KeyError if it is not live."""
        group, rel = self._split(key)
        if group is None:
            raise KeyError(key)
        return group, rel

    def _split(self, key: str) -> tuple[_Group | None, str]:
        """(the group holding `key` live or None, its relative key): cut at the last "."."""
        cut = key.rfind(".") + 1
        group = self._groups.get(key[:cut])
        rel = key[cut:]
        return (group if group is not None and group.holds(rel) else None), rel

    def _drop(self, scope: str, group: _Group, rels) -> None:
        """Free live relative keys `rels` (distinct) of the group under `scope`."""
        self._grouped -= len(rels)
        if len(rels) == group.size():  # the last of them: the group goes
            del self._groups[scope]
        else:
            group.gone.update(rels)

    def _check_free(self, block: OpBlock, scope: str) -> None:
        """AlreadyLive if a key the block leaves live is live as a single tensor."""
        for rel in block.alloc_rels:
            if scope + rel in self._entries:
                raise AlreadyLive(f"a tensor of block scope {scope!r} allocated twice")


# ---------------------------------------------------------------------------------------------
# The ledger
# ---------------------------------------------------------------------------------------------
#
# Per-rank memory ledger: every tensor allocated and freed by name, category, bytes and time.
#
# The log is compact: an alloc or free is one record (a MemEvent tuple), and a replayed layer step
# is one record too (a BlockRecord: start time, block, key scope, input key) standing for the
# block's 60-74 changes. Peaks, timelines and out-of-memory verdicts are computed from the log with
# numpy (the summaries, above); `events` expands it into the full per-tensor log, which gives
# exactly the same figures (tests/test_ledger_compact.py). Running totals track what is live now.

CATEGORIES = ("weights", "gradients", "optimizer", "activations", "temporaries", "communication")
CODE = {category: code for code, category in enumerate(CATEGORIES)}
# What may still be live when an iteration ends (docs/MODEL.md#accounting-rules): the rest
# must be back to zero.
PERSISTENT = ("weights", "gradients", "optimizer")


@dataclass
class Ledger:
    """Live tensors and running totals per category of one rank, and its compact log."""

    rank: int
    capacity_bytes: int
    clock: callable = lambda: 0.0
    live_set: LiveSet = field(default_factory=LiveSet)  # what is live now, by key
    current: dict = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    records: list = field(default_factory=list)  # MemEvent fields | BlockRecord, in order
    numbers: NumericLog = field(default_factory=NumericLog)  # the records' numbers, row by row
    _cache: tuple = (-1, None, None, True)  # (records counted, SortedLog, MemorySummary,
    # whether an OOM verdict in it names the live tensors)

    @property
    def total(self) -> int:
        """Bytes live now, every category."""
        return sum(self.current.values())

    @property
    def live(self) -> dict:
        """Every live tensor {key: LiveTensor} (built on each call: not for the hot path)."""
        return self.live_set.as_dict()

    def holds(self, key: str) -> bool:
        """Whether a tensor of this key is live."""
        return self.live_set.holds(key)

    def alloc(self, key: str, nbytes: int, category: str, op: str,
              time_s: float | None = None) -> None:
        """Record a new tensor (at `time_s`, default now)."""
        current = self.current
        if category not in current:
            raise KeyError(f"unknown memory category {category!r}")
        try:
            self.live_set.add(key, category, nbytes, op)  # checks the key is not live
        except AlreadyLive as error:
            raise AlreadyLive(f"rank {self.rank}: {error.args[0]}") from None
        current[category] += nbytes
        now = self.clock() if time_s is None else time_s
        self.records.append((now, key, category, nbytes, op))  # a plain tuple: see mem_log
        self.numbers.single(now, CODE[category], nbytes)

    def free(self, key: str, op: str = "free", time_s: float | None = None) -> None:
        """Release a live tensor."""
        tensor = self.live_set.pop(key)
        self.current[tensor.category] -= tensor.nbytes
        now = self.clock() if time_s is None else time_s
        self.records.append((now, key, tensor.category, -tensor.nbytes, op))
        self.numbers.single(now, CODE[tensor.category], -tensor.nbytes)

    def retag(self, key: str, category: str, new_key: str | None = None) -> str:
        """Move a live tensor to another category (e.g. a temporary saved for backward)."""
        tensor = self.live_set.get(key)
        self.free(key, op="retag")
        new_key = new_key or key
        self.alloc(new_key, tensor.nbytes, category, tensor.op)
        return new_key

    def apply_block(self, block: OpBlock, start_s: float, scope: str, input_key: str) -> None:
        """Apply every change of `block` at `start_s` under `scope`, as one log record."""
        input_code = -1
        if block.input_free is not None:
            input_code = self._free_input(block, input_key)
        if block.free_set_in_order:
            self.live_set.free_block(block, scope)
        if block.net_allocs:
            self.live_set.add_block(block, scope, input_key)
        current = self.current
        for category, delta in block.net_by_category:
            current[category] += delta
        self.records.append(_new(BlockRecord, (start_s, block, scope, input_key, input_code)))
        self.numbers.block(start_s, block, input_code)

    def _free_input(self, block: OpBlock, input_key: str) -> int:
        """Free a block's input tensor as its own category says; return that category's code."""
        tensor = self.live_set.pop(input_key)
        if tensor.nbytes != -block.ops[block.input_free].delta_bytes:
            raise ValueError(f"rank {self.rank}: replayed input {input_key!r} has "
                             f"{tensor.nbytes} bytes, the template's had a different size")
        self.current[tensor.category] -= tensor.nbytes
        return CODE[tensor.category]

    @property
    def events(self) -> list[MemEvent]:
        """The full log, every block expanded into its changes, in recording order."""
        return list(expand(self.records))

    def sorted_log(self) -> SortedLog:
        """The log as time-ordered numpy columns (cached until the next change)."""
        return self._summarized()[0]

    def summary(self, name_live: bool = True) -> MemorySummary:
        """Peaks and OOM verdict from the time-ordered log (cached until the next change);
        `name_live=False`: an OOM verdict without the tensors live at it (no log expansion;
        every number the same)."""
        return self._summarized(name_live)[1]

    def _summarized(self, name_live: bool = True) -> tuple[SortedLog, MemorySummary]:
        """The sorted columns and the summary, recomputed only when records were added (or
        when the live tensors are asked for and the cached verdict lacks them)."""
        n, log, summary, named = self._cache
        if n != len(self.records) or (name_live and not named and summary.oom is not None):
            with gc_paused():  # a paper-scale log makes many short-lived tuples
                log = sort_log(self.numbers, CATEGORIES) if n != len(self.records) else log
                summary = summarize(log, CATEGORIES, self.rank, self.capacity_bytes,
                                    (lambda: self.events) if name_live else None,
                                    self._event_at)
            self._cache = (len(self.records), log, summary, name_live)
        return log, summary

    def _event_at(self, position: int) -> MemEvent:
        """The change at `position` of the expanded log (one record expanded)."""
        index, within = self.numbers.record_of(position)
        return next(itertools.islice(expand(self.records[index:index + 1]), within, None))

    @property
    def peak_total(self) -> int:
        """The highest total bytes live at any moment."""
        return self.summary().peak_total

    @property
    def peak_by_category(self) -> dict:
        """Bytes per category at the moment of the peak."""
        return self.summary().peak_by_category

    @property
    def oom(self) -> OutOfMemory | None:
        """The first allocation over capacity, or None."""
        return self.summary().oom

    def largest_live(self, count: int = 5) -> tuple[LiveTensor, ...]:
        """The `count` largest tensors live now."""
        return largest(self.live, count)

    def live_bytes(self, category: str) -> int:
        """Bytes of `category` live now."""
        return self.current[category]

    def final_bytes(self) -> dict:
        """Bytes still live now, by category (every category, in CATEGORIES order)."""
        return dict(self.current)
