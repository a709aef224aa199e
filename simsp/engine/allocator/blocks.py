"""Blocks and pools of the caching allocator, and the ordered sets it searches.

A Block is a piece of a segment, linked to its neighbours (prev/next) like the C++ `Block`; a
Pool holds one pool's cached free blocks ordered by (stream, size, address), the order of
BlockComparatorSize that makes the first block at or above a size the best fit, and its unmapped
expandable-segment ranges ordered by (stream, address), BlockComparatorAddress
(pytorch/pytorch `c10/cuda/CUDACachingAllocator.cpp` at 001074d2; docs/allocator.md).
The sets are sorted lists searched with bisect, one per stream.
"""

from bisect import bisect_left, insort


class Block:
    """A contiguous range of a segment: allocated to a request, cached free, or (in an expandable
    segment) not backed by memory (`mapped` false)."""

    __slots__ = ("ptr", "size", "requested", "stream", "small", "allocated", "mapped", "prev",
                 "next", "segment", "context", "segment_context")

    def __init__(self, ptr: int, size: int, stream: int, small: bool, segment=None,
                 mapped: bool = True):
        self.ptr = ptr
        self.size = size
        self.requested = 0  # requested_size: the bytes asked for when last handed out
        self.stream = stream
        self.small = small  # which pool owns it
        self.allocated = False
        self.mapped = mapped
        self.prev: Block | None = None
        self.next: Block | None = None
        self.segment = segment  # its ExpandableSegment, or None for a cudaMalloc segment
        self.context = None  # context_when_allocated: the model site of the live request
        self.segment_context = None  # context_when_segment_allocated (a segment's first block)

    def is_split(self) -> bool:
        """Whether the block shares its segment with a neighbour."""
        return self.prev is not None or self.next is not None

    def splice(self, before: "Block | None", after: "Block | None") -> None:
        """Link the block between `before` and `after` (Block::splice)."""
        if before is not None:
            before.next = self
        self.prev = before
        if after is not None:
            after.prev = self
        self.next = after


class SizeIndex:
    """Cached free blocks by stream, each stream's sorted by (size, address)."""

    def __init__(self):
        self._keys: dict[int, list[tuple[int, int]]] = {}  # stream -> sorted [(size, ptr)]
        self._blocks: dict[int, Block] = {}  # ptr -> block

    def __len__(self) -> int:
        return len(self._blocks)

    def add(self, block: Block) -> None:
        """Cache a free block (insert_into_blocks)."""
        insort(self._keys.setdefault(block.stream, []), (block.size, block.ptr))
        self._blocks[block.ptr] = block

    def remove(self, block: Block) -> None:
        """Take a block out of the cache; its size and address must be those it was added with."""
        keys = self._keys[block.stream]
        del keys[bisect_left(keys, (block.size, block.ptr))]
        del self._blocks[block.ptr]

    def first_at_least(self, stream: int, size: int) -> Block | None:
        """The stream's smallest block of `size` bytes or more, the lowest-addressed among equals
        (lower_bound), or None."""
        keys = self._keys.get(stream)
        if not keys:
            return None
        index = bisect_left(keys, (size, 0))
        return self._blocks[keys[index][1]] if index < len(keys) else None

    def at_least(self, stream: int, size: int):
        """The stream's blocks of `size` bytes or more in that order (lower_bound then forward);
        consume before changing the set."""
        keys = self._keys.get(stream, ())
        blocks = self._blocks
        for index in range(bisect_left(keys, (size, 0)), len(keys)):
            yield blocks[keys[index][1]]

    def below(self, stream: int, size: int) -> list[Block]:
        """The stream's blocks smaller than `size`, largest first."""
        keys = self._keys.get(stream, ())
        return [self._blocks[ptr] for _, ptr in reversed(keys[:bisect_left(keys, (size, 0))])]

    def in_order(self) -> list[Block]:
        """Every block, by (stream, size, address): the iteration order of BlockPool::blocks."""
        return [self._blocks[ptr] for stream in sorted(self._keys) for _, ptr in self._keys[stream]]

    def blocks(self):
        """Every block, in no particular order."""
        return self._blocks.values()


class AddressIndex:
    """Unmapped ranges of expandable segments by stream, each stream's sorted by address."""

    def __init__(self):
        self._ptrs: dict[int, list[int]] = {}  # stream -> sorted addresses
        self._blocks: dict[int, Block] = {}

    def add(self, block: Block) -> None:
        """Record an unmapped range."""
        insort(self._ptrs.setdefault(block.stream, []), block.ptr)
        self._blocks[block.ptr] = block

    def remove(self, block: Block) -> None:
        """Forget an unmapped range (now mapped, merged or released)."""
        ptrs = self._ptrs[block.stream]
        del ptrs[bisect_left(ptrs, block.ptr)]
        del self._blocks[block.ptr]

    def by_address(self, stream: int) -> list[Block]:
        """The stream's unmapped ranges, lowest address first."""
        return [self._blocks[ptr] for ptr in self._ptrs.get(stream, ())]


class Pool:
    """One BlockPool: the small (<= 1 MiB) or the large pool of a device."""

    __slots__ = ("small", "free", "unmapped")

    def __init__(self, small: bool):
        self.small = small
        self.free = SizeIndex()
        self.unmapped = AddressIndex()
