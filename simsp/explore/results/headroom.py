"""What "fits" means: a layout fits when its busiest rank's peak leaves a reserve of GPU memory
free for what the simulator does not allocate (docs/exploration.md, "Memory reserve").

The default reserve, per GPU:
- CUDA context and kernel images: about 0.7 GiB as soon as a framework touches the GPU
  (PyTorch forums, discuss.pytorch.org/t/73021: 723 MiB after the first CUDA tensor); 1 GiB.
- NCCL buffers: per channel and peer, Simple 4 MiB + LL128 4.69 MiB + LL 0.5 MiB
  (NVIDIA/nccl src/init.cc DEFAULT_BUFFSIZE, DEFAULT_LL128_BUFFSIZE, DEFAULT_LL_BUFFSIZE with
  src/include/device.h), 9.2 MiB; 32 channels for each of the TP, DP and pipeline
  communicators: 0.9 GiB; 1 GiB.
- The caching allocator's fragmentation (memory reserved by PyTorch but not allocated to a
  tensor): a judgement, 2 GiB (2.5% of 80 GiB); measure yours as
  torch.cuda.max_memory_reserved() − torch.cuda.max_memory_allocated() and pass it.
"""

from simsp.units import GiB

DEFAULT_MEMORY_RESERVE_GIB = 4.0


def add_headroom(row: dict, reserve_bytes: float) -> dict:
    """The row with `memory_reserve_bytes`, `headroom_bytes` (capacity − reserve − peak) and
    `fits` (simulated, not out of memory, headroom ≥ 0); rows that did not simulate are left."""
    if row.get("status") not in ("ok", "oom"):
        return row
    row["memory_reserve_bytes"] = reserve_bytes
    row["headroom_bytes"] = row["capacity_bytes"] - reserve_bytes - row["peak_bytes_max"]
    row["fits"] = row["status"] == "ok" and row["headroom_bytes"] >= 0
    return row


def reserve_bytes(gib: float) -> float:
    """GiB from the command line as bytes."""
    return gib * GiB
