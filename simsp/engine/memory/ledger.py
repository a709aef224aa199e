"""Per-rank memory ledger: every tensor allocated and freed by name, category, bytes and time.

The log is compact: an alloc or free is one record (a MemEvent tuple), and a replayed layer step
is one record too (a BlockRecord: start time, block, key scope, input key) standing for the
block's 60-74 changes. Peaks, timelines and out-of-memory verdicts are computed from the log with
numpy (summary.py); `events` expands it into the full per-tensor log, which gives
exactly the same figures (tests/test_ledger_compact.py). Running totals track what is live now.
"""

import itertools
from itertools import repeat
from dataclasses import dataclass, field

from simsp.engine.memory.compact_log import (BlockRecord, MemEvent, NumericLog, SortedLog,
                                             expand, sort_log)
from simsp.engine.memory.live_set import AlreadyLive, LiveSet
from simsp.engine.memory.op_block import OpBlock
from simsp.engine.memory.summary import (LiveTensor, MemorySummary, OutOfMemory, largest,
                                         summarize)
from simsp.gc_pause import gc_paused

_new = tuple.__new__  # skips NamedTuple's Python-level constructor on the hot path

# held_for_wgrad: what a split backward's B keeps for its deferred W step (each linear's input
# and output gradient, model/base/wgrad_store.py), from B until W frees it (docs/MODEL.md).
HELD_FOR_WGRAD = "held_for_wgrad"
CATEGORIES = ("weights", "gradients", "optimizer", "activations", "temporaries", HELD_FOR_WGRAD,
              "communication")
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

    def alloc_each(self, keys, nbytes: int, category: str, op: str, times) -> None:
        """Record tensors of one size and category, keys[i] at times[i]: the same log and
        totals as `alloc` one by one (a CP ring's receive buffers, ring_pass.py)."""
        if category not in self.current:
            raise KeyError(f"unknown memory category {category!r}")
        add = self.live_set.add
        try:
            for key in keys:
                add(key, category, nbytes, op)  # checks the key is not live
        except AlreadyLive as error:
            raise AlreadyLive(f"rank {self.rank}: {error.args[0]}") from None
        self.current[category] += nbytes * len(keys)
        self.records.extend([(time_s, key, category, nbytes, op)
                             for time_s, key in zip(times, keys, strict=True)])
        self.numbers.singles(times, repeat(CODE[category]), repeat(nbytes))

    def free_each(self, keys, op: str, time_s: float) -> None:
        """Release live tensors at time_s: the same log and totals as `free` one by one."""
        pop, current = self.live_set.pop, self.current
        tensors = [pop(key) for key in keys]
        for tensor in tensors:
            current[tensor.category] -= tensor.nbytes
        self.records.extend([(time_s, key, tensor.category, -tensor.nbytes, op)
                             for key, tensor in zip(keys, tensors)])
        self.numbers.singles(repeat(time_s, len(tensors)),
                             [CODE[tensor.category] for tensor in tensors],
                             [-tensor.nbytes for tensor in tensors])

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
