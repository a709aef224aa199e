"""`simsp memory diff` (docs/allocator.md#comparing-a-real-snapshot-simsp-memory-diff): simsp's
own export against itself differs by nothing; a snapshot written here by hand from an
allocation list, with Megatron-LM / Transformer Engine frames, its gradients left out and a
256 MiB workspace added, differs by exactly those bytes; hostile files are one `error:` line and
nothing in them runs."""

import pickle
from pathlib import Path

import pytest

from simsp.engine.allocator.frame_categories import category_of
from simsp.engine.allocator.snapshot import write_snapshot
from simsp.engine.allocator.snapshot_diff import memory_diff
from simsp.engine.allocator.snapshot_profile import profile_of
from simsp.engine.allocator.snapshot_read import read_snapshot
from simsp.report.run.memory_snapshot import rank_snapshot
from simsp.scenario.loading import load_scenario
from simsp.training.driver.iteration import simulate_iteration
from tests.inprocess import cli

MiB = 1 << 20
TINY = str(Path(__file__).resolve().parent.parent / "scenarios" / "tiny.toml")

# Megatron-LM / Transformer Engine / PyTorch frames, innermost first, as a Python-stack snapshot
# records them (paths as installed; the files are upstream's)
MEGATRON_FRAMES = {
    "weights": [{"filename": "/usr/lib/python3/site-packages/torch/nn/init.py", "line": 90,
                 "name": "_no_grad_normal_"},
                {"filename": "/workspace/megatron/core/tensor_parallel/layers.py", "line": 180,
                 "name": "_initialize_affine_weight_gpu"}],
    "optimizer": [{"filename": "/usr/lib/python3/site-packages/torch/optim/adam.py", "line": 160,
                   "name": "_init_group"}],
    "gradients": [{"filename": "/workspace/megatron/core/distributed/param_and_grad_buffer.py",
                   "line": 700, "name": "__init__"}],
    "activations": [{"filename": "/usr/lib/python3/site-packages/transformer_engine/pytorch/"
                                 "module/linear.py", "line": 300, "name": "forward"}],
    "temporaries": [{"filename": "/usr/lib/python3/site-packages/transformer_engine/pytorch/"
                                 "module/linear.py", "line": 500, "name": "backward"}],
    "workspaces": [{"filename": "/usr/lib/python3/site-packages/transformer_engine/pytorch/"
                                "module/base.py", "line": 80, "name": "get_workspace"}],
}

# the known allocation list: (category, layer, bytes, allocated at, freed at or None)
ALLOCATIONS = [("weights", 0, 4 * MiB, 0, None), ("weights", 1, 4 * MiB, 0, None),
               ("gradients", 0, 4 * MiB, 0, None), ("gradients", 1, 4 * MiB, 0, None),
               ("optimizer", None, 12 * MiB, 0, None), ("optimizer", None, 12 * MiB, 0, None),
               ("activations", 0, 8 * MiB, 1, 5), ("activations", 1, 8 * MiB, 2, 4),
               ("temporaries", 1, 2 * MiB, 3, 3.5)]
# by hand: the peak is right after the 2 MiB temporary at t = 3:
# 8 weights + 8 gradients + 24 optimizer + 16 activations + 2 temporaries = 58 MiB
SIMSP_PEAK = 58 * MiB


def simsp_frames(category: str, layer) -> list[dict]:
    """Frames as simsp's export writes them: innermost first, the category as file name."""
    names = ["tensor"] + ([f"layer {layer}"] if layer is not None else [])
    return [{"filename": f"simsp/{category}", "line": 0, "name": name} for name in names]


def hand_snapshot(allocations, frames_of) -> dict:
    """A snapshot in the format's plain dicts: one 1 GiB segment, the allocations at
    consecutive addresses, the trace's alloc and free entries in time order."""
    base, events = 1 << 40, []
    for i, (category, layer, nbytes, start, end) in enumerate(allocations):
        address = base + sum(a[2] for a in allocations[:i])
        frames = frames_of(category, layer)
        events.append((start, 0, {"action": "alloc", "addr": address, "size": nbytes,
                                  "stream": 0, "frames": frames}))
        if end is not None:
            for order, action in ((1, "free_requested"), (2, "free_completed")):
                events.append((end, order, {"action": action, "addr": address, "size": nbytes,
                                            "stream": 0, "frames": frames}))
    trace = [{"action": "segment_alloc", "addr": base, "size": 1 << 30, "stream": 0,
              "time_us": 0, "frames": []}]
    for time, _, entry in sorted(events, key=lambda e: (e[0], e[1])):
        trace.append({**entry, "time_us": int(time * 1e6)})
    segment = {"device": 0, "address": base, "total_size": 1 << 30, "stream": 0,
               "blocks": [{"address": base, "size": 1 << 30, "state": "inactive", "frames": []}]}
    return {"segments": [segment], "device_traces": [trace]}


def megatron_frames(category, layer):
    """Frames of a real stack for the category."""
    return MEGATRON_FRAMES[category]  # a real stack names no layer


def read_back(tmp_path, snapshot, name) -> dict:
    """Pickled as _dump_snapshot does, then read with the restricted reader."""
    path = tmp_path / name
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    return read_snapshot(path)


def rows(diff, part) -> dict:
    """A part of the diff by row name."""
    return {row["name"]: row for row in diff[part]}


@pytest.mark.parametrize("category", sorted(MEGATRON_FRAMES))
def test_megatron_frames_map_to_their_category(category):
    assert category_of(MEGATRON_FRAMES[category]) == category


def test_unrecognised_frames_are_unknown():
    assert category_of([{"filename": "/home/me/train.py", "line": 3, "name": "main"}]) == "unknown"
    assert category_of([]) == "unknown"


def test_planted_differences_are_found_and_sized_exactly(tmp_path):
    """The real side: the same list less its gradients, plus a 256 MiB workspace from t = 0."""
    real_list = [a for a in ALLOCATIONS if a[0] != "gradients"] + \
        [("workspaces", None, 256 * MiB, 0, None)]
    real = read_back(tmp_path, hand_snapshot(real_list, megatron_frames), "real.pickle")
    own = read_back(tmp_path, hand_snapshot(ALLOCATIONS, simsp_frames), "own.pickle")
    diff = memory_diff(profile_of(real, "real"), profile_of(own, "simsp"))
    peaks = rows(diff, "peaks")
    assert peaks["allocated"]["simsp_bytes"] == SIMSP_PEAK
    assert peaks["allocated"]["difference_bytes"] == 256 * MiB - 8 * MiB
    assert peaks["reserved"]["difference_bytes"] == 0  # one 1 GiB segment each
    categories = rows(diff, "categories")
    expected = {"weights": 0, "gradients": -8 * MiB, "optimizer": 0, "activations": 0,
                "temporaries": 0, "workspaces": 256 * MiB}
    assert {name: row["difference_bytes"] for name, row in categories.items()} == expected
    assert {name: row["own_peak"]["difference_bytes"] for name, row in categories.items()} \
        == expected
    # no frame of the real stack names a layer: its layered bytes all fall under "no layer"
    layers = rows(diff, "layers")
    assert layers["layer 0"]["difference_bytes"] == -(4 + 4 + 8) * MiB
    assert layers["layer 1"]["difference_bytes"] == -(4 + 4 + 8 + 2) * MiB
    # 306 MiB of the real peak (256 workspace + 8 weights + 24 optimizer + 16 activations +
    # 2 temporaries) against simsp's 24 MiB of optimizer state, which names no layer
    assert layers["no layer"]["difference_bytes"] == (256 + 8 + 16 + 2) * MiB
    assert [(a["bytes"], a["category"]) for a in diff["unexplained"]] == \
        [(256 * MiB, "workspaces")]
    assert "get_workspace" in diff["unexplained"][0]["site"]
    assert (diff["missing_count"], diff["missing_bytes"]) == (2, 8 * MiB)


def test_a_snapshot_without_trace_is_read_at_its_moment(tmp_path):
    """Only segments (no history recorded): the active blocks are what is alive."""
    segment = {"device": 0, "address": 0, "total_size": 20 * MiB, "stream": 0, "blocks": [
        {"address": 0, "size": 6 * MiB, "requested_size": 6 * MiB, "state": "active_allocated",
         "frames": MEGATRON_FRAMES["optimizer"]},
        {"address": 6 * MiB, "size": 14 * MiB, "state": "inactive", "frames": []}]}
    snapshot = read_back(tmp_path, {"segments": [segment], "device_traces": []}, "s.pickle")
    profile = profile_of(snapshot, "s")
    assert (profile.allocated_peak, profile.reserved_peak) == (6 * MiB, 20 * MiB)
    assert profile.category_peaks["optimizer"] == 6 * MiB


@pytest.fixture(scope="module")
def own_export(tmp_path_factory):
    """simsp's export of tiny.toml's rank 0, as `run --memory-snapshot 0` writes it."""
    path = tmp_path_factory.mktemp("export") / "memory_snapshot_rank0.pickle"
    write_snapshot(path, rank_snapshot(simulate_iteration(load_scenario(TINY), trace="none"), 0))
    return path


def difference_cells(out: str) -> list[str]:
    """Every difference cell of the printed tables (columns named 'difference')."""
    cells, header = [], None
    for line in out.splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            header = None if not line.startswith("|") else header
            continue
        parts = [p.strip() for p in line.strip("|").split("|")]
        if header is None:
            header = parts
            continue
        cells += [value for name, value in zip(header, parts) if name == "difference"]
    return cells


def test_simsps_own_export_against_itself_differs_by_nothing(own_export, tmp_path):
    rc, out, err = cli(["memory", "diff", str(own_export), TINY, "--rank", "0",
                        "--out", str(tmp_path / "d")])
    assert rc == 0 and err == ""
    for category in ("weights", "gradients", "optimizer", "activations", "temporaries",
                     "communication"):
        assert f"| {category} |" in out
    cells = difference_cells(out)
    assert len(cells) == 2 + 6 * 2 + 3 and set(cells) == {"0 B"}  # peaks, categories, layers
    assert "size at simsp's: 0 allocations (0 B). simsp's with none in the snapshot: " \
        "0 allocations (0 B)." in out
    page = (tmp_path / "d" / "memory_diff.html").read_bytes()
    assert b"<svg" in page and b"http" not in page.replace(b"http://www.w3.org/2000/svg", b"")
    rc, _, _ = cli(["memory", "diff", str(own_export), TINY, "--rank", "0",
                    "--out", str(tmp_path / "again")])
    assert rc == 0 and (tmp_path / "again" / "memory_diff.html").read_bytes() == page


def test_a_workspace_planted_in_the_export_is_found_exactly(own_export, tmp_path):
    snapshot = read_snapshot(own_export)
    trace = snapshot["device_traces"][0]
    address = 1 << 46  # far from simsp's segments
    workspace = {"action": "alloc", "addr": address, "size": 256 * MiB, "stream": 0,
                 "time_us": 0, "frames": MEGATRON_FRAMES["workspaces"]}
    grown = {"action": "segment_alloc", "addr": address, "size": 256 * MiB, "stream": 0,
             "time_us": 0, "frames": []}
    snapshot["device_traces"][0] = [grown, workspace, *trace]
    path = tmp_path / "planted.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    rc, out, err = cli(["memory", "diff", str(path), TINY, "--rank", "0",
                        "--out", str(tmp_path / "d")])
    assert rc == 0 and err == ""
    assert "+256.00 MiB |" in out.split("| allocated |")[1].split("\n")[0]
    assert "+256.00 MiB |" in out.split("| reserved |")[1].split("\n")[0]
    workspaces = out.split("| workspaces |")[1].split("\n")[0]
    assert workspaces.count("+256.00 MiB") == 2  # at the peak and its own peak
    assert set(difference_cells(out)) == {"0 B", "+256.00 MiB"}
    assert "size at simsp's: 1 allocation (256.00 MiB)." in out
    assert "get\\_workspace" in out or "get_workspace" in out


class CreatesAFile:
    """Unpickled by a plain pickle.load, this opens (creates) `target` for writing."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return open, (self.target, "w")


def one_error(argv) -> str:
    """Run the command: exit 2, nothing on stdout, one `error:` line on stderr; that line."""
    rc, out, err = cli(argv)
    assert rc == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_hostile_snapshots_are_refused_in_one_line(own_export, tmp_path):
    target = tmp_path / "pwned"
    hostile = tmp_path / "reduce.pickle"
    hostile.write_bytes(pickle.dumps({"segments": [], "device_traces": [[CreatesAFile(target)]]}))
    assert "refused" in one_error(["memory", "diff", str(hostile), TINY, "--rank", "0",
                                   "--out", str(tmp_path / "a")])
    assert not target.exists() and not (tmp_path / "a").exists()  # refused before anything
    huge = tmp_path / "huge.pickle"
    with open(huge, "wb") as sparse:  # a sparse file: its size, not its bytes, is refused
        sparse.truncate((4 << 30) + 1)
    assert "over the 4294967296-byte limit" in one_error(["memory", "diff", str(huge), TINY,
                                                          "--rank", "0"])
    whole = own_export.read_bytes()
    cut = tmp_path / "truncated.pickle"
    cut.write_bytes(whole[:len(whole) // 2])
    assert "truncated" in one_error(["memory", "diff", str(cut), TINY, "--rank", "0"])
    wrong = tmp_path / "number.pickle"
    wrong.write_bytes(pickle.dumps(42))
    assert "expected a dict with 'segments', got a int" in one_error(
        ["memory", "diff", str(wrong), TINY, "--rank", "0"])


def test_a_rank_outside_the_layout_is_refused(own_export, tmp_path):
    err = one_error(["memory", "diff", str(own_export), TINY, "--rank", "8",
                     "--out", str(tmp_path / "d")])
    assert err.startswith("error: --rank: 8 is not a rank")
