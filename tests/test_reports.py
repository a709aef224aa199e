"""Report writers: the Chrome trace opens as Perfetto expects, summary.md carries the key figures,
metrics.json round-trips, and every file is byte-identical for the same scenario."""

import json
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from simsp.scenario.loading import load_scenario
from simsp.engine.memory import CATEGORIES, MemEvent
from simsp.metrics.collect import collect
from simsp.report.run import summary_text, write_reports
from simsp.report.run.figures.memory import write_memory_plot
from simsp.report.run.memory_timeline import MAX_MEMORY_POINTS, memory_timeline
from simsp.report.run.trace import plan as trace_plan
from simsp.report.run.trace.writer import write_chrome_trace
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
from simsp.units import format_seconds

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "scenarios", "tiny.toml")
P22B = os.path.join(REPO, "scenarios", "paper-22b.toml")
THREADS = ["compute", "TP communication", "pipeline transfers", "DP communication", "schedule"]

# The tiny model in meta mode with the interleaved schedule: representative ranks, templates.
META_TINY = {("run", "mode"): "meta", ("parallel", "num_layers_per_virtual_pipeline_stage"): 1}
# The 22B layout with 16 sequences in one micro-batch: the activations do not fit in 80 GiB.
OOM_22B = {("parallel", "micro_batch_size"): 16, ("parallel", "global_batch_size"): 16}


def simulate(path, overrides=None):
    sc = load_scenario(path, overrides)
    shortcuts = Shortcuts.for_scale(sc)
    run = simulate_iteration(sc, shortcuts)
    return run, collect(run, shortcuts)


@pytest.fixture(scope="module", params=["numeric", "meta"])
def case(request):
    return simulate(TINY, None if request.param == "numeric" else META_TINY)


@pytest.fixture(scope="module")
def oom_case():
    return simulate(P22B, OOM_22B)


def thread_names(events) -> dict:
    """{(pid, tid): thread name without its lane suffix} from the metadata events."""
    return {(e["pid"], e["tid"]): e["args"]["name"].split(" #")[0]
            for e in events if e["name"] == "thread_name"}


def load_trace(run, tmp_path):
    path = write_chrome_trace(run, tmp_path / "trace.json")
    return json.loads(path.read_text())


# ---------------------------------------------------------------- Chrome trace


def trace_events(run, detail: str = "full") -> list[dict]:
    """The trace's events as dicts (the writer never builds them)."""
    with tempfile.TemporaryDirectory() as folder:
        path = write_chrome_trace(run, Path(folder) / "trace.json", detail)
        return json.loads(path.read_text())["traceEvents"]


def test_trace_has_a_process_per_simulated_rank_and_five_ordered_threads(case, tmp_path):
    run, _ = case
    doc = load_trace(run, tmp_path)
    assert doc["displayTimeUnit"] == "ms"
    events = doc["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(processes) == sorted(run.inputs.world.ranks)
    for rank, name in processes.items():
        c = run.inputs.world.grid.coords(rank)
        assert name == f"rank {rank} (tp {c.tp}, pp {c.pp}, dp {c.dp})"
    threads = defaultdict(dict)
    for e in events:
        if e["name"] == "thread_name":
            threads[e["pid"]][e["tid"]] = e["args"]["name"]
    for rank in run.inputs.world.ranks:
        names = [threads[rank][tid] for tid in sorted(threads[rank])]
        assert [n for n in names if "#" not in n] == THREADS  # extra lanes are "name #2"


def test_trace_spans_are_complete_events_that_nest_per_thread(case, tmp_path):
    run, _ = case
    events = load_trace(run, tmp_path)["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert len(xs) == len(run.inputs.world.trace.spans)  # small runs keep every span
    by_thread = defaultdict(list)
    for e in xs:
        assert e["dur"] >= 0 and e["ts"] >= 0
        by_thread[e["pid"], e["tid"]].append(e)
    for spans in by_thread.values():  # sorted by start, and no partial overlaps
        for a, b in zip(spans, spans[1:]):
            assert b["ts"] >= a["ts"] + a["dur"] - 1e-6
    names = thread_names(events)
    for track, name in zip(["compute", "tp_comm", "pp_comm", "dp_comm", "schedule"], THREADS):
        on_thread = [e for e in xs if names[e["pid"], e["tid"]] == name]
        assert len(on_thread) == sum(1 for s in run.inputs.world.trace.spans if s.track == track)


def test_memory_counter_peaks_at_the_ledger_peak(case, tmp_path):
    run, _ = case
    events = load_trace(run, tmp_path)["traceEvents"]
    for rank, r in run.inputs.world.ranks.items():
        per_category = [e for e in events if e["ph"] == "C" and e["pid"] == rank
                        and e["name"] == "memory"]
        assert per_category and len(per_category) <= MAX_MEMORY_POINTS
        assert all(set(e["args"]) == set(CATEGORIES) for e in per_category)
        stamps = [e["ts"] for e in per_category]
        assert stamps == sorted(stamps)
        peak = r.ledger.summary().peak_total
        assert max(sum(e["args"].values()) for e in per_category) == peak  # bytes, exactly
        totals = [e["args"]["bytes"] for e in events if e["ph"] == "C" and e["pid"] == rank
                  and e["name"] == "memory total"]
        assert max(totals) == peak


def test_trace_is_byte_identical_for_the_same_scenario(tmp_path):
    first, _ = simulate(TINY)
    second, _ = simulate(TINY)
    a = write_chrome_trace(first, tmp_path / "a.json").read_bytes()
    b = write_chrome_trace(second, tmp_path / "b.json").read_bytes()
    assert a == b
    assert a.startswith(b'{"displayTimeUnit":"ms","traceEvents":[{')  # compact separators


def test_detail_tracks_merge_per_schedule_step_over_budget(case, monkeypatch):
    run, _ = case
    monkeypatch.setattr(trace_plan, "SPAN_BUDGET", 1)
    monkeypatch.setattr(trace_plan, "MIN_DETAIL_SPANS", 10)
    events = trace_events(run)
    names = thread_names(events)
    xs = [e for e in events if e["ph"] == "X"]
    spans = run.inputs.world.trace.spans
    assert len(xs) < len(spans)
    kept = [e for e in xs if names[e["pid"], e["tid"]] in THREADS[2:]]  # left whole
    assert len(kept) == sum(1 for s in spans if s.track in ("pp_comm", "dp_comm", "schedule"))
    compute = [e for e in xs if names[e["pid"], e["tid"]] == "compute"]
    assert any(e["name"].startswith("compute F") for e in compute)
    # Merged spans say how many they hold: nothing is lost, only grouped.
    assert sum(e.get("args", {}).get("spans", 1) for e in compute) == sum(
        s.args.get("spans", 1) for s in spans if s.track == "compute")


def test_every_event_has_a_category_naming_its_track(case):
    run, _ = case
    events = trace_events(run)
    names = thread_names(events)
    track_of = dict(zip(THREADS, ["compute", "tp_comm", "pp_comm", "dp_comm", "schedule"]))
    for e in events:
        expected = {"M": "__metadata", "C": "memory", "s": "p2p", "f": "p2p"}.get(e["ph"])
        if e["ph"] == "X":
            expected = track_of[names[e["pid"], e["tid"]]]
        assert e["cat"] == expected


def test_a_flow_arrow_links_each_pipeline_send_to_its_receive(case):
    """Every pipeline transfer between simulated ranks starts one arrow inside a p2p call slice
    of its sender and ends inside one of its receiver, within the transfer's time."""
    run, _ = case
    events = trace_events(run)
    names = thread_names(events)
    ranks = set(run.inputs.world.ranks)
    transfers = [t for t in run.inputs.world.trace.transfers
                 if t.label.startswith("p2p") and {t.src, t.dst} <= ranks]
    assert transfers  # p = 2: activations and gradients cross stages
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == len(ends) == len(transfers) and set(starts) == set(ends)
    xs = [e for e in events if e["ph"] == "X"]
    for t, flow_id in zip(transfers, sorted(starts)):
        start, end = starts[flow_id], ends[flow_id]
        assert (start["pid"], end["pid"], end["bp"]) == (t.src, t.dst, "e")
        assert t.start_s * 1e6 < start["ts"] < end["ts"] < t.end_s * 1e6
        for point in (start, end):
            assert names[point["pid"], point["tid"]] == "pipeline transfers"
            assert _enclosing(xs, point)["cat"] == "pp_comm"


def _enclosing(xs, point):
    """The one X slice on the point's thread that strictly contains its timestamp."""
    hits = [e for e in xs if (e["pid"], e["tid"]) == (point["pid"], point["tid"])
            and e["ts"] < point["ts"] < e["ts"] + e["dur"]]
    assert len(hits) == 1
    return hits[0]


def test_steps_detail_leaves_out_compute_and_tp_threads(case, tmp_path):
    run, _ = case
    doc = json.loads(write_chrome_trace(run, tmp_path / "t.json", detail="steps").read_text())
    assert doc["otherData"]["detail"] == "steps"
    names = set(thread_names(doc["traceEvents"]).values())
    assert names == set(THREADS[2:])
    full = trace_events(run, "full")
    assert len(doc["traceEvents"]) == len(full) - sum(
        1 for e in full if e.get("cat") in ("compute", "tp_comm")) - 4 * len(run.inputs.world.ranks)


# ---------------------------------------------------------------- memory timeline

def replay(events):
    """Naive reference: (times, per-category bytes after each event), time-ordered, stable."""
    current = dict.fromkeys(CATEGORIES, 0)
    times, rows = [], []
    for e in sorted(events, key=lambda e: e.time_s):
        current[e.category] += e.delta_bytes
        times.append(e.time_s)
        rows.append([current[c] for c in CATEGORIES])
    return np.array(times), np.array(rows)


def random_events(n, seed=0):
    """A ledger-like log: allocations then frees of random sizes, recorded out of time order."""
    rng = np.random.default_rng(seed)
    events, live = [], []
    for i in range(n):
        t = float(rng.integers(0, n // 3))  # repeated stamps: ties keep recording order
        if live and rng.random() < 0.45:
            key, cat, size = live.pop(int(rng.integers(len(live))))
            events.append(MemEvent(t, key, cat, -size, "free"))
        else:
            cat = CATEGORIES[int(rng.integers(len(CATEGORIES)))]
            size = int(rng.integers(1, 1 << 20))
            live.append((f"k{i}", cat, size))
            events.append(MemEvent(t, f"k{i}", cat, size, "op"))
    return events


@pytest.mark.parametrize("n,points", [(50, 2000), (20000, 2000), (20000, 101)])
def test_memory_timeline_keeps_the_exact_peak_within_the_point_budget(n, points):
    events = random_events(n)
    times, state = memory_timeline(events, points)
    ref_times, ref_state = replay(events)
    assert len(times) <= points
    assert state.sum(axis=1).max() == ref_state.sum(axis=1).max()
    assert state.sum(axis=1).min() == ref_state.sum(axis=1).min()
    assert np.array_equal(state[-1], ref_state[-1]) and times[0] == ref_times[0]
    assert np.all(np.diff(times) >= 0)
    rows = {tuple(r) for r in ref_state.tolist()}  # every kept point is a real state
    assert all(tuple(r) in rows for r in state.tolist())


def test_memory_timeline_of_an_empty_ledger():
    times, state = memory_timeline([])
    assert times.shape == (0,) and state.shape == (0, len(CATEGORIES))


# ---------------------------------------------------------------- summary.md

def test_summary_has_the_key_figures_and_a_row_per_stage(case):
    run, metrics = case
    text = summary_text(metrics)
    assert format_seconds(metrics["iteration_time_s"]) in text
    assert f"{metrics['mfu'] * 100:.1f}%" in text and f"{metrics['hfu'] * 100:.1f}%" in text
    assert "MFU (counted FLOPs)" in text and "bubble fraction" in text
    table = text.split("## Memory per pipeline stage")[1].split("##")[0]
    for pp in range(run.inputs.sc.parallel.pp):
        assert f"| {pp} | {run.inputs.rank_of(0, 0, pp)} |" in table
    assert "| fits |" in table and "Out of memory" not in text
    assert "## First-stage activation memory" in text and "## Shortcuts" in text


def test_summary_reports_the_out_of_memory_verdict(oom_case):
    _, metrics = oom_case
    assert metrics["oom"]
    assert metrics["ranks"][0]["oom"] is True
    oom = metrics["ranks"][0]["oom_detail"]
    text = summary_text(metrics)
    assert "**OOM**" in text and "### Out of memory on stage 0 (rank 0)" in text
    assert f"op `{oom['op']}`" in text and "80.00 GiB capacity" in text
    assert f"`{oom['largest_live'][0]['name']}`" in text


def test_summary_units(oom_case):
    _, metrics = oom_case
    text = summary_text(metrics)
    assert "peak total (GiB)" in text
    assert f"| {metrics['ranks'][0]['peak_bytes'] / 2**30:.2f} |" in text


# ---------------------------------------------------------------- write_reports

def test_write_reports_is_deterministic(case, tmp_path):
    run, metrics = case
    first = write_reports(run, metrics, tmp_path / "a")
    second = write_reports(run, metrics, tmp_path / "b")
    names = [p.name for p in first]
    assert names[:3] == ["summary.md", "metrics.json", "trace.json"]
    assert names == [p.name for p in second]
    for a, b in zip(first, second):
        assert a.read_bytes() == b.read_bytes(), a.name
    summary = (tmp_path / "a" / "summary.md").read_text()
    assert summary.startswith(summary_text(metrics).rstrip("\n"))  # then figures and glossary
    text = (tmp_path / "a" / "metrics.json").read_text()
    assert text.endswith("}\n") and json.loads(text) == json.loads(json.dumps(metrics))


def test_memory_plot_is_a_png_or_skipped(oom_case, tmp_path, monkeypatch):
    run, metrics = oom_case
    path = write_memory_plot(run, tmp_path / "memory.png")
    if path is not None:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    assert write_memory_plot(run, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()
    written = write_reports(run, metrics, tmp_path / "out")
    assert [p.name for p in written] == ["summary.md", "metrics.json", "trace.json",
                                         "report.html"]  # the page, without pictures
