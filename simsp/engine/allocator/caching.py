"""PyTorch's CUDA caching allocator for one device, modelled step for step.

Follows `DeviceCachingAllocator` of pytorch/pytorch `c10/cuda/CUDACachingAllocator.cpp` at
commit 001074d2 (docs/allocator.md): `malloc` rounds the request, picks the pool and searches it
for the best-fitting cached block of the stream (`get_free_block`); failing that it asks for a new
segment (`alloc_block`), then frees oversize cached blocks and retries
(`release_available_cached_blocks`), then frees every unsplit cached segment and retries
(`release_cached_blocks`), and only then reports out of memory. A found block is split when
`should_split` says so; `free` merges a block with its free neighbours (`free_block`,
`try_merge_blocks`). Expandable segments are in expandable.py. Not modelled: cross-stream uses
(`record_stream` and its events), CUDA-graph private pools, the garbage-collection threshold and
the free-memory callbacks.
"""

from typing import NamedTuple

from simsp.errors import SimulationError
from simsp.engine.allocator import expandable
from simsp.engine.allocator.blocks import Block, Pool
from simsp.engine.allocator.config import AllocatorConfig
from simsp.engine.allocator.sizes import (LARGE_BUFFER, MIN_BLOCK_SIZE, ROUND_LARGE, SMALL_SIZE,
                                          allocation_size, round_size)

ADDRESS_BASE = 0x7F0000000000  # where simsp's segments start: any fixed, aligned address does
ADDRESS_ALIGN = ROUND_LARGE  # segments are placed on 2 MiB boundaries, one after another


class TraceEntry(NamedTuple):
    """One allocator action, as TraceEntry records it: `addr` is the free device memory for an
    "oom" (device_free), `size` the requested bytes for alloc/free actions and the segment's
    bytes for segment actions."""

    action: str  # alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map, segment_unmap, oom
    addr: int
    size: int
    stream: int
    time_us: int
    context: object


class AllocatorOutOfMemory(Exception):
    """A request the allocator could not serve even after releasing its cache (malloc's
    OutOfMemoryError): the bytes asked, the rounded size, and reserved/allocated at that moment."""

    def __init__(self, requested: int, size: int, reserved: int, allocated: int, capacity: int):
        super().__init__(f"out of memory: tried to allocate {requested} B ({size} B rounded) with "
                         f"{reserved} B reserved, {allocated} B allocated, capacity {capacity} B")
        self.requested, self.size = requested, size
        self.reserved, self.allocated, self.capacity = reserved, allocated, capacity


class CachingAllocator:
    """One device's allocator: reserved (segments' bytes, mapped bytes for expandable ones),
    allocated (allocated blocks' bytes, as torch.cuda.memory_allocated) and requested (the bytes
    asked for by live requests) at every moment; `trace` records every action when not None."""

    def __init__(self, config: AllocatorConfig, record_trace: bool = False):
        self.config = config
        self.small = Pool(small=True)
        self.large = Pool(small=False)
        self.active: dict[int, Block] = {}  # ptr -> allocated block
        self.reserved = 0
        self.allocated = 0
        self.requested = 0
        self.segments = 0  # cudaMalloc'd segments and expandable segments alive
        self.now_us = 0  # the time stamped on trace entries
        self.trace: list[TraceEntry] | None = [] if record_trace else None
        self._next_address = ADDRESS_BASE

    # -- public --------------------------------------------------------------------------------

    def malloc(self, nbytes: int, stream: int = 0, context=None) -> Block:
        """Serve a request of `nbytes` (> 0) on `stream`; raise AllocatorOutOfMemory if even a
        released cache leaves no room under the capacity."""
        size = round_size(nbytes, self.config.roundup_power2_divisions)
        pool = self.small if size <= SMALL_SIZE else self.large
        block = self._get_free_block(pool, stream, size)
        if block is None:
            alloc_size = allocation_size(size)
            block = (self._alloc_block(pool, stream, size, alloc_size, context)
                     or (self._release_available_cached_blocks(pool, stream, size, context)
                         and self._alloc_block(pool, stream, size, alloc_size, context))
                     or (self._release_cached_blocks(context)
                         and self._alloc_block(pool, stream, size, alloc_size, context)))
        if not block:
            self.record("oom", self.config.capacity_bytes - self.reserved, size, stream, context)
            raise AllocatorOutOfMemory(nbytes, size, self.reserved, self.allocated,
                                       self.config.capacity_bytes)
        return self._alloc_found_block(block, pool, size, nbytes, context)

    def free(self, block: Block) -> None:
        """Return an allocated block to its pool's cache, merged with its free neighbours."""
        block.allocated = False
        del self.active[block.ptr]
        self.allocated -= block.size
        self.requested -= block.requested
        self.record("free_requested", block.ptr, block.requested, block.stream, block.context)
        self._free_block(block)

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache(): release every unsplit cached segment (and every free page of
        the expandable segments)."""
        self._release_cached_blocks(None)

    def record(self, action: str, addr: int, size: int, stream: int, context) -> None:
        """Append a trace entry when the allocator records its history."""
        if self.trace is not None:
            self.trace.append(TraceEntry(action, addr, size, stream, self.now_us, context))

    def take_address(self, size: int) -> int:
        """A fresh device address range of `size` bytes (what cudaMalloc or cuMemAddressReserve
        returns): simsp places segments one after another and never reuses an address."""
        ptr = self._next_address
        self._next_address += -(-size // ADDRESS_ALIGN) * ADDRESS_ALIGN
        return ptr

    def pool_of(self, block: Block) -> Pool:
        """The pool a block belongs to."""
        return self.small if block.small else self.large

    def all_blocks(self) -> list[Block]:
        """Every mapped block: cached free ones and allocated ones (get_all_blocks)."""
        return [*self.small.free.blocks(), *self.large.free.blocks(), *self.active.values()]

    # -- finding a block -----------------------------------------------------------------------

    def _get_free_block(self, pool: Pool, stream: int, size: int) -> Block | None:
        """The best-fitting cached block of the stream (get_free_block), taken out of the pool,
        or None: the smallest block of at least `size` bytes, subject to max_split_size."""
        block = pool.free.first_at_least(stream, size)
        if block is None:
            return None
        if block.segment is not None:
            candidates = pool.free.at_least(stream, size)
            block = expandable.best_fit(next(candidates), candidates)
        limit = self.config.split_limit
        if size < limit <= block.size:  # do not return an oversize block for a smaller request
            return None
        if size >= limit and block.size >= size + LARGE_BUFFER:  # oversize: round up at most 20 MiB
            return None
        pool.free.remove(block)
        return block

    def _alloc_block(self, pool: Pool, stream: int, size: int, alloc_size: int, context) -> Block | None:
        """A new segment holding the request (alloc_block): cudaMalloc of `alloc_size`, which
        fails beyond the capacity, or the growth of an expandable segment by whole pages."""
        if self.config.expandable_segments:
            return expandable.try_allocate(self, pool, stream, size, context)
        if self.reserved + alloc_size > self.config.capacity_bytes:
            return None
        block = Block(self.take_address(alloc_size), alloc_size, stream, pool.small)
        block.segment_context = context
        self.reserved += alloc_size
        self.segments += 1
        self.record("segment_alloc", block.ptr, alloc_size, stream, context)
        return block

    def _alloc_found_block(self, block: Block, pool: Pool, size: int, nbytes: int, context) -> Block:
        """Hand out `block`, first splitting off what the request does not need when
        `should_split` says so (the front piece is the new block; the rest stays cached)."""
        if self._should_split(block, size):
            remaining = block
            block = Block(remaining.ptr, size, remaining.stream, remaining.small, remaining.segment)
            block.splice(remaining.prev, remaining)
            remaining.ptr += size
            remaining.size -= size
            pool.free.add(remaining)
        block.allocated = True
        block.requested = nbytes
        block.context = context
        self.active[block.ptr] = block
        self.allocated += block.size
        self.requested += nbytes
        self.record("alloc", block.ptr, nbytes, block.stream, context)
        return block

    def _should_split(self, block: Block, size: int) -> bool:
        """should_split: in the small pool (or with expandable segments) whenever 512 B or more
        remain; in the large pool only below max_split_size and when more than 1 MiB remains."""
        remaining = block.size - size
        if block.small or self.config.expandable_segments:
            return remaining >= MIN_BLOCK_SIZE
        return size < self.config.split_limit and remaining > SMALL_SIZE

    # -- freeing -------------------------------------------------------------------------------

    def _free_block(self, block: Block) -> None:
        """Cache a freed block, merged with a free previous and next neighbour (free_block)."""
        self.record("free_completed", block.ptr, block.requested, block.stream, block.context)
        block.context = None
        pool = self.pool_of(block)
        self.try_merge(block, block.prev, pool)
        self.try_merge(block, block.next, pool)
        pool.free.add(block)

    def try_merge(self, dst: Block, src: Block | None, pool: Pool) -> int:
        """Absorb neighbour `src` into `dst` when it is free and mapped alike (try_merge_blocks);
        the bytes absorbed, 0 if none. `dst` must not be in the pool's sets while it changes."""
        if src is None or src.allocated or dst.mapped != src.mapped:
            return 0
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
            dst.segment_context = src.segment_context
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        (pool.free if src.mapped else pool.unmapped).remove(src)
        return src.size

    # -- releasing segments --------------------------------------------------------------------

    def _release_available_cached_blocks(self, pool: Pool, stream: int, size: int, context) -> bool:
        """With a max_split_size: free one cached oversize segment big enough for the request, or
        else oversize segments from the largest down until as many bytes are freed. Blocks of
        expandable segments cannot be freed so and are passed over, as later revisions of
        release_available_cached_blocks do (at 001074d2 release_block would assert)."""
        if self.config.max_split_size is None:
            return False
        limit = self.config.max_split_size
        key = max(size, limit)
        found = pool.free.first_at_least(stream, key)
        if found is not None and found.segment is None:
            self._release_block(found, context)
            return True
        released = 0
        for block in pool.free.below(stream, key):
            if released >= key or block.size < limit:
                break
            if block.segment is None:
                released += block.size
                self._release_block(block, context)
        return released >= key

    def _release_cached_blocks(self, context) -> bool:
        """Free every unsplit cached segment, large pool first (release_cached_blocks)."""
        self._release_blocks(self.large, context)
        self._release_blocks(self.small, context)
        return True

    def _release_blocks(self, pool: Pool, context) -> None:
        """Free the pool's unsplit cached segments; unmap the free pages of its expandable ones,
        releasing a segment left with nothing mapped."""
        to_unmap = []
        for block in pool.free.in_order():
            if block.segment is not None:
                to_unmap.append(block)
            elif not block.is_split():
                self._release_block(block, context)
        for block in to_unmap:
            expandable.unmap_block(self, pool, block, context)
            if not block.is_split():
                expandable.release_segment(self, pool, block)

    def _release_block(self, block: Block, context) -> None:
        """cudaFree a whole cached segment (release_block)."""
        if block.is_split() or block.segment is not None:
            raise SimulationError(f"allocator: cannot cudaFree part of a segment at {block.ptr:#x}")
        self.record("segment_free", block.ptr, block.size, block.stream,
                    context if context is not None else block.segment_context)
        self.reserved -= block.size
        self.segments -= 1
        self.pool_of(block).free.remove(block)
