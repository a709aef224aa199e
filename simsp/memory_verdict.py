"""What "fits" means, the one definition `run`, `search`, `sweep` and `whatif` share
(docs/exploration.md#memory-reserve): a layout fits when it is not out of memory and its busiest
rank's ledger peak leaves a reserve of GPU memory free for what the ledger does not hold.

    headroom = capacity − reserve − peak        fits = (no allocation failed) and headroom ≥ 0

The default reserve, per GPU:
- CUDA context and kernel images: about 0.7 GiB as soon as a framework touches the GPU
  (PyTorch forums, discuss.pytorch.org/t/73021: 723 MiB after the first CUDA tensor); 1 GiB.
- NCCL buffers: per channel and peer, Simple 4 MiB + LL128 4.69 MiB + LL 0.5 MiB
  (NVIDIA/nccl src/init.cc DEFAULT_BUFFSIZE, DEFAULT_LL128_BUFFSIZE, DEFAULT_LL_BUFFSIZE with
  src/include/device.h), 9.2 MiB; 32 channels for each of the TP, DP and pipeline
  communicators: 0.9 GiB; 1 GiB.
- The caching allocator's fragmentation (memory reserved by PyTorch but not allocated to a
  tensor): a judgement, 2 GiB (2.5% of 80 GiB); `simsp run` reports the modelled one per stage
  (docs/allocator.md), and yours is torch.cuda.max_memory_reserved() −
  torch.cuda.max_memory_allocated().
"""

from typing import NamedTuple

from simsp.units import GiB

DEFAULT_MEMORY_RESERVE_GIB = 4.0


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


def reserve_bytes(gib: float) -> float:
    """GiB from the command line as bytes."""
    return gib * GiB
