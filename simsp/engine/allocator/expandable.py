"""Expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): segments that grow by
mapping pages.

Follows Note [Expandable Segments] and `ExpandableSegment`, `find_expandable_block`,
`map_block`, `try_allocate_expandable_block`, `unmap_block` and `release_expandable_segment` of
pytorch/pytorch `c10/cuda/CUDACachingAllocator.cpp` at 001074d2 (docs/allocator.md#expandable-segments):
a segment reserves address space for 1 1/8 of the device's memory, of which only whole pages
(2 MiB in the small pool, 20 MiB in the large one) are backed by memory and count as reserved. A
request that no cached block fits maps pages at the lowest address where free and unmapped space
together can hold it, so the segment grows at its end and freed blocks merge into it;
`empty_cache` unmaps every page that no block uses any more.
"""

from simsp.errors import SimulationError
from simsp.engine.allocator.blocks import Block, Pool
from simsp.engine.allocator.sizes import LARGE_BUFFER, SMALL_BUFFER


class ExpandableSegment:
    """The address range of one expandable segment and its page size."""

    __slots__ = ("base", "page", "size")

    def __init__(self, base: int, page: int, pages: int):
        self.base = base
        self.page = page
        self.size = page * pages  # the address space reserved (cuMemAddressReserve)

    def pages_covering(self, ptr: int, size: int) -> tuple[int, int]:
        """First and end page of the pages that [ptr, ptr+size) touches (map's segmentLeft and
        segmentRight)."""
        return (ptr - self.base) // self.page, -(-(ptr + size - self.base) // self.page)

    def pages_inside(self, ptr: int, size: int) -> tuple[int, int]:
        """First and end page of the pages lying wholly inside [ptr, ptr+size) (unmap)."""
        return -(-(ptr - self.base) // self.page), (ptr + size - self.base) // self.page


def expandable_size(block: Block) -> int:
    """What a free block could grow to: itself plus the unmapped range right after it."""
    after = block.next
    return block.size + (after.size if after is not None and not after.mapped else 0)


def best_fit(block: Block, larger) -> Block:
    """get_free_block's rule for expandable blocks: move on to a larger cached block while it
    could grow less than the current one (so a block at a segment's growing end is kept for
    requests nothing else fits). `larger` yields the blocks after `block` in size order."""
    for candidate in larger:
        if block.segment is None or expandable_size(candidate) >= expandable_size(block):
            break
        block = candidate
    return block


def _allocatable(block: Block | None) -> bool:
    return block is not None and not block.allocated


def _has_room(block: Block, size: int) -> bool:
    """Whether free and unmapped blocks from `block` on add up to `size` bytes."""
    room = 0
    while room < size and _allocatable(block):
        room += block.size
        block = block.next
    return room >= size


def find_block(allocator, pool: Pool, stream: int, size: int) -> Block:
    """The lowest-addressed free-or-unmapped run of the stream with room for `size` bytes
    (find_expandable_block), or the whole of a new segment's address space."""
    for candidate in pool.unmapped.by_address(stream):
        if _allocatable(candidate.prev):
            candidate = candidate.prev
        if _has_room(candidate, size):
            return candidate
    page = SMALL_BUFFER if pool.small else LARGE_BUFFER
    total = allocator.config.total_bytes
    pages = -(-(total + total // 8) // page)
    segment = ExpandableSegment(allocator.take_address(page * pages), page, pages)
    allocator.segments += 1
    candidate = Block(segment.base, segment.size, stream, pool.small, segment, mapped=False)
    pool.unmapped.add(candidate)
    return candidate


def map_block(allocator, pool: Pool, block: Block, size: int, context) -> bool:
    """Back the first `size` bytes of an unmapped block with whole pages (map_block); False when
    that would take reserved memory past the capacity (cuMemCreate fails: nothing is mapped)."""
    segment = block.segment
    first, end = segment.pages_covering(block.ptr, size)
    if segment.base + first * segment.page != block.ptr:
        raise SimulationError(f"allocator: unmapped block {block.ptr:#x} not on a page boundary")
    mapped = (end - first) * segment.page
    if allocator.reserved + mapped > allocator.config.capacity_bytes:
        return False
    start = block.ptr
    pool.unmapped.remove(block)
    block.mapped = True
    if mapped < block.size:
        rest = Block(block.ptr + mapped, block.size - mapped, block.stream, block.small, segment,
                     mapped=False)
        rest.splice(block, block.next)
        pool.unmapped.add(rest)
        block.size = mapped
    allocator.try_merge(block, block.prev, pool)
    allocator.try_merge(block, block.next, pool)
    pool.free.add(block)
    allocator.reserved += mapped
    allocator.record("segment_map", start, mapped, block.stream, context)
    if block.prev is None and block.segment_context is None:
        block.segment_context = context
    return True


def try_allocate(allocator, pool: Pool, stream: int, size: int, context) -> Block | None:
    """A free block of at least `size` bytes made by mapping pages (try_allocate_expandable_block),
    taken out of the pool, or None when the pages cannot be mapped."""
    candidate = find_block(allocator, pool, stream, size)
    if not candidate.mapped and not map_block(allocator, pool, candidate,
                                              min(candidate.size, size), context):
        return None
    while candidate.size < size:
        grown = candidate.next
        if not map_block(allocator, pool, grown, min(size - candidate.size, grown.size), context):
            return None
        candidate = grown  # it absorbed the free block before it
    pool.free.remove(candidate)
    return candidate


def unmap_block(allocator, pool: Pool, block: Block, context) -> None:
    """Unmap the whole pages inside a free block (unmap_block): the pages leave reserved memory
    and the block's partial pages at either end stay cached as free blocks."""
    segment = block.segment
    first, end = segment.pages_inside(block.ptr, block.size)
    if first >= end:
        return
    pool.free.remove(block)
    start, length = segment.base + first * segment.page, (end - first) * segment.page
    if start > block.ptr:
        before = Block(block.ptr, start - block.ptr, block.stream, block.small, segment)
        before.splice(block.prev, block)
        pool.free.add(before)
    after_size = block.ptr + block.size - (start + length)
    if after_size > 0:
        after = Block(start + length, after_size, block.stream, block.small, segment)
        after.splice(block, block.next)
        pool.free.add(after)
    block.ptr, block.size, block.mapped = start, length, False
    allocator.try_merge(block, block.prev, pool)
    allocator.try_merge(block, block.next, pool)
    pool.unmapped.add(block)
    allocator.reserved -= length
    allocator.record("segment_unmap", start, length, block.stream,
                     context if context is not None else block.segment_context)


def release_segment(allocator, pool: Pool, block: Block) -> None:
    """Give back the address space of a segment with nothing mapped (release_expandable_segment)."""
    if block.size != block.segment.size or block.mapped:
        raise SimulationError(f"allocator: expandable segment at {block.ptr:#x} still in use")
    pool.unmapped.remove(block)
    allocator.segments -= 1
