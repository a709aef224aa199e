"""Per-rank memory ledger: every tensor allocated and freed by name, category, bytes and time.

Timelines, peaks and out-of-memory reports are all derived from its event log.
"""

from dataclasses import dataclass, field

CATEGORIES = ("weights", "gradients", "optimizer", "activations", "temporaries", "communication")


@dataclass(frozen=True)
class MemEvent:
    """One change of the ledger: +bytes on alloc, -bytes on free, at simulated time."""

    time_s: float
    key: str
    category: str
    delta_bytes: int
    op: str


@dataclass(frozen=True)
class LiveTensor:
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


@dataclass
class Ledger:
    """Live tensors, running totals per category, peaks and the event log of one rank."""

    rank: int
    capacity_bytes: int
    clock: callable = lambda: 0.0
    live: dict = field(default_factory=dict)  # key -> LiveTensor
    current: dict = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    peak_by_category: dict = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    peak_total: int = 0
    events: list = field(default_factory=list)
    oom: OutOfMemory | None = None

    @property
    def total(self) -> int:
        return sum(self.current.values())

    def alloc(self, key: str, nbytes: int, category: str, op: str) -> None:
        """Record a new tensor; the first allocation beyond capacity is kept as the OOM result."""
        if key in self.live:
            raise KeyError(f"rank {self.rank}: tensor {key!r} allocated twice")
        if category not in self.current:
            raise KeyError(f"unknown memory category {category!r}")
        in_use = self.total
        if self.oom is None and in_use + nbytes > self.capacity_bytes:
            self.oom = OutOfMemory(self.rank, op, key, self.clock(), nbytes, in_use,
                                   self.capacity_bytes, self.largest_live())
        self.live[key] = LiveTensor(key, category, nbytes, op)
        self._change(key, category, nbytes, op)

    def free(self, key: str, op: str = "free") -> None:
        """Release a live tensor."""
        tensor = self.live.pop(key)
        self._change(key, tensor.category, -tensor.nbytes, op)

    def retag(self, key: str, category: str, new_key: str | None = None) -> str:
        """Move a live tensor to another category (e.g. a temporary saved for backward)."""
        tensor = self.live[key]
        self.free(key, op="retag")
        new_key = new_key or key
        self.alloc(new_key, tensor.nbytes, category, tensor.op)
        return new_key

    def _change(self, key: str, category: str, delta: int, op: str) -> None:
        self.current[category] += delta
        self.events.append(MemEvent(self.clock(), key, category, delta, op))
        if delta > 0:
            self.peak_by_category[category] = max(self.peak_by_category[category],
                                                  self.current[category])
            self.peak_total = max(self.peak_total, self.total)

    def largest_live(self, count: int = 5) -> tuple[LiveTensor, ...]:
        """The biggest live tensors, largest first (ties by key, for determinism)."""
        ordered = sorted(self.live.values(), key=lambda t: (-t.nbytes, t.key))
        return tuple(ordered[:count])

    def live_bytes(self, category: str) -> int:
        return self.current[category]
