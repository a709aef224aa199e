"""The caching allocator's sizes: its constants, how a request is rounded, what segment it gets.

Source: pytorch/pytorch `c10/cuda/CUDACachingAllocator.cpp` at commit 001074d2 (the constants
kMinBlockSize .. kRoundLarge, `round_size`, `roundup_power2_next_division`,
`get_allocation_size`) and `c10/core/AllocatorConfig.cpp` at commit 0ac71663 (the 16 intervals of
`roundup_power2_divisions`); docs/allocator.md#sizes-rounding-and-pools.
"""

MIN_BLOCK_SIZE = 512  # kMinBlockSize: every block is a multiple of 512 B
SMALL_SIZE = 1 << 20  # kSmallSize: the largest request of the small pool, 1 MiB
SMALL_BUFFER = 2 << 20  # kSmallBuffer: small requests are packed in 2 MiB segments
LARGE_BUFFER = 20 << 20  # kLargeBuffer: requests of 1-10 MiB share 20 MiB segments
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: from 10 MiB a request gets a segment of its own
ROUND_LARGE = 2 << 20  # kRoundLarge: such segments are rounded up to 2 MiB
MB = 1 << 20  # kMB of AllocatorConfig.cpp
ROUNDUP_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: power-of-two intervals from 1 MiB to 64 GiB
NO_DIVISIONS = (0,) * ROUNDUP_INTERVALS  # the default: plain 512-byte rounding everywhere


def division_index(size: int) -> int:
    """Which of the 16 intervals `size` falls in: log2(size) - 20, clamped to [0, 15]
    (AcceleratorAllocatorConfig::roundup_power2_divisions)."""
    log_size = size.bit_length() - 1
    return min(max(log_size - 20, 0), ROUNDUP_INTERVALS - 1)


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """`size` rounded up to the next of `divisions` equal steps between the powers of two around
    it (1200 with 4 divisions: the steps of 1024..2048 are 1024, 1280, 1536, 1792, giving 1280)."""
    if size & (size - 1) == 0:
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    step = power2_floor >> (divisions.bit_length() - 1)
    if step == 0:
        return power2_floor << 1
    floor = size & ~(step - 1)
    return size if floor == size else floor + step


def round_size(size: int, divisions: tuple[int, ...] = NO_DIVISIONS) -> int:
    """The block size a request of `size` bytes gets (round_size): at least 512 B, a multiple of
    512 B, or the next power-of-two division where `roundup_power2_divisions` asks for one."""
    if size < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    parts = divisions[division_index(size)]
    if parts > 1 and size > MIN_BLOCK_SIZE * parts:
        return roundup_power2_next_division(size, parts)
    return MIN_BLOCK_SIZE * -(-size // MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """The segment cudaMalloc is asked for when no cached block fits a rounded `size`
    (get_allocation_size): 2 MiB for the small pool, 20 MiB below 10 MiB, else `size` rounded up
    to 2 MiB."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-size // ROUND_LARGE)
