"""Memory snapshots out and in: the dict of `torch.cuda.memory._snapshot()` built from a replay
worked by hand (segments, blocks, trace actions, frames, categories, settings), written as
`_dump_snapshot` writes it and read back unchanged, byte for byte the same each time."""

import pickle

from simsp.engine.allocator.config import AllocatorConfig
from simsp.engine.allocator.replay import Alloc, Free, replay
from simsp.engine.allocator.snapshot import Site, build_snapshot, write_snapshot
from simsp.engine.allocator.snapshot_read import read_snapshot

MiB, GiB = 1 << 20, 1 << 30
QKV = Site(("decoder", "layers.0", "self_attention", "linear_qkv"), "activations")
FC1 = Site(("decoder", "layers.0", "mlp", "linear_fc1"), "activations")
GRAD = Site(("decoder", "layers.0", "mlp", "linear_fc1.weight.grad"), "gradients")
EVENTS = [Alloc("a1", 6 * MiB, time_s=0.001, context=QKV), Alloc("a2", 6 * MiB, time_s=0.002, context=FC1),
          Alloc("a3", 6 * MiB, time_s=0.003, context=GRAD), Free("a2", time_s=0.004),
          Alloc("b", 7 * MiB, time_s=0.005, context=FC1), Alloc("s", 100, time_s=0.006)]


def snapshot_of(events=EVENTS, config=AllocatorConfig(80 * GiB)):
    return build_snapshot(replay(events, config, record_trace=True).allocator)


def test_segments_and_blocks_as_the_allocator_holds_them():
    # 6 | 6 free | 6 | 2 free, then 7 | 13 free, then a small 2 MiB segment with 100 B -> 512.
    segments = snapshot_of()["segments"]
    assert [(s["total_size"], s["segment_type"], s["is_expandable"]) for s in segments] == [
        (20 * MiB, "large", False), (20 * MiB, "large", False), (2 * MiB, "small", False)]
    first = segments[0]
    assert [(b["address"] - first["address"], b["size"], b["state"]) for b in first["blocks"]] == [
        (0, 6 * MiB, "active_allocated"), (6 * MiB, 6 * MiB, "inactive"),
        (12 * MiB, 6 * MiB, "active_allocated"), (18 * MiB, 2 * MiB, "inactive")]
    assert (first["allocated_size"], first["active_size"], first["requested_size"]) == (12 * MiB,) * 3
    small = segments[2]
    assert (small["allocated_size"], small["requested_size"]) == (512, 100)
    assert list(first["blocks"][0]) == ["address", "size", "requested_size", "state", "frames"]


def test_a_segment_keeps_its_frames_only_while_unsplit():
    # The cudaMalloc's site stays with the block that was split off the end (alloc_found_block
    # makes a new Block for the front), so a split segment shows no frames, at once and before
    # its blocks; a whole segment shows them after its blocks, as symbolized frames are added.
    whole = snapshot_of([Alloc("w", 12 * MiB, context=GRAD)])["segments"][0]
    split = snapshot_of()["segments"][0]
    keys = ["device", "address", "total_size", "allocated_size", "active_size", "requested_size",
            "stream", "segment_type", "segment_pool_id", "is_expandable"]
    assert list(whole) == keys + ["blocks", "frames"]
    assert [f["name"] for f in whole["frames"]] == ["linear_fc1.weight.grad", "mlp", "layers.0", "decoder"]
    assert list(split) == keys + ["frames", "blocks"] and split["frames"] == []


def test_frames_name_the_model_site_innermost_first():
    block = snapshot_of()["segments"][0]["blocks"][0]
    assert [(f["filename"], f["name"]) for f in block["frames"]] == [
        ("simsp/activations", "linear_qkv"), ("simsp/activations", "self_attention"),
        ("simsp/activations", "layers.0"), ("simsp/activations", "decoder")]
    assert snapshot_of()["segments"][0]["blocks"][1]["frames"] == []  # free: no site


def test_the_trace_lists_every_action_with_its_category():
    trace = snapshot_of()["device_traces"][0]
    assert [(e["action"], e["size"], e["category"]) for e in trace] == [
        ("segment_alloc", 20 * MiB, "unknown"), ("alloc", 6 * MiB, "activations"),
        ("alloc", 6 * MiB, "activations"), ("alloc", 6 * MiB, "gradients"),
        ("free_requested", 6 * MiB, "activations"), ("free_completed", 6 * MiB, "activations"),
        ("segment_alloc", 20 * MiB, "unknown"), ("alloc", 7 * MiB, "activations"),
        ("segment_alloc", 2 * MiB, "unknown"), ("alloc", 100, "unknown")]
    assert [e["time_us"] for e in trace] == [1000, 1000, 2000, 3000, 4000, 4000, 5000, 5000, 6000, 6000]
    assert "frames" not in trace[-1]  # no context, no frames (as PyTorch records it)
    assert list(trace[1]) == ["action", "addr", "size", "stream", "time_us", "frames", "category"]


def test_without_categories_no_entry_has_one():
    trace = snapshot_of([Alloc("a", MiB), Free("a")])["device_traces"][0]
    assert all("category" not in e for e in trace)


def test_an_out_of_memory_entry_gives_the_free_device_memory():
    # Capacity 30 MiB: 6 MiB takes a 20 MiB segment, split 6 | 14; 16 MiB finds only 14 MiB free,
    # a new 16 MiB segment would make 36 > 30 and nothing unsplit can be released: an oom
    # entry with 30 - 20 = 10 MiB free on the device.
    trace = snapshot_of([Alloc("a", 6 * MiB), Alloc("b", 16 * MiB)],
                        AllocatorConfig(30 * MiB))["device_traces"][0]
    assert trace[-1] == {"action": "oom", "device_free": 10 * MiB, "size": 16 * MiB, "stream": 0,
                         "time_us": 0}


def test_expandable_segments_trace_maps_and_settings():
    snapshot = snapshot_of(EVENTS, AllocatorConfig(80 * GiB, expandable_segments=True))
    assert [e["action"] for e in snapshot["device_traces"][0] if e["action"].startswith("segment")] == [
        "segment_map", "segment_map", "segment_map"]  # two 20 MiB pages, one 2 MiB small page
    assert [s["is_expandable"] for s in snapshot["segments"]] == [True, True]
    settings = snapshot["allocator_settings"]
    assert settings["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert settings["expandable_segments"] is True and settings["max_split_size"] == -1
    assert list(settings["roundup_power2_divisions"])[:3] == ["1", "2", "4"]


def test_a_device_index_places_the_trace_and_the_segments():
    allocator = replay(EVENTS, AllocatorConfig(80 * GiB), record_trace=True).allocator
    snapshot = build_snapshot(allocator, device=2)
    assert [len(t) for t in snapshot["device_traces"]] == [0, 0, 10]
    assert {s["device"] for s in snapshot["segments"]} == {2}


def test_round_trip_and_identical_bytes(tmp_path):
    snapshot = snapshot_of()
    first, second = tmp_path / "a.pickle", tmp_path / "b.pickle"
    write_snapshot(first, snapshot)
    write_snapshot(second, snapshot_of())
    assert first.read_bytes() == second.read_bytes()
    assert read_snapshot(first) == snapshot
    assert pickle.loads(first.read_bytes()) == snapshot  # plain pickle reads it too
    assert first.read_bytes()[:2] == b"\x80\x04"  # protocol 4, pickle.dump's default


def test_the_old_segments_only_format_is_read(tmp_path):
    path = tmp_path / "old.pickle"
    path.write_bytes(pickle.dumps(snapshot_of()["segments"]))
    assert read_snapshot(path) == {"segments": snapshot_of()["segments"], "device_traces": []}
