"""The trace: what happened, when. Spans of work on a rank's tracks and point-to-point transfers.

Plain records, no I/O: metrics and reports read them later.
"""

from dataclasses import dataclass, field
from itertools import repeat
from typing import NamedTuple

TRACE_DETAILS = ("none", "steps", "full")  # `simsp run --trace`
DETAIL_TRACKS = ("compute", "tp_comm")  # recorded only at "full"


class Span(NamedTuple):
    """Rank `rank` spent [start_s, end_s) on `name` on one track ("compute", "comm", ...).

    A NamedTuple: a paper-scale run records millions, and tuples are cheap to make."""

    rank: int
    track: str
    name: str
    start_s: float
    end_s: float
    args: dict = {}

    @property
    def duration_s(self) -> float:
        """Length of the span in seconds."""
        return self.end_s - self.start_s


_new_span = tuple.__new__  # skips NamedTuple's Python-level constructor on the hot path
_NO_ARGS: dict = {}


class TransferRecord(NamedTuple):
    """`nbytes` moved from GPU `src` to GPU `dst` over [start_s, end_s)."""

    src: int
    dst: int
    nbytes: int
    start_s: float
    end_s: float
    label: str


class _Block(NamedTuple):
    """Transfers recorded at once (Trace.add_transfers)."""

    srcs: list
    dsts: list
    nbytes: tuple  # (n,) each transfer's bytes
    starts: object  # float array of n elements, any shape (read in C order)
    ends: object  # float array of n elements, as starts
    labels: tuple

    def records(self):
        """The block's TransferRecords, in order."""
        return map(_new_span, repeat(TransferRecord), zip(
            self.srcs, self.dsts, self.nbytes, self.starts.ravel().tolist(),
            self.ends.ravel().tolist(), self.labels))


@dataclass
class Trace:
    """Every span and transfer of one simulation, in the order they were recorded.

    Spans on a track in `skip` are not recorded (a trace written at lower detail). Transfers
    may come in blocks (add_transfers: a CP ring call's sends at once, their times as arrays),
    turned into records, in order, when `transfers` is read."""

    spans: list[Span] = field(default_factory=list)
    _transfers: list = field(default_factory=list)  # TransferRecord, or a block of them
    skip: frozenset = frozenset()
    _blocks: int = 0  # blocks in _transfers not yet turned into records

    @property
    def transfers(self) -> list[TransferRecord]:
        """Every transfer recorded, in order (blocks turned into records on first read)."""
        if self._blocks:
            records = []
            for item in self._transfers:
                if type(item) is _Block:
                    records.extend(item.records())
                else:
                    records.append(item)
            self._transfers, self._blocks = records, 0
        return self._transfers

    def add_span(self, rank: int, track: str, name: str, start_s: float, end_s: float,
                 args: dict | None = None) -> Span | None:
        """Record one span and return it (None when its track is skipped).

        `args` is kept, not copied: callers pass a fresh dict and never change it after."""
        if track in self.skip:
            return None
        span = _new_span(Span, (rank, track, name, start_s, end_s, args or _NO_ARGS))
        self.spans.append(span)
        return span

    def add_transfer(self, record: TransferRecord) -> None:
        """Record one finished point-to-point transfer."""
        self._transfers.append(record)

    def add_transfers(self, srcs: list, dsts: list, nbytes: tuple, starts, ends,
                      labels: tuple) -> None:
        """Record transfers i = 0.. of srcs[i] -> dsts[i], nbytes[i] each, over
        [starts[i], ends[i]) (arrays of n elements in C order, e.g. (steps, c) a CP ring call's
        sends, never changed after), labels[i], as one block."""
        self._transfers.append(_new_span(_Block, (srcs, dsts, nbytes, starts, ends, labels)))
        self._blocks += 1

    def spans_of(self, rank: int, track: str | None = None) -> list[Span]:
        """The spans of `rank`, optionally only those on `track`, in recording order."""
        return [s for s in self.spans if s.rank == rank and (track is None or s.track == track)]
