"""report.html and the out-of-memory explanation: the page carries the summary, every figure
embedded and the glossary; the OOM verdict gives bytes by category at the failing moment and
switches each verified by its own simulated iteration."""

import os
import re

import pytest
from browser import chromium, page_verdict, screenshot

from simsp.scenario.loading import load_scenario
from simsp.engine.memory import Ledger
from simsp.metrics.collect import collect
from simsp.explore.whatif.oom_advice import bytes_at_failure, candidate_switches, explain_oom
from simsp.report.html import to_html
from simsp.report.run import write_reports
from simsp.report.run.figures.schedule import stage_intervals, stage_spans
from simsp.report.run.glossary import GLOSSARY, glossary
from simsp.report.run.shown_categories import report_categories
from simsp.report.run.summary_md import summary_text
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
from simsp.units import GiB

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
P22B = os.path.join(REPO, "scenarios", "paper-22b.toml")
P175B = os.path.join(REPO, "scenarios", "paper-175b.toml")
OOM_22B = {("parallel", "micro_batch_size"): 16, ("parallel", "global_batch_size"): 16}
NO_SP_NO_RECOMPUTE = {("parallel", "sequence_parallel"): False,
                      ("parallel", "recompute_granularity"): "none"}


def gantt_intervals(run, rank: int) -> dict[str, list[tuple[float, float]]]:
    """{kind: [(start_s, duration_s)]} of one stage's Gantt bars."""
    intervals = stage_intervals(run, rank, stage_spans(run, [rank])[rank])
    return {kind: [(start, end - start) for start, end in spans.tolist()]
            for kind, spans in intervals.items()}


def simulate(path, overrides):
    sc = load_scenario(path, overrides)
    run = simulate_iteration(sc, Shortcuts.for_scale(sc))
    metrics = collect(run, Shortcuts.for_scale(sc))
    metrics["oom_explanation"] = explain_oom(run)
    return run, metrics


@pytest.fixture(scope="module")
def oom_22b():
    return simulate(P22B, OOM_22B)


# ---------------------------------------------------------------- bytes at the failure

def test_bytes_at_failure_of_a_hand_worked_ledger():
    ledger = Ledger(rank=0, capacity_bytes=100)
    ledger.alloc("w", 30, "weights", "init", time_s=0.0)
    ledger.alloc("a1", 40, "activations", "f", time_s=2.0)
    ledger.alloc("t", 20, "temporaries", "f", time_s=1.0)  # recorded late, happens at t = 1
    ledger.free("t", time_s=3.0)
    ledger.alloc("a2", 25, "activations", "f", time_s=4.0)  # 95 in use
    ledger.alloc("c", 10, "communication", "f", time_s=5.0)  # 105 > 100: the failure
    in_use = bytes_at_failure(ledger)
    assert in_use == {"activations": 65, "weights": 30, "communication": 0, "gradients": 0,
                      "held_for_wgrad": 0, "optimizer": 0, "temporaries": 0}
    assert list(in_use)[:2] == ["activations", "weights"]  # largest first
    assert ledger.summary().oom.bytes_in_use == sum(in_use.values())


def test_bytes_at_failure_is_none_when_it_fits():
    ledger = Ledger(rank=0, capacity_bytes=100)
    ledger.alloc("w", 100, "weights", "init", time_s=0.0)
    assert bytes_at_failure(ledger) is None


def test_failure_categories_add_up_to_the_ledgers_bytes_in_use(oom_22b):
    run, metrics = oom_22b
    stages = metrics["oom_explanation"]["stages"]
    assert [s["stage"] for s in stages] == [0]
    rank0 = metrics["ranks"][0]["oom_detail"]
    assert sum(stages[0]["in_use_by_category_bytes"].values()) == rank0["bytes_in_use"]


# ---------------------------------------------------------------- switches

def test_candidate_switches_follow_the_layout():
    sc = load_scenario(P175B, NO_SP_NO_RECOMPUTE)
    flags = [flags for _, flags, _ in candidate_switches(sc)]
    assert flags == ["--sequence-parallel", "--recompute-granularity selective",
                     "--sequence-parallel --recompute-granularity selective",
                     "--recompute-granularity full",
                     "--pipeline-model-parallel-size 16 "
                     "--num-layers-per-virtual-pipeline-stage 3 --nodes 16"]
    dp = load_scenario(P22B, {("parallel", "data_parallel_size"): 2,
                              ("cluster", "nodes"): 2, **OOM_22B,
                              ("parallel", "global_batch_size"): 32})
    flags = [flags for _, flags, _ in candidate_switches(dp)]
    assert flags == ["--recompute-granularity full", "--use-distributed-optimizer",
                     "--micro-batch-size 8", "--pipeline-model-parallel-size 2 "
                     "--data-parallel-size 1",
                     "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params",
                     "--use-torch-fsdp2"]  # d = 2 to shard over; selective recompute: no offload


def test_each_switch_peak_is_that_of_the_modified_scenario(oom_22b):
    """The verdict of 'micro-batch 8' is the peak of the scenario loaded with that flag."""
    _, metrics = oom_22b
    switch = next(s for s in metrics["oom_explanation"]["switches"]
                  if s["flags"] == "--micro-batch-size 8")
    sc = load_scenario(P22B, {**OOM_22B, ("parallel", "micro_batch_size"): 8})
    run = simulate_iteration(sc, Shortcuts.for_scale(sc))
    assert switch["peak_bytes"] == run.inputs.world.ranks[0].ledger.peak_total
    assert switch["fits"] == (switch["peak_bytes"] <= 80 * GiB)


@pytest.fixture(scope="module")
def oom_175b():
    """The issue's case: 175B without SP and without recompute (~30 s of CPU, used twice)."""
    return simulate(P175B, NO_SP_NO_RECOMPUTE)


def test_175b_without_sp_names_activations_and_switches_that_fit(oom_175b):
    _, metrics = oom_175b
    explanation = metrics["oom_explanation"]
    for stage in explanation["stages"]:
        assert next(iter(stage["in_use_by_category_bytes"])) == "activations"
    fits = {s["switch"] for s in explanation["switches"] if s["fits"]}
    assert "sequence parallelism + selective recompute (K22)" in fits
    assert "full recompute" in fits
    for s in explanation["switches"]:
        assert s["fits"] == (s["peak_bytes"] <= s["capacity_bytes"] == 80 * GiB)
    text = summary_text(metrics)
    assert "Cause: **activations** are the largest part on every failing stage" in text
    assert "### Switches that would bring it under capacity" in text
    assert "Switches that fit, each verified by its own simulated iteration: " in text
    assert "| full recompute | `--recompute-granularity full` |" in text


# ---------------------------------------------------------------- the page

def test_markdown_subset_to_html():
    text = "# T\n\nA `x` and **y**.\n\n| a | b |\n| --- | ---: |\n| 1 | 2 |\n"
    assert to_html(text) == ("<h1 id=\"t\">T</h1>\n<p>A <code>x</code> and <strong>y</strong>.</p>\n"
                             "<table><thead><tr><th>a</th><th class=\"num\">b</th></tr></thead>"
                             "<tbody><tr><td>1</td><td class=\"num\">2</td></tr></tbody></table>")


def test_report_page_is_self_contained_with_every_figure(oom_22b, tmp_path):
    run, metrics = oom_22b
    metrics = {**metrics, "command": "simsp run scenarios/paper-22b.toml --micro-batch-size 16"}
    written = {p.name for p in write_reports(run, metrics, tmp_path)}
    pngs = sorted(n for n in written if n.endswith(".png") and n != "memory.png")
    assert pngs == ["exposed.png", "memory_at_peak.png", "memory_stages.png",
                    "oom_switches.png", "schedule.png"]
    page = (tmp_path / "report.html").read_text()
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,', page)) == len(pngs)
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing from the network
    assert "simsp run scenarios/paper-22b.toml --micro-batch-size 16" in page
    assert "simsp 0.1.0" in page and "Calibration constants" in page
    for term, _ in glossary(report_categories(metrics)):  # 1F1B: no held-for-wgrad term
        assert term in page
    summary = (tmp_path / "summary.md").read_text()
    for name in pngs:
        assert f"]({name})" in summary
    assert "paper-22b (t=8 p=1 d=1, SP, recompute selective, b=16)" in page


def test_glossary_covers_the_terms_the_report_uses():
    terms = " ".join(term for term, _ in GLOSSARY)
    for word in ("MFU", "HFU", "bubble", "exposed communication", "activation", "recompute",
                 "SP", "TP", "PP", "DP", "micro-batch", "pipeline wait", "calibration"):
        assert word in terms



# ---------------------------------------------------------------- in a real browser

P175B_FIGURES = 4  # memory of every stage, schedule, exposed time, memory at peak


def _browse(run, metrics, tmp_path, name):
    """Write the reports, open report.html in headless Chromium; screenshot kept in tmp_path."""
    out = tmp_path / name
    write_reports(run, metrics, out)
    verdict, console = page_verdict(out / "report.html", tmp_path)
    shot = screenshot(out / "report.html", tmp_path / f"{name}.png", tmp_path)
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 10_000
    return verdict, console


def test_175b_report_renders_in_chromium(tmp_path):
    chromium()
    run, metrics = simulate(P175B, None)
    verdict, console = _browse(run, metrics, tmp_path, "report-175b")
    assert console == [] and verdict["errors"] == []
    assert verdict["images"] == verdict["rendered"] == P175B_FIGURES


def test_175b_oom_report_renders_in_chromium(oom_175b, tmp_path):
    chromium()
    run, metrics = oom_175b
    verdict, console = _browse(run, metrics, tmp_path, "report-175b-no-sp")
    assert '<p class="callout"><strong>Out of memory</strong>' in (
        tmp_path / "report-175b-no-sp" / "report.html").read_text()
    assert console == [] and verdict["errors"] == []
    assert verdict["images"] == verdict["rendered"] == P175B_FIGURES + 1  # + the switches


def test_the_browser_check_sees_script_errors_and_broken_pictures(tmp_path):
    chromium()
    page = tmp_path / "broken.html"
    page.write_text('<html><head><script>window.__errors=[];window.onerror=function(m)'
                    '{window.__errors.push(String(m));};</script></head><body>'
                    '<img src="data:image/png;base64,AAAA"><pre id="page-check"></pre><script>'
                    'window.addEventListener("load",function(){var i=document.images[0];'
                    'document.getElementById("page-check").textContent=JSON.stringify('
                    '{images:1,rendered:i.naturalWidth>0?1:0,errors:window.__errors});});'
                    'undefinedFunction();</script></body></html>')
    verdict, console = page_verdict(page, tmp_path)
    assert verdict["rendered"] == 0 and verdict["errors"] and console


# ---------------------------------------------------------------- the schedule's bars

TINY = os.path.join(REPO, "scenarios", "tiny.toml")


def test_gantt_bars_tile_each_stage_and_recompute_sits_inside_backward():
    sc = load_scenario(TINY, {("parallel", "recompute_granularity"): "full"})
    run = simulate_iteration(sc, Shortcuts.for_scale(sc))
    for pp in range(sc.parallel.pp):
        rank = run.inputs.rank_of(0, 0, pp)
        bars = gantt_intervals(run, rank)
        steps = run.results.steps[rank]
        first, last = min(s[3] for s in steps), max(s[4] for s in steps)
        tiled = sum(d for kind in ("forward", "backward", "wait") for _, d in bars[kind])
        assert tiled == pytest.approx(last - first, rel=1e-12)  # steps + waits, no overlap
        assert len(bars["forward"]) == sum(s[0] == "F" for s in steps)
        backward = bars["backward"]
        assert bars["recompute"]  # numeric mode: every op is traced
        for start, duration in bars["recompute"]:
            assert any(b <= start and start + duration <= b + d + 1e-15 for b, d in backward)
