"""The allocator's segments and their blocks at one moment, as `DeviceCachingAllocator::snapshot`
lists them (pytorch/pytorch `c10/cuda/CUDACachingAllocator.cpp` at 001074d2): one segment per
cudaMalloc, and for an expandable segment one per contiguous mapped range; sorted by address.
"""

from typing import NamedTuple


class BlockInfo(NamedTuple):
    """One block of a segment (BlockInfo): its bytes, the bytes last requested of it, whether
    allocated now, and the model site of that request."""

    address: int
    size: int
    requested: int
    allocated: bool
    context: object


class SegmentInfo(NamedTuple):
    """One segment (SegmentInfo): where it starts, its bytes, stream and pool, whether it is part
    of an expandable segment, the model site that caused it, and its blocks in address order."""

    address: int
    total_size: int
    stream: int
    small: bool
    expandable: bool
    context: object
    blocks: tuple[BlockInfo, ...]

    @property
    def allocated_size(self) -> int:
        """Bytes of the allocated blocks."""
        return sum(b.size for b in self.blocks if b.allocated)

    @property
    def requested_size(self) -> int:
        """Bytes requested of the allocated blocks."""
        return sum(b.requested for b in self.blocks if b.allocated)


def segment_infos(allocator) -> list[SegmentInfo]:
    """Every segment of `allocator` (a CachingAllocator) now, lowest address first."""
    result = []
    for head in allocator.all_blocks():
        if head.prev is not None and head.prev.mapped:
            continue  # not the first mapped block of its range
        blocks, block = [], head
        while block is not None and block.mapped:
            blocks.append(BlockInfo(block.ptr, block.size, block.requested, block.allocated,
                                    block.context))
            block = block.next
        result.append(SegmentInfo(head.ptr, sum(b.size for b in blocks), head.stream, head.small,
                                  head.segment is not None, head.segment_context, tuple(blocks)))
    result.sort(key=lambda segment: segment.address)
    return result
