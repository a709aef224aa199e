"""A model of PyTorch's CUDA caching allocator (pytorch/pytorch
`c10/cuda/CUDACachingAllocator.cpp` at commit 001074d2), and memory snapshots in the format of
`torch.cuda.memory._dump_snapshot`, written and read (docs/allocator.md).

sizes.py: rounding, pools and segment sizes; config.py: capacity and PYTORCH_CUDA_ALLOC_CONF;
blocks.py: blocks and the ordered pools; caching.py: the allocator; expandable.py: expandable
segments; segments.py: its segments at one moment; replay.py: an allocation stream through it;
snapshot.py and snapshot_read.py: the snapshot pickle out and in.
"""
