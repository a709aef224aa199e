"""Per-rank memory ledger: every tensor allocated and freed by name, category, bytes and time.

Timelines, peaks and out-of-memory reports are all derived from its event log
(engine/memory_summary.py); running totals track what is live now.
"""

from dataclasses import dataclass, field
from typing import NamedTuple

from simsp.engine.memory_summary import LiveTensor, MemorySummary, OutOfMemory, largest, summarize

CATEGORIES = ("weights", "gradients", "optimizer", "activations", "temporaries", "communication")
__all__ = ["CATEGORIES", "Ledger", "LiveTensor", "MemEvent", "OutOfMemory"]


class MemEvent(NamedTuple):
    """One change of the ledger: +bytes on alloc, -bytes on free, at simulated time."""

    time_s: float
    key: str
    category: str
    delta_bytes: int
    op: str


_new_event = tuple.__new__


@dataclass
class Ledger:
    """Live tensors and running totals per category of one rank, and its event log."""

    rank: int
    capacity_bytes: int
    clock: callable = lambda: 0.0
    live: dict = field(default_factory=dict)  # key -> LiveTensor
    current: dict = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    events: list = field(default_factory=list)
    _summary: MemorySummary | None = None

    @property
    def total(self) -> int:
        return sum(self.current.values())

    def alloc(self, key: str, nbytes: int, category: str, op: str,
              time_s: float | None = None) -> None:
        """Record a new tensor (at `time_s`, default now)."""
        if key in self.live:
            raise KeyError(f"rank {self.rank}: tensor {key!r} allocated twice")
        if category not in self.current:
            raise KeyError(f"unknown memory category {category!r}")
        self.live[key] = LiveTensor(key, category, nbytes, op)
        self._change(key, category, nbytes, op, time_s)

    def free(self, key: str, op: str = "free", time_s: float | None = None) -> None:
        """Release a live tensor."""
        tensor = self.live.pop(key)
        self._change(key, tensor.category, -tensor.nbytes, op, time_s)

    def retag(self, key: str, category: str, new_key: str | None = None) -> str:
        """Move a live tensor to another category (e.g. a temporary saved for backward)."""
        tensor = self.live[key]
        self.free(key, op="retag")
        new_key = new_key or key
        self.alloc(new_key, tensor.nbytes, category, tensor.op)
        return new_key

    def _change(self, key: str, category: str, delta: int, op: str, time_s) -> None:
        self.current[category] += delta
        now = self.clock() if time_s is None else time_s
        # tuple.__new__ skips NamedTuple's Python-level constructor: paper-scale runs make millions
        self.events.append(_new_event(MemEvent, (now, key, category, delta, op)))
        self._summary = None

    def summary(self) -> MemorySummary:
        """Peaks and OOM verdict from the time-ordered events (cached until the next change)."""
        if self._summary is None:
            self._summary = summarize(self.events, CATEGORIES, self.rank, self.capacity_bytes)
        return self._summary

    @property
    def peak_total(self) -> int:
        return self.summary().peak_total

    @property
    def peak_by_category(self) -> dict:
        return self.summary().peak_by_category

    @property
    def oom(self) -> OutOfMemory | None:
        return self.summary().oom

    def largest_live(self, count: int = 5) -> tuple[LiveTensor, ...]:
        return largest(self.live, count)

    def live_bytes(self, category: str) -> int:
        return self.current[category]
