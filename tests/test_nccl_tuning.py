"""NCCL's algorithm, protocol and channel choice (engine/collectives/nccl_tuning.py) against times worked by
hand from NVIDIA/nccl 2.30.7's constants (src/graph/tuning.cc, src/enqueue.cc), and simsp's
timing of each choice over its links, in closed form and step by step."""

import json
from pathlib import Path
import time

from hypothesis import given, settings, strategies as st
import pytest

from simsp.cli import main
from simsp.cluster.topology import build_topology
from simsp.engine.collectives.nccl_tests import simulate, simulate_nccl
from simsp.scenario.config import Cluster
from simsp.engine.collectives.nccl_graphs import nccl_graph, nccl_graphs
from simsp.engine.collectives.nccl_tuning import channels_and_threads, choose, nccl_time_us
from simsp.engine.collectives.ring_timing import collective_time
from simsp.hardware.constants import LinkCalibration

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
ONE_NODE = build_topology(Cluster())
TWO_NODES = build_topology(Cluster(nodes=2))
NVLINK_BPS = 300e9 * 0.78  # the achieved NVLink rate ring/Simple runs at
MiB = 2 ** 20


def nccl_us(collective, nbytes, ranks, nodes, algorithm=None, protocol=None):
    """NCCL's own time estimate (us) of its choice, forced or not."""
    return choose(collective, nbytes, ranks, nodes, 300.0, 25.0, algorithm,
                  protocol).estimated_time_s * 1e6


# ------------------------------------------------------------------------------------------
# NCCL's model itself: graph, estimate, pick, channels
# ------------------------------------------------------------------------------------------

def test_dgx_a100_graphs_are_what_ncclTopoCompute_finds():
    # one node: 12 NVLinks x 20 GB/s = 240; 6 channels at 40 GB/s, doubled to 12 at 20;
    # across nodes: one channel per NIC at 24 GB/s (PCIe Gen4 x16), not doubled (< 25)
    assert nccl_graph(1, 8, 300.0, 25.0) == nccl_graph(1, 2, 300.0, 25.0)
    one, two = nccl_graph(1, 8, 300.0, 25.0), nccl_graph(2, 8, 300.0, 25.0)
    assert (one.channels, one.bw_intra, one.bw_inter, one.comm_channels) == (12, 20.0, 20.0, 24)
    assert (two.channels, two.bw_intra, two.bw_inter, two.comm_channels) == (8, 24.0, 24.0, 16)


@pytest.mark.parametrize("protocol, latency_us, busbw_GBps", [
    ("LL", 6.6 + 14 * 0.6, min(87.7, 0.5 * 240)),  # llMaxBw caps LL on Ampere, one node
    ("LL128", 14.0 + 14 * 1.9, min(0.92 * 240, 12 * 20.0)),  # perChMaxRingLL128Bw
    ("Simple", 8.4 + 14 * 3.4, 240.0)])
def test_ring_estimate_per_protocol_on_one_node(protocol, latency_us, busbw_GBps):
    """tuning.cc: base + 2(n-1) NVLink steps, bytes / (1000 x busbw x n / 2(n-1)) us."""
    for nbytes in (8, MiB, 64 * MiB):
        expected = latency_us + nbytes / (1000 * busbw_GBps * 8 / 14)
        assert nccl_us("all_reduce", nbytes, 8, 1, "ring", protocol) == pytest.approx(
            expected, rel=1e-12)


def test_tree_estimate_on_two_nodes_with_the_correction_factor():
    """tuning.cc tree/LL: base 6.8 + 2((8-1) x 0.6 + log2(2) x 5.0) us; busbw 8 x 24 x 0.92
    (tree all-reduce), / 3.8 for LL, capped at llMaxBw 22.5 (AMD, 2 nodes), x 0.5 to algbw;
    at 1 MiB the LL correction factor is treeCorrectionFactor[LL][log2(1 MiB / 64) = 14] = 0.5."""
    latency_us = 6.8 + 2 * (7 * 0.6 + 5.0)
    algbw = min(8 * 24 * 0.92 / 3.8, 22.5) * 0.5
    assert nccl_us("all_reduce", 8, 16, 2, "tree", "LL") == pytest.approx(
        latency_us + 8 / (1000 * algbw), rel=1e-12)
    assert nccl_us("all_reduce", MiB, 16, 2, "tree", "LL") == pytest.approx(
        latency_us + MiB / (1000 * algbw * 0.5), rel=1e-12)


def test_multi_node_ring_pays_network_steps_and_the_post_overhead():
    """tuning.cc ring/LL on 2 nodes: 2(2-1) network steps at 2.7 us; the 28 other steps at
    max(0.6, 2.0 us network post overhead of an AMD CPU)."""
    assert nccl_us("all_reduce", 8, 16, 2, "ring", "LL") == pytest.approx(
        6.6 + 28 * 2.0 + 2 * 2.7 + 8 / (1000 * 22.5 * 16 / 30), rel=1e-12)


def test_nccl_picks_the_cheapest_and_the_pick_moves_with_size():
    picks = {size: choose("all_reduce", size, 8, 1, 300.0, 25.0).label()
             for size in (8, MiB, 8 * MiB, 64 * MiB)}
    assert picks == {8: "ring/LL", MiB: "ring/LL", 8 * MiB: "ring/LL128", 64 * MiB: "ring/Simple"}
    for size in (8, MiB, 8 * MiB, 64 * MiB):
        best = min(nccl_us("all_reduce", size, 8, 1, a, p) for a in ("ring", "tree")
                   for p in ("LL", "LL128", "Simple"))
        assert nccl_us("all_reduce", size, 8, 1) == best
    # across 16 nodes small all-reduces go to the tree; reduce-scatter has only the ring
    assert choose("all_reduce", 8, 128, 16, 300.0, 25.0).label() == "tree/LL"
    assert choose("reduce_scatter", 8, 128, 16, 300.0, 25.0).algorithm == "ring"
    with pytest.raises(ValueError):
        choose("all_gather", 8, 16, 2, 300.0, 25.0, "tree")


def test_channels_and_threads_shrink_for_small_messages():
    """enqueue.cc: channels drop while bytes < nc x nt x threshold (LL ring: 8 x nRanks B per
    thread), then threads halve while a multiple of 128."""
    graph = nccl_graph(1, 8, 300.0, 25.0)
    assert channels_and_threads("ring", "LL", 128 * 1024, 8, graph) == (4, 512)  # 4 x 512 x 64
    assert channels_and_threads("ring", "LL", 8192, 8, graph) == (1, 128)
    assert channels_and_threads("ring", "Simple", 64 * MiB, 8, graph) == (24, 512)
    assert channels_and_threads("ring", "LL128", 24 * 640 * 8, 8, graph) == (24, 640)
    assert channels_and_threads("tree", "LL", 8, 8, graph) == (1, 640)  # trees use every thread


def test_the_choice_is_memoised_and_cheap():
    choose.cache_clear()
    start = time.perf_counter()
    for _ in range(10_000):
        choose("all_reduce", 96 * MiB, 8, 1, 300.0, 25.0)
    assert choose.cache_info().misses == 1
    assert time.perf_counter() - start < 0.5


# ------------------------------------------------------------------------------------------
# simsp's time of each choice over its links
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol, base_us, step_latency_us, fraction", [
    ("LL", 6.6, 0.6, 87.7 / 240),
    ("LL128", 14.0, 1.9, 0.92),
    ("Simple", 8.4, 3.4, 1.0)])
def test_ring_time_per_protocol_is_hand_worked(protocol, base_us, step_latency_us, fraction):
    """64 MiB over 8 GPUs of one node, every channel: NCCL's base latency, then 14 steps of
    (NCCL's ring NVLink step latency of the protocol, tuning.cc hwLatencies, on the default
    links + S/8 at the achieved NVLink rate x the protocol's busbw over Simple's), in closed
    form and step by step."""
    forced = LinkCalibration(nccl_algo="ring", nccl_proto=protocol)
    nbytes = 64 * MiB
    expected = base_us * 1e-6 + 14 * (step_latency_us * 1e-6 + nbytes / 8 / (NVLINK_BPS
                                                                            * fraction))
    gpus = list(range(8))
    assert collective_time("all_reduce", ONE_NODE, gpus, nbytes, forced, 4) == pytest.approx(
        expected, rel=1e-12)
    stats = simulate(ONE_NODE, gpus, "all_reduce", nbytes, forced)
    assert (stats.protocol, stats.nchannels) == (protocol, 24)
    assert stats.time_s == pytest.approx(expected, rel=1e-9)


def test_tree_time_on_sixteen_nodes_is_hand_worked():
    """8 B over 128 GPUs: tree/LL, base 6.8 us + 2 x (7 NVLink steps of 0.6 us + log2(16) = 4
    network steps of 5.0 us), NCCL's tree/LL step latencies (tuning.cc hwLatencies) on the
    default links; 8 B on one channel of 16 is ~7 ns."""
    graph = build_topology(Cluster(nodes=16))
    latency_s = (6.8 + 2 * (7 * 0.6 + 4 * 5.0)) * 1e-6
    seconds = collective_time("all_reduce", graph, list(range(128)), 8)
    assert latency_s < seconds < latency_s + 1e-8


@pytest.mark.parametrize("protocol, base_us, intra_us, inter_us, fraction, correction", [
    ("LL", 6.8, 0.6, 5.0, 22.5 / 192, 1.0),  # bus min(188.8 / 3.8, llMaxBw 22.5)
    ("LL128", 14.0, 1.25, 8.5, 160 / 192, 0.9),  # min(x120/128, 8 x 20 per channel)
    # the tree graph: 8 x bwIntra 30 (nccl_graph_search pass 2), x0.92 = 220.8, capped at
    # 8 x perChMaxTreeBw 23.6 = 188.8 (the LL and LL128 rows start from this 188.8 too)
    ("Simple", 8.4, 4.0, 14.0, 188.8 / 192, 0.8)])
def test_tree_time_per_protocol_on_two_nodes_is_hand_worked(protocol, base_us, intra_us,
                                                             inter_us, fraction, correction):
    """64 MiB over 16 GPUs of two nodes, forced tree: NCCL's base latency, 2 x (7 NVLink steps
    + log2(2) = 1 network step) at the tree's own step latencies (tuning.cc hwLatencies, on the
    default links); then S at half the ring/Simple bus rate (8 channels at the NIC's
    25 x 0.9 GB/s) x the protocol's busbw over ring/Simple's (8 x 24 GB/s) x
    treeCorrectionFactor[log2(2^26 / 64)]."""
    forced = LinkCalibration(nccl_algo="tree", nccl_proto=protocol)
    nbytes = 64 * MiB
    latency_us = base_us + 2 * (7 * intra_us + 1 * inter_us)
    expected = latency_us * 1e-6 + nbytes / (0.5 * 8 * 22.5e9 * fraction * correction)
    stats = simulate_nccl(TWO_NODES, list(range(16)), "all_reduce", nbytes, forced)
    assert (stats.algorithm, stats.protocol) == ("tree", protocol)
    assert stats.time_s == pytest.approx(expected, rel=1e-12)


def test_ring_across_nodes_stepwise_equals_closed_form_for_every_protocol():
    gpus = list(range(16))
    for protocol in ("LL", "LL128", "Simple"):
        forced = LinkCalibration(nccl_algo="ring", nccl_proto=protocol)
        for nbytes in (4096, 6 * MiB):
            stats = simulate(TWO_NODES, gpus, "reduce_scatter", nbytes, forced)
            assert stats.protocol == protocol
            assert stats.time_s == pytest.approx(collective_time(
                "reduce_scatter", TWO_NODES, gpus, nbytes, forced, 4), rel=1e-9)


# ------------------------------------------------------------------------------------------
# simsp run and simsp ring: NCCL_ALGO / NCCL_PROTO
# ------------------------------------------------------------------------------------------

def run_time(capsys, *argv) -> float:
    assert main(["run", str(SCENARIOS / "tiny.toml"), "--mode", "meta", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["iteration_time_s"]


def test_run_forces_the_protocol_of_every_collective(capsys, tmp_path):
    auto = run_time(capsys)
    ll = run_time(capsys, "--nccl-proto", "LL")
    simple = run_time(capsys, "--nccl-proto", "Simple")
    assert auto == ll < simple  # the tiny model's collectives are small: NCCL picks LL
    scenario = tmp_path / "ll.toml"
    scenario.write_text((SCENARIOS / "tiny.toml").read_text().replace(
        "[cluster]\n", '[cluster]\nnccl_proto = "LL"\n'))
    assert main(["run", str(scenario), "--mode", "meta", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_s"] == ll
    with pytest.raises(SystemExit) as exit_code:
        main(["run", str(SCENARIOS / "tiny.toml"), "--nccl-proto", "LL64"])
    assert exit_code.value.code == 2
    assert capsys.readouterr().err.startswith("error: ")
    scenario.write_text(scenario.read_text().replace('"LL"', '"LL64"'))
    assert main(["run", str(scenario), "--json"]) == 2
    assert capsys.readouterr().err.startswith("error: cluster.nccl_proto")


def test_ring_table_names_the_pick_of_every_size(capsys):
    assert main(["ring", "--ranks", "8", "--min-size", "8", "--max-size", "128M",
                 "--step-factor", "8"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()
            if line.strip() and not line.startswith("#")]
    assert [tuple(r[7:9]) for r in rows] == [("ring", "LL")] * 7 + [("ring", "LL128"),
                                                                     ("ring", "Simple")]
    assert main(["ring", "--ranks", "8", "--size", "64M", "--nccl-proto", "LL"]) == 0
    assert " ring     LL   24" in capsys.readouterr().out


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["all_reduce", "reduce_scatter", "all_gather"]), st.integers(0, 2 ** 34),
       st.sampled_from([(2, 1), (8, 1), (16, 2), (6, 3), (64, 8), (512, 64)]),
       st.sampled_from([None, "ring", "tree"]), st.sampled_from([None, "LL", "LL128", "Simple"]))
def test_the_pick_is_the_cheapest_allowed_and_its_terms_are_fractions(collective, nbytes, shape,
                                                                      algorithm, protocol):
    ranks, nodes = shape
    if algorithm == "tree" and collective != "all_reduce":
        return
    choice = choose(collective, nbytes, ranks, nodes, 300.0, 25.0, algorithm, protocol)
    graphs = dict(zip(("ring", "tree"), nccl_graphs(nodes, ranks // nodes, 300.0, 25.0)))
    allowed = [(a, p) for a in ("tree", "ring") for p in ("LL", "LL128", "Simple")
               if (a == "ring" or collective == "all_reduce") and algorithm in (None, a)
               and protocol in (None, p)]
    times = [nccl_time_us(collective, a, p, nbytes, ranks, nodes, graphs[a])
             for a, p in allowed]
    assert choice.estimated_time_s * 1e6 == pytest.approx(min(times), rel=1e-12)
    assert (choice.algorithm, choice.protocol) == allowed[times.index(min(times))]
    assert 1 <= choice.nchannels <= choice.max_channels == graphs["ring"].comm_channels
    assert 0 < choice.bandwidth_fraction <= 1 and 0 < choice.channel_fraction <= 1
    assert choice.intra_step_s > 0 and choice.inter_step_s > 0
