"""`simsp run --memory-snapshot RANKS`: one memory_snapshot_rank<N>.pickle per chosen rank in the
report folder, read by simsp's restricted reader and by PyTorch's own (`torch.cuda._memory_viz`,
skipped without torch), byte-identical on a second run; bad ranks refused in one line."""

import pytest

from simsp.cli import main
from simsp.engine.allocator.snapshot_read import read_snapshot
from simsp.engine.memory import CATEGORIES
from simsp.units import MiB

RUN = ["run", "scenarios/tiny.toml", "--mode", "meta", "--trace", "none", "--quiet"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Two report folders of the same run, with the snapshots of ranks 0 and 4 (tiny.toml:
    TP 2 × PP 2 × DP 2; rank 4 is stage 1's tp 0, dp 0)."""
    base = tmp_path_factory.mktemp("snap")
    for name in ("a", "b"):
        assert main([*RUN, "--memory-snapshot", "4,0", "--out", str(base / name)]) == 0
    return base / "a", base / "b"


def test_one_file_per_rank_byte_identical_on_a_second_run(folders, capsys):
    first, second = folders
    for rank in (0, 4):
        name = f"memory_snapshot_rank{rank}.pickle"
        assert (first / name).read_bytes() == (second / name).read_bytes()
    assert sorted(p.name for p in first.glob("memory_snapshot_*")) == \
        ["memory_snapshot_rank0.pickle", "memory_snapshot_rank4.pickle"]


def test_restricted_reader_sees_the_sites_and_categories(folders):
    # tiny.toml's tensors are all under 1 MiB: one 2 MiB small-pool segment, still held at the
    # end (nothing empties the cache), and every alloc in the trace is freed or still live there.
    snapshot = read_snapshot(folders[0] / "memory_snapshot_rank0.pickle")
    assert [s["total_size"] for s in snapshot["segments"]] == [2 * MiB]
    assert snapshot["segments"][0]["segment_type"] == "small"
    trace = snapshot["device_traces"][0]
    allocs = [e for e in trace if e["action"] == "alloc"]
    frees = [e for e in trace if e["action"] == "free_completed"]
    live = [b for b in snapshot["segments"][0]["blocks"] if b["state"] == "active_allocated"]
    assert len(allocs) == len(frees) + len(live)
    assert {e["category"] for e in allocs} <= set(CATEGORIES)
    assert {"weights", "activations", "temporaries"} <= {e["category"] for e in allocs}
    names = {frame["name"] for e in allocs for frame in e["frames"]}
    assert {"layer 0", "micro-batch 0"} <= names
    assert all(e["frames"][0]["filename"] == f"simsp/{e['category']}" for e in allocs)
    times = [e["time_us"] for e in trace]
    assert times == sorted(times)


def test_pytorchs_reader_opens_it(folders):
    memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    import pickle
    with open(folders[0] / "memory_snapshot_rank4.pickle", "rb") as source:
        data = pickle.load(source)
    assert "total_reserved: 2.0MiB" in memory_viz.segsum(data)
    assert "Active Memory Timeline" in memory_viz.trace_plot(data)
    assert memory_viz.trace(data).splitlines()[1] == f"{len(data['device_traces'][0])} entries"


@pytest.mark.parametrize("ranks, reason", [("8", "in [0, 8)"), ("0,x", "comma list"),
                                           ("-1", "comma list")])
def test_bad_ranks_are_one_error_line(ranks, reason, capsys, tmp_path):
    assert main([*RUN, "--memory-snapshot", ranks, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --memory-snapshot") and reason in err[0]


def test_json_without_a_folder_is_refused(capsys):
    assert main([*RUN, "--memory-snapshot", "0", "--json"]) == 2
    assert capsys.readouterr().err.startswith("error: --memory-snapshot: needs a report folder")
