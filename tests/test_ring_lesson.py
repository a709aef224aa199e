"""The ring lesson: its steps, bytes and times against closed forms and the stepwise simulation,
each step's derivation worked by hand; `simsp ring --html/--png`; and the page in headless
Chromium (buttons and keys advance the grid), screenshotted for 8 ranks and 16 on 2 nodes."""

import subprocess
import sys

import pytest
from browser import chromium, page_verdict, screenshot

from simsp.cluster.topology import build_topology
from simsp.report.lessons.ring_flags import ring_placement
from simsp.engine.collectives.nccl_group import nccl_choice
from simsp.engine.collectives.nccl_tests import simulate
from simsp.engine.collectives.ring_plan import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from simsp.engine.collectives.ring_timing import step_times
from simsp.report.lessons import ring_slides
from simsp.report.lessons.ring import lesson_data
from simsp.report.lessons.ring_page import lesson_html
from simsp.report.lessons.ring_text import lesson_text
from simsp.units import GiB, MiB

# NCCL's ring step latency on one node's NVLink, per protocol (tuning.cc hwLatencies), which a
# step costs on the default links
NVLINK_STEP_LATENCY_S = {"LL": 0.6e-6, "Simple": 3.4e-6}
NVLINK_RATE_BPS = 0.78 * 300e9  # nvlink_efficiency x 300 GB/s


def data_for(ranks, collective=ALL_REDUCE, size=MiB, nodes=None):
    cluster, gpus = ring_placement(ranks, nodes)
    graph = build_topology(cluster)
    return lesson_data(collective, graph, gpus, size), graph, gpus


def test_four_rank_all_reduce_steps_bytes_and_closed_form_times():
    data, _, _ = data_for(4)
    assert len(data["steps"]) == 6 == data["compare"]["steps"][ALL_REDUCE]
    assert [s["phase"] for s in data["steps"]] == [REDUCE_SCATTER] * 3 + [ALL_GATHER] * 3
    for step in data["steps"]:
        assert step["bytes_per_rank"] == MiB // 4
        # docs/MODEL.md#collectives on uniform NVLink hops: latency + (S/n) / B per step, at the LL
        # protocol NCCL runs 1 MiB on 4 GPUs with (tuning.cc): its ring/LL NVLink step latency
        # and the rate x llMaxBw 87.7 / Simple's 240 GB/s
        assert step["time_s"] == pytest.approx(NVLINK_STEP_LATENCY_S["LL"]
                                               + MiB / 4 / (NVLINK_RATE_BPS * 87.7 / 240),
                                               rel=1e-12)
    assert all(cell == [0, 1, 2, 3] for row in data["steps"][-1]["holdings"] for cell in row)
    assert data["start"][2] == [[2]] * 4


def test_step_times_add_up_to_the_stepwise_simulation():
    for ranks, nodes in ((4, None), (16, 2)):
        data, graph, gpus = data_for(ranks, size=4 * MiB, nodes=nodes)
        stats = simulate(graph, gpus, ALL_REDUCE, 4 * MiB)
        base_s = nccl_choice(ALL_REDUCE, graph, gpus, 4 * MiB, None, "ring").base_latency_s
        assert sum(s["time_s"] for s in data["steps"]) + base_s == pytest.approx(stats.time_s,
                                                                                 rel=1e-9)


def test_all_reduce_equals_reduce_scatter_plus_all_gather():
    data, _, _ = data_for(8, size=8 * MiB)
    c = data["compare"]
    sent = c["bytes_sent_per_rank"]
    assert sent[ALL_REDUCE] == sent[REDUCE_SCATTER] + sent[ALL_GATHER] == 2 * 7 * MiB
    assert c["time_s"][ALL_REDUCE] == pytest.approx(
        c["time_s"][REDUCE_SCATTER] + c["time_s"][ALL_GATHER], rel=1e-12)


def test_two_nodes_mark_the_infiniband_hops_of_every_channel():
    data, _, _ = data_for(16, nodes=2)
    assert data["nodes"] == 2 and len(data["channels"]) >= 1
    for channel in data["channels"]:
        assert sorted(channel["order"]) == list(range(16))
        assert channel["hops"].count("InfiniBand") == 2  # the ring leaves each node once


def test_each_step_derives_its_time_from_its_slowest_hop():
    """8 ranks, 1 GiB: every step moves a 128 MiB chunk over one NVSwitch hop at 300 GB/s x 0.78
    plus NCCL's ring/Simple NVLink step latency, 3.4 us: 576.98 us, written out with its
    numbers."""
    data, graph, gpus = data_for(8, size=GiB)
    expected_s = NVLINK_STEP_LATENCY_S["Simple"] + 128 * MiB / (300e9 * 0.78)
    for step, engine in zip(data["steps"], zip(*step_times(ALL_REDUCE, graph, gpus, GiB,
                                                             elem_bytes=4))):
        hop = step["hop"]
        assert hop["time_s"] == pytest.approx(expected_s, rel=1e-12) == max(engine)
        assert hop["formula"] == ("576.98 µs = 128.00 MiB ÷ (300 GB/s × 0.78) + 3.40 µs "
                                  "ring/Simple step")
        assert (hop["link"], hop["via"], hop["sharing"]) == ("NVLink", None, 1)


def test_two_node_steps_are_relayed_infiniband_hops_of_an_eighth_of_a_chunk():
    """16 ranks on 2 nodes, 1 GiB: 8 channels each carry 1/8 of a 64 MiB chunk; the slowest hop
    leaves a node through the rail's NIC after a PXN relay: 8 MiB / (25 GB/s x 0.9) + NCCL's
    ring latency spread over the 15 steps of a phase (tuning.cc: 14 NVLink steps at
    max(3.4, 3 x 2.0 network overhead) us + 1 node crossing at 14 us: 98 / 15 us), faster than
    one node's step (3.4 us + 128 MiB / (300 GB/s x 0.78)) for the same S."""
    data, graph, gpus = data_for(16, size=GiB, nodes=2)
    two_node_s = 98e-6 / 15 + 8 * MiB / (25e9 * 0.9)
    for step, engine in zip(data["steps"], zip(*step_times(ALL_REDUCE, graph, gpus, GiB,
                                                             elem_bytes=4))):
        hop = step["hop"]
        assert hop["time_s"] == pytest.approx(two_node_s, rel=1e-12)
        assert hop["time_s"] == pytest.approx(max(engine), rel=1e-12)
        assert (hop["link"], hop["bytes"], hop["sharing"]) == ("InfiniBand", 8 * MiB, 1)
        assert hop["via"] is not None and hop["via"] // 8 == hop["src"] // 8 != hop["dst"] // 8
    assert data["one_node"]["time_s"] == pytest.approx(3.4e-6 + 128 * MiB / 234e9, rel=1e-12)
    assert data["one_node"]["time_s"] > two_node_s


def test_the_text_shows_each_step_formula():
    data, _, _ = data_for(8, size=GiB)
    lines = lesson_text(data)
    hops = [line for line in lines if line.startswith("  slowest hop")]
    assert len(hops) == 14
    assert hops[0] == ("  slowest hop gpu0 -> gpu1, ring order 0, NVLink: 576.98 us = 128.00 MiB / "
                       "(300 GB/s x 0.78) + 3.40 us ring/Simple step")


@pytest.mark.parametrize("ranks, nodes", [(8, 1), (16, 2)])
def test_the_page_shows_every_step_in_one_unit_and_only_the_panels_that_apply(ranks, nodes):
    data, _, _ = data_for(ranks, size=GiB, nodes=nodes)
    page = lesson_html(data, "t")
    body = page.split("var DATA = ")[0]
    assert body.count('<tr id="row-') == 2 * (ranks - 1) and "max-height" not in page
    assert " us" not in body and " ms<" not in body and "µs" in body
    assert ('id="sp"' in body) == (nodes == 1)  # TP (hence SP) never spans nodes
    assert ('id="channels"' in body) == (nodes > 1)
    if nodes > 1:
        assert "PXN" in body and "rail" in body and data["one_node"]["formula"] in body


def test_every_slide_has_a_legend(monkeypatch):
    monkeypatch.setattr(ring_slides, "pyplot_png", lambda plt, fig: fig)
    data, _, _ = data_for(16, size=GiB, nodes=2)
    compare = ring_slides.comparison_slide(data)
    labels = [t.get_text() for t in compare.axes[0].get_legend().get_texts()]
    assert labels == ["all-reduce", "reduce-scatter", "all-gather"]
    for k in (0, 8):
        slide = ring_slides.step_slide(data, k)
        texts = [t.get_text() for t in slide.legends[0].get_texts()]
        assert "InfiniBand hop" in texts and "just received" in texts
    for fig in (compare, slide):
        fig.clf()


def test_reduce_scatter_ends_with_each_rank_holding_its_reduced_chunk():
    data, _, _ = data_for(4, REDUCE_SCATTER)
    last = data["steps"][-1]["holdings"]
    for rank in range(4):
        assert last[rank][rank] == [0, 1, 2, 3]


# ---------------------------------------------------------------- the command line

def ring_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "simsp.cli", "ring", *args],
                          capture_output=True, text=True, cwd=cwd)


def test_ring_html_and_png_flags_write_the_page_and_slides(tmp_path):
    done = ring_cli("--ranks", "4", "--size", "1M", "--html", str(tmp_path / "ring.html"),
                    "--png", str(tmp_path / "slides"))
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "ring.html").read_text()
    assert "var DATA = " in page and "http://" not in page.replace(
        "http://www.w3.org/2000/svg", "")  # the SVG namespace is a name, not a fetch
    names = sorted(p.name for p in (tmp_path / "slides").iterdir())
    assert names == ["compare.png"] + [f"step_{k:02d}.png" for k in range(7)]


def test_the_lesson_explains_sixteen_ranks_on_two_nodes(tmp_path):
    done = ring_cli("--ranks", "16", "--nodes", "2", "--size", "64M", "--explain", "--html",
                    str(tmp_path / "ring16.html"))
    assert done.returncode == 0, done.stderr
    assert "all_gather step 15/15" in done.stdout and (tmp_path / "ring16.html").exists()


@pytest.mark.parametrize("args, field", [
    (["--ranks", "32", "--nodes", "4", "--size", "1M", "--html", "x.html"], "--html"),
    (["--ranks", "4", "--min-size", "1K", "--max-size", "4K", "--html", "x.html"], "--html"),
])
def test_ring_lesson_flag_errors(args, field, tmp_path):
    done = ring_cli(*args, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith(f"error: {field}:")
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.html").exists()


# ---------------------------------------------------------------- in a real browser

@pytest.mark.parametrize("ranks, nodes, collective, full", [
    (8, 1, ALL_REDUCE, 64), (16, 2, ALL_REDUCE, 256), (4, 1, REDUCE_SCATTER, 4),
    (4, 1, ALL_GATHER, 0)])
def test_ring_page_steps_in_chromium(ranks, nodes, collective, full, tmp_path):
    chromium()
    page = tmp_path / f"ring-{ranks}-{collective}.html"
    done = ring_cli("--ranks", str(ranks), "--nodes", str(nodes), "--collective", collective,
                    "--size", "64M", "--html", str(page))
    assert done.returncode == 0, done.stderr
    verdict, console = page_verdict(page, tmp_path)
    assert console == [] and verdict["errors"] == []
    stepping = verdict["stepping"]
    assert stepping["advanced"] and stepping["back"]
    assert stepping["steps"] == (2 if collective == ALL_REDUCE else 1) * (ranks - 1)
    assert stepping["full_cells_at_end"] == full  # the grid reached the collective's end
    assert stepping["filled_cells_at_end"] == ranks * ranks
    assert stepping["arrows_at_end"] == ranks
    assert stepping["keys_advanced"] and stepping["page_up"] and stepping["space_plays"]
    assert " µs = " in stepping["formula_at_end"]
    assert (stepping["relayed_hops"] > 0) == (nodes > 1)  # a PXN hop drawn relayed
    assert verdict["svgs"] >= (1 if nodes > 1 else 2)  # the ring (and, one node, SP's diagram)
    shot = screenshot(page, tmp_path / f"{page.stem}.png", tmp_path, "1400,1600")
    assert len(shot) > 10_000
