"""One memory snapshot's profile: allocated and reserved bytes over its trace, and what was
alive at its allocated peak, by category and layer
(docs/allocator.md#comparing-a-real-snapshot-simsp-memory-diff).

Allocated bytes are the trace's requested bytes (an `alloc` adds its size, a `free_completed`
takes it back: PyTorch's trace gives the request's size, as `torch.cuda._memory_viz` plots it);
reserved bytes follow `segment_alloc`/`segment_map` and `segment_free`/`segment_unmap`. A free of
an address the trace never allocated (recording began after it) is ignored. A snapshot without
a trace is read at its one moment: the active blocks of its segments, their total size reserved.
"""

from typing import NamedTuple

from simsp.errors import UserError
from simsp.engine.allocator.frame_categories import (DIFF_CATEGORIES, category_of, layer_of,
                                                     site_text)

RESERVING = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
MAX_TIMELINE_POINTS = 600  # points kept per curve for the page (the maximum of each bin)


class Allocation(NamedTuple):
    """One allocation alive at the peak: its requested bytes, category, layer and site."""

    nbytes: int
    category: str
    layer: int | None
    site: str


class Profile(NamedTuple):
    """A snapshot read for comparison: peaks, each category's own peak over the trace, what was
    alive at the allocated peak, and the curves (fraction of the trace, allocated, reserved)."""

    allocated_peak: int
    reserved_peak: int
    category_peaks: dict
    at_peak: list  # [Allocation], largest first
    timeline: list  # [(fraction of the trace's events, allocated bytes, reserved bytes)]


def traced_device(snapshot: dict, source: str) -> list:
    """The one device trace with entries ([] when none has any); several traced devices are
    refused (a snapshot of one process records the device it used)."""
    traced = [trace for trace in snapshot["device_traces"] if trace]
    if len(traced) > 1:
        raise UserError(source, f"its trace covers {len(traced)} devices; simsp compares one "
                                f"rank's device (record one device's history)")
    return traced[0] if traced else []


def profile_of(snapshot: dict, source: str) -> Profile:
    """The profile of a snapshot read by snapshot_read.read_snapshot (or built by
    snapshot.build_snapshot)."""
    trace = traced_device(snapshot, source)
    return _from_trace(trace) if trace else _from_segments(snapshot["segments"])


def _allocation(entry: dict) -> Allocation:
    """An alloc entry (or an active block) as an Allocation, its category and layer from its frames."""
    frames = entry.get("frames") or []
    return Allocation(entry["size"], category_of(frames), layer_of(frames), site_text(frames))


def _from_trace(trace: list) -> Profile:
    """Walk the trace: live allocations by address, the allocated and reserved curves, the
    moment of the allocated peak (its first) and each category's own peak; then what was alive
    at that moment."""
    live: dict[int, Allocation] = {}
    by_category = dict.fromkeys(DIFF_CATEGORIES, 0)
    category_peaks = dict.fromkeys(DIFF_CATEGORIES, 0)
    allocated = reserved = allocated_peak = reserved_peak = peak_index = 0
    curve = []  # (allocated, reserved) after each entry
    for index, entry in enumerate(trace):
        change = _apply(live, entry)
        if change is not None:
            allocated += change[1]
            by_category[change[0]] += change[1]
            category_peaks[change[0]] = max(category_peaks[change[0]], by_category[change[0]])
            if allocated > allocated_peak:
                allocated_peak, peak_index = allocated, index
        reserved += RESERVING.get(entry["action"], 0) * entry["size"]
        reserved_peak = max(reserved_peak, reserved)
        curve.append((allocated, reserved))
    return Profile(allocated_peak, reserved_peak, category_peaks,
                   _alive_after(trace, peak_index if allocated_peak else -1), _thin(curve))


def _apply(live: dict, entry: dict) -> tuple[str, int] | None:
    """Apply one trace entry to the live allocations: (category, signed bytes) when it
    allocates or frees a traced allocation, else None."""
    if entry["action"] == "alloc":
        item = live[entry["addr"]] = _allocation(entry)
        return item.category, item.nbytes
    if entry["action"] == "free_completed" and entry["addr"] in live:
        item = live.pop(entry["addr"])
        return item.category, -item.nbytes
    return None


def _alive_after(trace: list, last: int) -> list:
    """The allocations alive right after entry `last` (none for -1), largest first."""
    live: dict[int, Allocation] = {}
    for entry in trace[:last + 1]:
        _apply(live, entry)
    return _largest_first(list(live.values()))


def _from_segments(segments: list) -> Profile:
    """A snapshot without a trace: its one moment, from the segments' active blocks."""
    alive = [_allocation({"size": block.get("requested_size", block["size"]),
                          "frames": block.get("frames")})
             for segment in segments for block in segment["blocks"]
             if block["state"] != "inactive"]
    allocated = sum(item.nbytes for item in alive)
    reserved = sum(segment["total_size"] for segment in segments)
    peaks = dict.fromkeys(DIFF_CATEGORIES, 0)
    for item in alive:
        peaks[item.category] += item.nbytes
    return Profile(allocated, reserved, peaks, _largest_first(alive),
                   [(0.0, allocated, reserved), (1.0, allocated, reserved)])


def _largest_first(alive: list) -> list:
    """Allocations largest first, ties by category, layer and site (a stable order)."""
    return sorted(alive, key=lambda a: (-a.nbytes, a.category, -1 if a.layer is None else a.layer,
                                        a.site))


def _thin(curve: list) -> list:
    """At most MAX_TIMELINE_POINTS points (fraction, allocated, reserved), each the maximum of
    its bin of consecutive entries, so no peak is lost."""
    n = len(curve)
    bins = min(n, MAX_TIMELINE_POINTS)
    points = []
    for b in range(bins):
        chunk = curve[b * n // bins:(b + 1) * n // bins]
        points.append(((b + 1) / bins, max(a for a, _ in chunk), max(r for _, r in chunk)))
    return [(0.0, 0, 0)] + points
