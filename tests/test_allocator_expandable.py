"""Expandable segments against sequences worked by hand from Note [Expandable Segments] of
PyTorch's `c10/cuda/CUDACachingAllocator.cpp` (docs/allocator.md#expandable-segments): pages of
20 MiB (large pool) and 2 MiB (small pool), growth at the lowest address with room, splitting
down to 512 B, the best-fit preference for blocks that cannot grow, and empty_cache unmapping
whole free pages only."""

from simsp.engine.allocator.config import AllocatorConfig
from simsp.engine.allocator.replay import Alloc, EmptyCache, Free, replay

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
PLAIN = AllocatorConfig(80 * GiB)
EXPANDABLE = AllocatorConfig(80 * GiB, expandable_segments=True)


def layout(run):
    """[(offset from the first segment's start, size, allocated)] of every mapped block."""
    segments = run.segments()
    start = min(s.address for s in segments)
    return [(b.address - start, b.size, b.allocated) for s in segments for b in s.blocks]


def test_a_growing_request_extends_the_segment_instead_of_adding_one():
    # Plain: 12 MiB gets a 12 MiB segment; after its free, 13 MiB does not fit it: a 14 MiB
    # segment more, 26 MiB reserved. Expandable: 12 MiB maps one 20 MiB page, split 12 | 8;
    # freed, the 20 MiB merge; 13 MiB splits them 13 | 7: 20 MiB reserved.
    events = [Alloc("x", 12 * MiB), Free("x"), Alloc("y", 13 * MiB)]
    plain, grown = replay(events, PLAIN).timeline, replay(events, EXPANDABLE).timeline
    assert list(plain.reserved) == [12 * MiB, 12 * MiB, 26 * MiB]
    assert list(grown.reserved) == [20 * MiB, 20 * MiB, 20 * MiB]
    assert (plain.allocated[-1], grown.allocated[-1]) == (14 * MiB, 13 * MiB)


def test_the_fragmentation_sequence_in_one_growing_segment():
    # 6 | 6 | 6 | 2 free in the first page; a2 freed; 7 MiB fits no hole, so the segment grows
    # from its free 2 MiB end by one page: 2 + 20 = 22 MiB split 7 | 15. One 40 MiB range.
    run = replay([Alloc("a1", 6 * MiB), Alloc("a2", 6 * MiB), Alloc("a3", 6 * MiB), Free("a2"),
                  Alloc("b", 7 * MiB)], EXPANDABLE, record_trace=True)
    assert layout(run) == [(0, 6 * MiB, True), (6 * MiB, 6 * MiB, False), (12 * MiB, 6 * MiB, True),
                           (18 * MiB, 7 * MiB, True), (25 * MiB, 15 * MiB, False)]
    assert [s.expandable for s in run.segments()] == [True]
    maps = [(e.action, e.addr - run.segments()[0].address, e.size)
            for e in run.allocator.trace if e.action.startswith("segment")]
    assert maps == [("segment_map", 0, 20 * MiB), ("segment_map", 20 * MiB, 20 * MiB)]
    assert run.timeline.fragmentation_at_peak == 40 * MiB - 19 * MiB


def test_best_fit_passes_over_a_block_that_can_grow():
    # 6 | 6 free | 6 | 2 free + unmapped. 1.5 MiB best-fits the 2 MiB end block in a plain
    # segment (0.5 MiB left, not split); with expandable segments that block could grow by the
    # whole unmapped range, so the 6 MiB hole at offset 6 MiB is taken (and split: 4.5 MiB left).
    events = [Alloc("a1", 6 * MiB), Alloc("a2", 6 * MiB), Alloc("a3", 6 * MiB), Free("a2"),
              Alloc("c", 3 * MiB // 2)]
    assert (18 * MiB, 2 * MiB, True) in layout(replay(events, PLAIN))
    assert layout(replay(events, EXPANDABLE))[1:3] == [(6 * MiB, 3 * MiB // 2, True),
                                                       (15 * MiB // 2, 9 * MiB // 2, False)]


def test_small_requests_map_2_mib_pages():
    # 1000 B rounds to 1024 in the small pool: one 2 MiB page; 1 MiB more fits in the same page.
    run = replay([Alloc("a", 1000), Alloc("b", MiB)], EXPANDABLE)
    assert list(run.timeline.reserved) == [2 * MiB, 2 * MiB]
    assert layout(run) == [(0, 1024, True), (1024, MiB, True), (MiB + 1024, MiB - 1024, False)]


def test_empty_cache_unmaps_only_whole_free_pages():
    # a 30 MiB maps pages 0-1, split 30 | 10; b 25 MiB grows from the 10 MiB free end by page 2:
    # b at 30 MiB, 5 MiB free at 55. a freed: 30 MiB free at 0. empty_cache unmaps page 0 (wholly
    # free) and keeps 20-30 (page 1 holds part of b) and 55-60: 40 MiB reserved, the mapped
    # range 20-60. b freed: one free 20-60 block; empty_cache unmaps pages 1-2 and the segment
    # is given back.
    run = replay([Alloc("a", 30 * MiB), Alloc("b", 25 * MiB), Free("a"), EmptyCache(), Free("b"),
                  EmptyCache()], EXPANDABLE, record_trace=True)
    assert [r // MiB for r in run.timeline.reserved] == [40, 60, 60, 40, 40, 0]
    events = [(e.action, e.size) for e in run.allocator.trace if e.action.startswith("segment")]
    assert events == [("segment_map", 40 * MiB), ("segment_map", 20 * MiB),
                      ("segment_unmap", 20 * MiB), ("segment_unmap", 40 * MiB)]
    assert run.allocator.segments == 0 and run.segments() == []


def test_after_a_partial_unmap_the_snapshot_shows_the_mapped_range():
    run = replay([Alloc("a", 30 * MiB), Alloc("b", 25 * MiB), Free("a"), EmptyCache()], EXPANDABLE)
    (segment,) = run.segments()
    first_page = segment.address - 20 * MiB  # the unmapped page 0 is no part of any segment
    assert segment.total_size == 40 * MiB and segment.expandable
    assert [(b.address - first_page, b.size, b.allocated) for b in segment.blocks] == [
        (20 * MiB, 10 * MiB, False), (30 * MiB, 25 * MiB, True), (55 * MiB, 5 * MiB, False)]


def test_expandable_out_of_memory_when_no_whole_page_is_free():
    # Capacity 39 MiB: after 6 | 6 free | 6 | 2 free in one 20 MiB page, 7 MiB needs a second page
    # (40 > 39) and no page is wholly free to unmap: out of memory at 20 MiB reserved.
    run = replay([Alloc("a1", 6 * MiB), Alloc("a2", 6 * MiB), Alloc("a3", 6 * MiB), Free("a2"),
                  Alloc("b", 7 * MiB)], AllocatorConfig(39 * MiB, expandable_segments=True))
    assert run.timeline.oom is not None
    assert (run.timeline.oom.index, run.timeline.oom.reserved) == (4, 20 * MiB)


def test_a_stream_grows_its_own_segment():
    # 12 MiB on stream 0 and on stream 1: each stream maps a 20 MiB page of its own segment.
    run = replay([Alloc("a", 12 * MiB, stream=0), Alloc("b", 12 * MiB, stream=1)], EXPANDABLE)
    assert run.timeline.reserved[-1] == 40 * MiB
    assert sorted(s.stream for s in run.segments()) == [0, 1]


def test_a_failed_growth_unmaps_free_pages_and_retries():
    # Capacity 100 MiB, max_split_size 20 MiB. a 10 MiB maps page 0 (a | 10 free); big 40 MiB
    # grows from the free end by pages 1-2; c 10 MiB fills the last 10 MiB: a | big | c, pages
    # 0-2. big freed: 40 MiB free at 10-50. d 45 MiB: no free block is large enough; growing
    # past c takes 3 pages, 60 + 60 > 100; no oversize block may be freed (expandable); the
    # cache release unmaps page 1, the only page wholly free (10-20 and 40-50 stay cached);
    # the retry cannot use the hole (10 + 20 + 10 < 45) and grows past c: 40 + 60 = 100 MiB.
    config = AllocatorConfig(100 * MiB, expandable_segments=True, max_split_size=20 * MiB)
    run = replay([Alloc("a", 10 * MiB), Alloc("big", 40 * MiB), Alloc("c", 10 * MiB), Free("big"),
                  Alloc("d", 45 * MiB)], config, record_trace=True)
    assert [r // MiB for r in run.timeline.reserved] == [20, 60, 60, 60, 100]
    start = run.segments()[0].address
    segment_events = [(e.action, (e.addr - start) // MiB, e.size // MiB)
                      for e in run.allocator.trace if e.action.startswith("segment")]
    assert segment_events == [("segment_map", 0, 20), ("segment_map", 20, 40),
                              ("segment_unmap", 20, 20), ("segment_map", 60, 60)]
    assert [[(b.size // MiB, b.allocated) for b in s.blocks] for s in run.segments()] == [
        [(10, True), (10, False)], [(10, False), (10, True), (45, True), (15, False)]]
