"""The allocator's state and history as the dict `torch.cuda.memory._snapshot()` returns, and the
pickle `torch.cuda.memory._dump_snapshot` writes of it (docs/allocator.md#snapshots-out-and-in).

Keys and their order follow `_memory_snapshot_pickled` of pytorch/pytorch
`torch/csrc/cuda/memory_snapshot.cpp` at commit 00067369 (the same fields as
`torch.cuda.memory._snapshot`'s docstring): segments with their blocks, one trace per device
(alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map,
segment_unmap, oom), and the allocator settings. A request's model site becomes its stack
frames, innermost first, and its category the entry's "category", the field
`torch.cuda._memory_viz._profile_to_snapshot` writes and the memory viewer colours by.
"""

import pickle
from typing import NamedTuple

from simsp.engine.allocator.caching import CachingAllocator, TraceEntry
from simsp.engine.allocator.segments import SegmentInfo, segment_infos

PICKLE_PROTOCOL = 4  # pickle.dump's default on Python 3.8-3.13, which _dump_snapshot uses
UNKNOWN = "unknown"  # the category the viewer expects for what has none (MemoryViz.js)
ALLOC_ACTIONS = ("alloc", "free_requested", "free_completed")


class Site(NamedTuple):
    """Where a request comes from in the model: the tuple of names from outermost to innermost
    (e.g. ("decoder", "layers.3", "self_attention", "linear_qkv")) and its ledger category."""

    path: tuple[str, ...]
    category: str = ""


class _Frames:
    """Stack frames per context, built once and shared (as PyTorch shares symbolized frames)."""

    def __init__(self):
        self._cache: dict = {}

    def __call__(self, context) -> list[dict]:
        if context not in self._cache:
            self._cache[context] = _frames_of(context)
        return self._cache[context]


def _frames_of(context) -> list[dict]:
    """The frames of one context, innermost first: a Site's path reversed, each name a frame
    whose file names the category; any other context one frame named by its text."""
    if context is None:
        return []
    if isinstance(context, Site):
        filename = f"simsp/{context.category or UNKNOWN}"
        return [{"filename": filename, "line": 0, "name": name} for name in reversed(context.path)]
    return [{"filename": "simsp", "line": 0, "name": str(context)}]


def _category(context) -> str:
    return context.category if isinstance(context, Site) and context.category else UNKNOWN


def _block_dict(block, frames: _Frames) -> dict:
    state = "active_allocated" if block.allocated else "inactive"
    return {"address": block.address, "size": block.size, "requested_size": block.requested,
            "state": state, "frames": frames(block.context)}


def _segment_dict(segment: SegmentInfo, device: int, frames: _Frames) -> dict:
    """One segment, keys in SegmentInfo's order; frames go before the blocks when there are
    none (add_frame_key inserts them at once) and after when symbolized."""
    allocated = segment.allocated_size
    entry = {"device": device, "address": segment.address, "total_size": segment.total_size,
             "allocated_size": allocated, "active_size": allocated,
             "requested_size": segment.requested_size, "stream": segment.stream,
             "segment_type": "small" if segment.small else "large", "segment_pool_id": (0, 0),
             "is_expandable": segment.expandable}
    stack = frames(segment.context)
    if not stack:
        entry["frames"] = stack
    entry["blocks"] = [_block_dict(block, frames) for block in segment.blocks]
    if stack:
        entry["frames"] = stack
    return entry


def _trace_dict(entry: TraceEntry, frames: _Frames, with_categories: bool) -> dict:
    """One trace entry: an oom gives the free device memory instead of an address; frames only
    when there is a context; the category where the trace has categories."""
    result = {"action": entry.action, "device_free" if entry.action == "oom" else "addr": entry.addr,
              "size": entry.size, "stream": entry.stream, "time_us": entry.time_us}
    if entry.context is not None:
        result["frames"] = frames(entry.context)
    if with_categories:
        result["category"] = _category(entry.context) if entry.action in ALLOC_ACTIONS else UNKNOWN
    return result


def _settings(allocator: CachingAllocator) -> dict:
    """allocator_settings as the snapshot records them (max_split_size -1 for unlimited, the
    int64 of SIZE_MAX; roundup_power2_divisions keyed by the interval's first MiB)."""
    config = allocator.config
    return {"PYTORCH_CUDA_ALLOC_CONF": config.alloc_conf(),
            "max_split_size": -1 if config.max_split_size is None else config.max_split_size,
            "garbage_collection_threshold": 0.0,
            "expandable_segments": config.expandable_segments,
            "pinned_num_register_threads": 1,
            "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False,
            "roundup_power2_divisions": {str(1 << i): d for i, d in
                                         enumerate(config.roundup_power2_divisions)}}


def build_snapshot(allocator: CachingAllocator, device: int = 0) -> dict:
    """The snapshot dict of one device's allocator: its segments now and its recorded trace
    (empty when it recorded none), as device `device` of device_traces."""
    frames = _Frames()
    trace = allocator.trace or []
    with_categories = any(isinstance(e.context, Site) and e.context.category for e in trace)
    device_traces: list[list] = [[] for _ in range(device)]
    device_traces.append([_trace_dict(entry, frames, with_categories) for entry in trace])
    return {"segments": [_segment_dict(s, device, frames) for s in segment_infos(allocator)],
            "device_traces": device_traces,
            "allocator_settings": _settings(allocator)}


def write_snapshot(path, snapshot: dict) -> None:
    """Pickle `snapshot` to `path` as _dump_snapshot does (pickle.dump, protocol 4)."""
    with open(path, "wb") as out:
        pickle.dump(snapshot, out, protocol=PICKLE_PROTOCOL)
