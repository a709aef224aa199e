"""Replaying an allocation stream through the caching allocator: reserved and allocated bytes
after every event, their peaks, the fragmentation at the allocated peak, and the first
out-of-memory (docs/allocator.md#replaying-an-allocation-stream).

Events are Alloc(key, nbytes, stream), Free(key) and EmptyCache(), in order; a request of 0 bytes
touches no allocator (PyTorch returns a null pointer for it), and so does its Free.
"""

from array import array
from dataclasses import dataclass
from typing import Hashable, NamedTuple

from simsp.errors import UserError
from simsp.engine.allocator.caching import AllocatorOutOfMemory, CachingAllocator
from simsp.engine.allocator.config import AllocatorConfig
from simsp.engine.allocator.segments import SegmentInfo, segment_infos


class Alloc(NamedTuple):
    """A request of `nbytes` on `stream` at `time_s`; `context` names its model site for
    snapshots: a snapshot.Site, or any hashable label."""

    key: Hashable
    nbytes: int
    stream: int = 0
    time_s: float = 0.0
    context: object = None


class Free(NamedTuple):
    """The release of request `key`."""

    key: Hashable
    time_s: float = 0.0


class EmptyCache(NamedTuple):
    """A call of torch.cuda.empty_cache()."""

    time_s: float = 0.0


class OutOfMemory(NamedTuple):
    """The event the allocator could not serve, and the state it failed in."""

    index: int
    key: Hashable
    nbytes: int
    reserved: int
    allocated: int
    capacity: int


@dataclass
class Timeline:
    """Bytes after each event served; peaks are the first event reaching them."""

    reserved: array  # shape (events served,): reserved bytes after each event
    allocated: array  # shape (events served,): allocated bytes (rounded blocks) after each event
    requested: array  # shape (events served,): bytes the live requests asked for
    oom: OutOfMemory | None = None

    @property
    def reserved_peak(self) -> int:
        """The most bytes reserved at once."""
        return max(self.reserved, default=0)

    @property
    def allocated_peak(self) -> int:
        """The most bytes allocated at once."""
        return max(self.allocated, default=0)

    @property
    def allocated_peak_index(self) -> int:
        """The first event after which allocated bytes are at their peak (-1 if none)."""
        return self.allocated.index(self.allocated_peak) if self.allocated else -1

    @property
    def fragmentation_at_peak(self) -> int:
        """Reserved minus allocated bytes at the allocated peak: memory held but unusable then."""
        index = self.allocated_peak_index
        return self.reserved[index] - self.allocated[index] if index >= 0 else 0


class Replay(NamedTuple):
    """A replay's timeline and the allocator as the replay left it (its segments, its trace)."""

    timeline: Timeline
    allocator: CachingAllocator

    def segments(self) -> list[SegmentInfo]:
        """The segments and their blocks when the replay stopped."""
        return segment_infos(self.allocator)


def _bad_event(index: int, reason: str) -> UserError:
    return UserError(f"allocation event {index}", reason)


def replay(events, config: AllocatorConfig, record_trace: bool = False,
           stop_after: int | None = None) -> Replay:
    """Run `events` through a fresh allocator, stopping at the first out-of-memory or after event
    `stop_after`; with `record_trace` the allocator keeps its trace for a snapshot."""
    allocator = CachingAllocator(config, record_trace)
    timeline = Timeline(array("q"), array("q"), array("q"))
    live: dict = {}  # key -> Block, or None for a 0-byte request
    for index, event in enumerate(events):
        try:
            _apply(allocator, live, index, event)
        except AllocatorOutOfMemory as oom:
            timeline.oom = OutOfMemory(index, event.key, event.nbytes, oom.reserved, oom.allocated,
                                       oom.capacity)
            break
        timeline.reserved.append(allocator.reserved)
        timeline.allocated.append(allocator.allocated)
        timeline.requested.append(allocator.requested)
        if index == stop_after:
            break
    return Replay(timeline, allocator)


def _apply(allocator: CachingAllocator, live: dict, index: int, event) -> None:
    """One event: allocate, free or empty the cache."""
    kind = type(event)
    if kind not in (Alloc, Free, EmptyCache):
        raise _bad_event(index, f"expected Alloc, Free or EmptyCache, got {event!r}")
    allocator.now_us = round(event.time_s * 1e6)
    if kind is Alloc:
        if event.key in live:
            raise _bad_event(index, f"key {event.key!r} is already allocated")
        if not isinstance(event.nbytes, int) or event.nbytes < 0:
            raise _bad_event(index, f"bytes must be a non-negative integer, got {event.nbytes!r}")
        live[event.key] = (allocator.malloc(event.nbytes, event.stream, event.context)
                           if event.nbytes else None)
    elif kind is Free:
        if event.key not in live:
            raise _bad_event(index, f"key {event.key!r} is not allocated")
        block = live.pop(event.key)
        if block is not None:
            allocator.free(block)
    else:
        allocator.empty_cache()


def segments_at(events, config: AllocatorConfig, index: int) -> list[SegmentInfo]:
    """The segments and blocks right after event `index` (e.g. a timeline's allocated peak)."""
    return replay(events, config, stop_after=index).segments()
