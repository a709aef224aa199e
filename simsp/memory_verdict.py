"""What "fits" means, the one definition `run`, `search`, `sweep` and `whatif` share
(docs/exploration.md#memory-reserve): a layout fits when it is not out of memory and its busiest
rank's ledger peak leaves a reserve of GPU memory free for what the ledger does not hold.

    headroom = capacity − reserve − peak        fits = (no allocation failed) and headroom ≥ 0

The reserve is the layout's non-tensor memory, itemised and sourced by
simsp/training/non_tensor_memory.py (docs/non_tensor_memory.md): the CUDA context and kernel
images, the cuBLAS/cuBLASLt workspaces, NCCL's buffers per communicator and the caching
allocator's fragmentation (a judged 2 GiB allowance; the modelled one in `run
--caching-allocator`). `--memory-reserve GiB` replaces it with one figure for every layout.
"""

from typing import NamedTuple

from simsp.units import GiB

DEFAULT_MEMORY_RESERVE_GIB = None  # None: each layout's itemised non-tensor memory


class MemoryVerdict(NamedTuple):
    """A layout's memory verdict: the reserve it was judged with, its headroom (negative: bytes
    over) and whether it fits."""

    reserve_bytes: float
    headroom_bytes: float
    fits: bool


def memory_verdict(capacity_bytes: float, peak_bytes: float, out_of_memory: bool,
                   reserve_bytes: float) -> MemoryVerdict:
    """The verdict for the busiest rank's `peak_bytes` on a GPU of `capacity_bytes`."""
    headroom = capacity_bytes - reserve_bytes - peak_bytes
    return MemoryVerdict(reserve_bytes, headroom, not out_of_memory and headroom >= 0)


def reserve_bytes(gib: float | None) -> float | None:
    """`--memory-reserve` GiB as bytes; None (not given) stays None: the itemised reserve."""
    return None if gib is None else gib * GiB


def chosen_reserve(override_bytes: float | None, itemised_bytes: float) -> float:
    """The reserve a layout is judged with: the user's override, else its itemised one."""
    return itemised_bytes if override_bytes is None else override_bytes
