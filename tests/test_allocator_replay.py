"""Replaying allocation streams: the timeline's peaks and the segments at a chosen event, bad
events refused in one line, and the allocator's bookkeeping invariants over random streams
(segments add up to reserved, allocated blocks to allocated, blocks tile their segment, no two
free neighbours left unmerged, nothing reserved once everything is freed and the cache emptied)."""

from hypothesis import given, settings, strategies as st
import pytest

from simsp.engine.allocator.config import AllocatorConfig
from simsp.engine.allocator.replay import Alloc, EmptyCache, Free, replay, segments_at
from simsp.engine.allocator.sizes import MIN_BLOCK_SIZE, SMALL_BUFFER
from simsp.errors import UserError

MiB, GiB = 1 << 20, 1 << 30
BIG = AllocatorConfig(80 * GiB)


def test_peaks_and_the_segments_at_the_allocated_peak():
    # 8 MiB then 4 MiB in one 20 MiB segment (allocated 12 MiB: the peak, event 1); 8 MiB freed;
    # 2 MiB more reuses the hole. Right after event 1 the segment is 8 | 4 | 8 free.
    events = [Alloc("a", 8 * MiB), Alloc("b", 4 * MiB), Free("a"), Alloc("c", 2 * MiB)]
    timeline = replay(events, BIG).timeline
    assert list(timeline.allocated) == [8 * MiB, 12 * MiB, 4 * MiB, 6 * MiB]
    assert (timeline.allocated_peak, timeline.allocated_peak_index) == (12 * MiB, 1)
    assert timeline.reserved_peak == 20 * MiB
    assert timeline.fragmentation_at_peak == 8 * MiB
    (segment,) = segments_at(events, BIG, timeline.allocated_peak_index)
    assert [(b.size, b.allocated) for b in segment.blocks] == [(8 * MiB, True), (4 * MiB, True),
                                                               (8 * MiB, False)]


def test_a_zero_byte_request_touches_no_allocator():
    run = replay([Alloc("z", 0), Alloc("a", 1), Free("z"), Free("a")], BIG)
    assert list(run.timeline.reserved) == [0, 2 * MiB, 2 * MiB, 2 * MiB]
    assert list(run.timeline.allocated) == [0, 512, 512, 0]


def test_an_empty_stream():
    timeline = replay([], BIG).timeline
    assert (timeline.reserved_peak, timeline.allocated_peak_index, timeline.fragmentation_at_peak) == (0, -1, 0)


@pytest.mark.parametrize("events, reason", [
    ([Alloc("a", 1), Alloc("a", 1)], "already allocated"),
    ([Free("a")], "not allocated"),
    ([Alloc("a", -1)], "non-negative"),
    ([Alloc("a", 1.5)], "non-negative"),
    ([("alloc", "a", 1)], "expected Alloc"),
])
def test_bad_events_are_refused_in_one_line(events, reason):
    with pytest.raises(UserError) as error:
        replay(events, BIG)
    assert reason in str(error.value) and "\n" not in str(error.value)
    assert error.value.field == f"allocation event {len(events) - 1}"


def check_invariants(run) -> None:
    """The bookkeeping that must hold after any event."""
    allocator, segments = run.allocator, run.segments()
    assert sum(s.total_size for s in segments) == allocator.reserved
    assert sum(b.size for s in segments for b in s.blocks if b.allocated) == allocator.allocated
    assert sum(b.requested for s in segments for b in s.blocks if b.allocated) == allocator.requested
    assert allocator.reserved <= allocator.config.capacity_bytes
    for segment in segments:
        ends = [b.address + b.size for b in segment.blocks]
        assert [b.address for b in segment.blocks] == [segment.address] + ends[:-1]
        assert all(b.size % MIN_BLOCK_SIZE == 0 for b in segment.blocks)
        free = [not b.allocated for b in segment.blocks]
        assert not any(a and b for a, b in zip(free, free[1:]))  # coalesced
        if segment.small and not segment.expandable:
            assert segment.total_size == SMALL_BUFFER


SIZES = st.one_of(st.integers(1, 2 * MiB), st.integers(MiB, 40 * MiB), st.integers(0, 4096))


@st.composite
def streams(draw):
    """A random stream of allocations, frees and cache emptying over two streams."""
    events, live, key = [], [], 0
    for _ in range(draw(st.integers(1, 60))):
        choice = draw(st.integers(0, 9))
        if live and choice < 4:
            events.append(Free(live.pop(draw(st.integers(0, len(live) - 1)))))
        elif choice == 9:
            events.append(EmptyCache())
        else:
            events.append(Alloc(key, draw(SIZES), stream=draw(st.integers(0, 1))))
            live.append(key)
            key += 1
    return events, live


@settings(max_examples=150, deadline=None)
@given(streams(), st.booleans(), st.sampled_from([None, 20 * MiB]),
       st.sampled_from([120 * MiB, 80 * GiB]))
def test_invariants_hold_over_random_streams(stream, expandable, max_split, capacity):
    events, live = stream
    config = AllocatorConfig(capacity, expandable_segments=expandable, max_split_size=max_split)
    run = replay(events, config)
    check_invariants(run)
    if run.timeline.oom is None:  # free what is left and empty the cache: nothing stays reserved
        done = replay(events + [Free(k) for k in live] + [EmptyCache()], config)
        check_invariants(done)
        assert (done.allocator.reserved, done.allocator.segments) == (0, 0)
