"""The caching allocator model against sequences worked by hand from the rules of PyTorch's
`c10/cuda/CUDACachingAllocator.cpp` (docs/allocator.md): 512-byte rounding, the 1 MiB small/large
boundary, 2 MiB / 20 MiB / rounded segments, best fit, the split thresholds, coalescing, streams,
the release-and-retry before an out-of-memory, empty_cache, max_split_size and
roundup_power2_divisions. Every expected number is worked out in the comments, not taken from
the code."""

import pytest

from simsp.engine.allocator.config import AllocatorConfig, parse_alloc_conf
from simsp.engine.allocator.replay import Alloc, EmptyCache, Free, replay
from simsp.engine.allocator.sizes import allocation_size, round_size, roundup_power2_next_division
from simsp.errors import UserError

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
BIG = AllocatorConfig(80 * GiB)  # capacity that never binds


def blocks_of(run):
    """[(segment offset of each block, size, allocated)] per segment, in MiB where whole."""
    return [[(b.address - s.address, b.size, b.allocated) for b in s.blocks] for s in run.segments()]


def actions(run):
    return [(e.action, e.size) for e in run.allocator.trace]


@pytest.mark.parametrize("nbytes, rounded", [
    (1, 512), (511, 512), (512, 512), (513, 1024), (1000, 1024),  # up to a multiple of 512
    (MiB, MiB), (MiB + 1, MiB + 512), (10 * MiB - 1, 10 * MiB),
])
def test_requests_round_up_to_512_bytes(nbytes, rounded):
    assert round_size(nbytes) == rounded


@pytest.mark.parametrize("size, segment", [
    (512, 2 * MiB), (MiB, 2 * MiB),  # small pool: 2 MiB segments
    (MiB + 512, 20 * MiB), (10 * MiB - 512, 20 * MiB),  # 1-10 MiB: a shared 20 MiB segment
    (10 * MiB, 10 * MiB), (10 * MiB + 512, 12 * MiB), (11 * MiB, 12 * MiB),  # own, 2 MiB rounded
])
def test_segment_sizes(size, segment):
    assert allocation_size(size) == segment


def test_just_under_10_mib_rounds_into_a_segment_of_its_own():
    # 10 MiB - 1 B rounds to 10 MiB, no longer below kMinLargeAlloc: a 10 MiB segment, no split;
    # 10 MiB - 513 B rounds to 10 MiB - 512: a 20 MiB segment split after the block.
    own = replay([Alloc("a", 10 * MiB - 1)], BIG)
    shared = replay([Alloc("a", 10 * MiB - 513)], BIG)
    assert (own.timeline.reserved[-1], own.timeline.allocated[-1]) == (10 * MiB, 10 * MiB)
    assert (shared.timeline.reserved[-1], shared.timeline.allocated[-1]) == (20 * MiB, 10 * MiB - 512)
    assert blocks_of(shared) == [[(0, 10 * MiB - 512, True), (10 * MiB - 512, 10 * MiB + 512, False)]]


def test_1_mib_is_small_and_one_byte_more_is_large():
    # 1 MiB: small pool, a 2 MiB segment split 1 + 1; the second 1 MiB fills the rest exactly;
    # 1 MiB + 1 B rounds to 1 MiB + 512: large pool, a 20 MiB segment.
    run = replay([Alloc("a", MiB), Alloc("b", MiB), Alloc("c", MiB + 1)], BIG)
    assert list(run.timeline.reserved) == [2 * MiB, 2 * MiB, 22 * MiB]
    assert list(run.timeline.allocated) == [MiB, 2 * MiB, 3 * MiB + 512]
    assert [s.small for s in run.segments()] == [True, False]


def test_small_requests_pack_into_2_mib_segments():
    # a 512 | b 1024 | c 1 MiB share one 2 MiB segment (each split leaves >= 512 B);
    # d 1 MiB finds only 1 MiB - 1536 free: a second segment.
    run = replay([Alloc("a", 512), Alloc("b", 1000), Alloc("c", MiB), Alloc("d", MiB)], BIG)
    assert run.timeline.reserved[-1] == 4 * MiB
    assert run.timeline.allocated[-1] == 2 * MiB + 1536
    assert run.timeline.requested[-1] == 512 + 1000 + 2 * MiB
    assert blocks_of(run) == [[(0, 512, True), (512, 1024, True), (1536, MiB, True),
                               (MiB + 1536, MiB - 1536, False)],
                              [(0, MiB, True), (MiB, MiB, False)]]


def test_large_blocks_keep_a_remainder_of_1_mib_or_less():
    # a 5 MiB splits a 20 MiB segment (15 MiB > 1 MiB left); b 14.5 MiB best-fits the 15 MiB block
    # and leaves 0.5 MiB, not more than 1 MiB: b gets all 15 MiB.
    run = replay([Alloc("a", 5 * MiB), Alloc("b", 29 * MiB // 2)], BIG)
    assert run.timeline.allocated[-1] == 20 * MiB
    assert run.timeline.requested[-1] == 39 * MiB // 2
    assert blocks_of(run) == [[(0, 5 * MiB, True), (5 * MiB, 15 * MiB, True)]]


def test_best_fit_takes_the_smallest_block_then_the_lowest_address():
    # Free blocks of 12, 16, 14 (z) and 14 (w) MiB, each a segment of its own. 13 MiB: the 14s
    # tie, the lower address (z) wins, 1 MiB left is not split. 12.5 MiB: w, 1.5 MiB split off.
    sizes = {"x": 12 * MiB, "y": 16 * MiB, "z": 14 * MiB, "w": 14 * MiB}
    events = [Alloc(k, n) for k, n in sizes.items()] + [Free(k) for k in sizes]
    run = replay(events + [Alloc("p", 13 * MiB), Alloc("q", 25 * MiB // 2)], BIG)
    segments = run.segments()  # by address: x, y, z, w
    assert [s.total_size for s in segments] == [12 * MiB, 16 * MiB, 14 * MiB, 14 * MiB]
    assert [[(b.size, b.allocated) for b in s.blocks] for s in segments[2:]] == [
        [(14 * MiB, True)], [(25 * MiB // 2, True), (3 * MiB // 2, False)]]
    assert run.timeline.reserved[-1] == 56 * MiB  # no new segment
    assert run.timeline.allocated[-1] == 14 * MiB + 25 * MiB // 2


def test_freed_neighbours_coalesce():
    # a, b, c of 5 MiB split one 20 MiB segment: a|b|c|5 free. Freeing b then a merges them
    # into 10 MiB at offset 0; 8 MiB takes it and splits off the 2 MiB left (> 1 MiB);
    # 6 MiB fits neither the 2 nor the 5 MiB hole: a second 20 MiB segment.
    run = replay([Alloc("a", 5 * MiB), Alloc("b", 5 * MiB), Alloc("c", 5 * MiB), Free("b"),
                  Free("a"), Alloc("d", 8 * MiB), Alloc("e", 6 * MiB)], BIG)
    assert blocks_of(run) == [[(0, 8 * MiB, True), (8 * MiB, 2 * MiB, False),
                               (10 * MiB, 5 * MiB, True), (15 * MiB, 5 * MiB, False)],
                              [(0, 6 * MiB, True), (6 * MiB, 14 * MiB, False)]]
    assert list(run.timeline.reserved) == [20 * MiB] * 6 + [40 * MiB]


def test_a_freed_block_is_reused_only_on_its_own_stream():
    # 1 MiB on stream 0, freed; 1 MiB on stream 1 gets a segment of its own; another 1 MiB on
    # stream 0 reuses stream 0's segment.
    run = replay([Alloc("a", MiB, stream=0), Free("a"), Alloc("b", MiB, stream=1),
                  Alloc("c", MiB, stream=0)], BIG)
    assert list(run.timeline.reserved) == [2 * MiB, 2 * MiB, 4 * MiB, 4 * MiB]
    first, second = run.segments()
    assert (first.stream, second.stream) == (0, 1)
    assert [b.allocated for b in first.blocks] == [True, False]


FRAGMENTED = [Alloc("a1", 6 * MiB), Alloc("a2", 6 * MiB), Alloc("a3", 6 * MiB), Free("a2"),
              Alloc("b", 7 * MiB)]


def test_fragmentation_reserved_exceeds_allocated_by_a_known_amount():
    # a1 a2 a3 split one 20 MiB segment: 6|6|6|2 free. Freeing a2 leaves holes of 6 and 2 MiB,
    # neither fits 7 MiB: a second 20 MiB segment, 7|13 free. At the allocated peak (19 MiB,
    # the last event) 40 MiB are reserved: 21 MiB reserved but unallocated.
    timeline = replay(FRAGMENTED, BIG).timeline
    assert list(timeline.reserved) == [20 * MiB, 20 * MiB, 20 * MiB, 20 * MiB, 40 * MiB]
    assert list(timeline.allocated) == [6 * MiB, 12 * MiB, 18 * MiB, 12 * MiB, 19 * MiB]
    assert (timeline.allocated_peak, timeline.allocated_peak_index) == (19 * MiB, 4)
    assert timeline.fragmentation_at_peak == 21 * MiB
    assert timeline.oom is None


def test_fragmentation_runs_out_of_memory_with_memory_free():
    # Capacity 39 MiB: the 7 MiB request needs a 20 MiB segment (kLargeBuffer) but only 19 MiB
    # are free; the one segment is split (in use), so releasing the cache frees nothing: OOM,
    # with 20 MiB reserved and 12 MiB allocated.
    run = replay(FRAGMENTED, AllocatorConfig(39 * MiB), record_trace=True)
    assert run.timeline.oom == (4, "b", 7 * MiB, 20 * MiB, 12 * MiB, 39 * MiB)
    assert len(run.timeline.reserved) == 4
    last = run.allocator.trace[-1]
    assert (last.action, last.addr, last.size) == ("oom", 19 * MiB, 7 * MiB)  # device_free, size


def test_out_of_memory_releases_cached_segments_and_retries():
    # Capacity 24 MiB: a 12 MiB segment, freed but cached; 13 MiB needs a 14 MiB segment and
    # 12 + 14 > 24, so the allocator frees the unsplit cached 12 MiB segment and retries.
    run = replay([Alloc("a", 12 * MiB), Free("a"), Alloc("b", 13 * MiB)], AllocatorConfig(24 * MiB),
                 record_trace=True)
    assert list(run.timeline.reserved) == [12 * MiB, 12 * MiB, 14 * MiB]
    assert list(run.timeline.allocated) == [12 * MiB, 0, 14 * MiB]
    assert actions(run) == [("segment_alloc", 12 * MiB), ("alloc", 12 * MiB),
                            ("free_requested", 12 * MiB), ("free_completed", 12 * MiB),
                            ("segment_free", 12 * MiB), ("segment_alloc", 14 * MiB),
                            ("alloc", 13 * MiB)]


def test_empty_cache_releases_only_unsplit_segments():
    # a 1 KiB (2 MiB small segment), b 12 MiB (own segment), c 5 MiB (20 MiB segment, split).
    # After freeing a and b, empty_cache frees the 12 MiB and the 2 MiB segments (large pool
    # first) and keeps c's; freeing c and emptying again leaves nothing.
    run = replay([Alloc("a", KiB), Alloc("b", 12 * MiB), Alloc("c", 5 * MiB), Free("b"), Free("a"),
                  EmptyCache(), Free("c"), EmptyCache()], BIG, record_trace=True)
    assert list(run.timeline.reserved) == [2 * MiB, 14 * MiB, 34 * MiB, 34 * MiB, 34 * MiB,
                                           20 * MiB, 20 * MiB, 0]
    frees = [size for action, size in actions(run) if action == "segment_free"]
    assert frees == [12 * MiB, 2 * MiB, 20 * MiB]
    assert run.segments() == [] and run.allocator.segments == 0


def test_max_split_size_keeps_oversize_blocks_whole():
    # max_split_size 20 MiB. A 40 MiB block, cached, is not handed to a 10 MiB request (below
    # the limit): a new 10 MiB segment. 30 MiB may take it (40 < 30 + 20) and does not split
    # it. 20 MiB may not (40 >= 20 + 20): a new 20 MiB segment.
    config = AllocatorConfig(BIG.capacity_bytes, max_split_size=20 * MiB)
    run = replay([Alloc("a", 40 * MiB), Free("a"), Alloc("b", 10 * MiB), Alloc("c", 30 * MiB),
                  Free("c"), Alloc("d", 20 * MiB)], config)
    assert list(run.timeline.reserved) == [40 * MiB, 40 * MiB, 50 * MiB, 50 * MiB, 50 * MiB, 70 * MiB]
    assert list(run.timeline.allocated) == [40 * MiB, 0, 10 * MiB, 50 * MiB, 10 * MiB, 30 * MiB]


@pytest.mark.parametrize("max_split, allocated", [(None, 41 * MiB // 2), (20 * MiB, 22 * MiB)])
def test_at_or_above_max_split_size_a_block_is_not_split(max_split, allocated):
    # 20.5 MiB gets a 22 MiB segment; 1.5 MiB (> 1 MiB) would be split off, unless the request is
    # at or above max_split_size.
    run = replay([Alloc("a", 41 * MiB // 2)], AllocatorConfig(BIG.capacity_bytes, max_split_size=max_split))
    assert run.timeline.allocated[-1] == allocated


def test_an_oversize_cached_segment_is_released_before_the_cache():
    # Capacity 60 MiB, max_split_size 20 MiB: a cached 40 MiB block serves no 12 MiB request;
    # the second 12 MiB does not fit (52 + 12 > 60), so the oversize block is freed first.
    config = AllocatorConfig(60 * MiB, max_split_size=20 * MiB)
    run = replay([Alloc("a", 40 * MiB), Free("a"), Alloc("b", 12 * MiB), Alloc("c", 12 * MiB)],
                 config, record_trace=True)
    assert list(run.timeline.reserved) == [40 * MiB, 40 * MiB, 52 * MiB, 24 * MiB]
    assert actions(run)[-3:] == [("segment_free", 40 * MiB), ("segment_alloc", 12 * MiB),
                                 ("alloc", 12 * MiB)]


def test_oversize_cached_segments_are_released_largest_first_until_enough():
    # Capacity 60 MiB, max_split_size 20 MiB: cached oversize blocks of 22 and 24 MiB, neither
    # 30 MiB or more; 30 MiB does not fit (46 + 30 > 60): 24 then 22 MiB are freed (46 >= 30).
    config = AllocatorConfig(60 * MiB, max_split_size=20 * MiB)
    run = replay([Alloc("a", 22 * MiB), Alloc("b", 24 * MiB), Free("a"), Free("b"),
                  Alloc("c", 30 * MiB)], config, record_trace=True)
    assert actions(run)[-4:] == [("segment_free", 24 * MiB), ("segment_free", 22 * MiB),
                                 ("segment_alloc", 30 * MiB), ("alloc", 30 * MiB)]
    assert run.timeline.reserved[-1] == 30 * MiB


def test_roundup_power2_next_division():
    assert roundup_power2_next_division(1200, 4) == 1280  # the C++ comment's example
    assert roundup_power2_next_division(1024, 4) == 1024  # powers of two stay
    assert roundup_power2_next_division(5 * MiB + 1, 4) == 6 * MiB  # steps of 1 MiB in 4..8 MiB
    assert roundup_power2_next_division(1536, 2) == 1536  # already on a step


def test_roundup_power2_divisions_per_interval():
    # [256:1,512:2,>:8]: intervals 0-8 (below 512 MiB) 1 division, interval 9 (512 MiB-1 GiB)
    # 2, from 1 GiB on 8.
    config = parse_alloc_conf("roundup_power2_divisions:[256:1,512:2,>:8]", BIG.capacity_bytes)
    table = config.roundup_power2_divisions
    assert table == (1,) * 9 + (2,) + (8,) * 6
    assert round_size(300 * MiB + 1, table) == 300 * MiB + 512  # 1 division: plain rounding
    assert round_size(600 * MiB, table) == 768 * MiB  # 512 MiB + a 256 MiB step
    assert round_size(3 * GiB // 2 + 1, table) == 3 * GiB // 2 + 128 * MiB  # 128 MiB steps
    assert round_size(1200, (4,) * 16) == 1536  # not above 512 x 4 B: plain rounding


def test_roundup_power2_divisions_in_a_replay():
    # 5 MiB + 1 B with 4 divisions rounds to 6 MiB: a 20 MiB segment split 6 | 14.
    config = parse_alloc_conf("roundup_power2_divisions:4", BIG.capacity_bytes)
    run = replay([Alloc("a", 5 * MiB + 1)], config)
    assert (run.timeline.allocated[-1], run.timeline.requested[-1]) == (6 * MiB, 5 * MiB + 1)


def test_alloc_conf_round_trip_and_refusals():
    config = parse_alloc_conf("expandable_segments:True,max_split_size_mb:512,"
                              "roundup_power2_divisions:[256:1,>:4]", GiB)
    assert config.expandable_segments and config.max_split_size == 512 * MiB
    assert parse_alloc_conf(config.alloc_conf(), GiB) == config
    assert AllocatorConfig(GiB).alloc_conf() == ""
    for text, field in (("max_split_size_mb:10", "max_split_size_mb"),
                        ("garbage_collection_threshold:0.5", "PYTORCH_CUDA_ALLOC_CONF"),
                        ("roundup_power2_divisions:3", "roundup_power2_divisions"),
                        ("expandable_segments:maybe", "expandable_segments")):
        with pytest.raises(UserError) as error:
            parse_alloc_conf(text, GiB)
        assert error.value.field == field
