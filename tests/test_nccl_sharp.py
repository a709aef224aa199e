"""NCCL's in-network algorithms (NVLS, NVLS_TREE, CollNet Direct, CollNet Chain) in
engine/collectives/nccl_tuning.py against numbers worked by hand from NVIDIA/nccl 5067397c
(2.30.7) src/graph/tuning.cc (nvlsEfficiency, hwLatencies, perChMaxNVLSTreeBws, the busBw
refinements and latency formulas), src/graph/search.cc (sm90SpeedArrayIntra) and src/graph/topo.h
(SM90_NVLINK_BW)."""

from dataclasses import replace

import pytest

from simsp.engine.collectives.nvls import nvls_all_reduce_time, nvls_in_group
from simsp.hardware.constants import LinkCalibration
from simsp.engine.collectives.nccl_tuning import (
    ALL_GATHER, ALL_REDUCE, BLACKWELL, COLLNET_CHAIN, COLLNET_DIRECT, HOPPER, NVLS, NVLS_TREE,
    REDUCE_SCATTER, SharpGraph, choose, nvls_graph, sharp_bus_bandwidth, sharp_choice, sharp_enabled,
    sharp_latency_us, sharp_time_us)

MiB = 2 ** 20
H100_NODE = SharpGraph(8, 50.0, 50.0)  # an NVLS graph given as input to tuning.cc's formulas
# the graph search.cc finds on one DGX H100 (tests/test_nccl_graph_search.py works it by hand)
H100_SEARCHED = SharpGraph(8, 40.0, 60.0)


def test_dgx_nvls_graphs_are_what_the_search_finds():
    """nvls_graph runs nccl_graph_search (worked by hand in tests/test_nccl_graph_search.py)."""
    assert nvls_graph(8, 18, HOPPER) == H100_SEARCHED
    assert nvls_graph(8, 18, BLACKWELL) == SharpGraph(8, 80.0, 90.0)


def test_nvls_all_reduce_on_one_h100_node_against_the_closed_form():
    """per channel min(50 x 0.85 x 7/8 x 2 = 74.375, bwInter 50) = 50; busBw 8 x 50 = 400;
    algbw 400 x 8/14; latency hwLatencies[NVLINK][NVLS][Simple] = 25 us (base 0, replaced)."""
    algbw = 400.0 * 8 / 14
    assert sharp_bus_bandwidth(ALL_REDUCE, NVLS, 8, 1, H100_NODE, HOPPER) == pytest.approx(
        algbw, rel=1e-12)
    assert sharp_latency_us(NVLS, 8, 1) == 25.0
    for nbytes in (8, MiB, 256 * MiB):
        assert sharp_time_us(ALL_REDUCE, NVLS, nbytes, 8, 1, H100_NODE, HOPPER) == \
            pytest.approx(25.0 + nbytes / (1000 * algbw), rel=1e-12)


def test_nvls_all_gather_on_one_node_is_not_converted_to_algbw():
    """AG/RS: x (ppn-1)/ppn instead of x2: 50 x 0.85 x 7/8 x 7/8 = 32.5390625 per channel;
    non-ring AG/RS keep busBw as algbw."""
    for collective in (ALL_GATHER, REDUCE_SCATTER):
        assert sharp_bus_bandwidth(collective, NVLS, 8, 1, H100_NODE, HOPPER) == pytest.approx(
            8 * 32.5390625, rel=1e-12)


@pytest.mark.parametrize("nodes, per_channel, latency_us", [
    (2, 48.0, 25.0 + 2 * 1 * 20.9),  # inter 24 x 2 (two nodes) = 48 < 57.7 cap < 63.75 intra
    (4, 24.0, 25.0 + 2 * 2 * 20.9),  # inter 24 < 45.5 cap
    (16, 24.0, 25.0 + 2 * 4 * 20.9)])
def test_nvls_tree_all_reduce_across_h100_nodes(nodes, per_channel, latency_us):
    """intra 40 x 0.85 x 15/16 x 2 = 63.75; busBw 16 x min(intra, inter, perChMaxNVLSTreeBw);
    algbw x n / 2(n-1); latency intra 25 + 2 log2(nodes) x NET 20.9."""
    graph, ranks = SharpGraph(16, 40.0, 24.0), 8 * nodes
    algbw = 16 * per_channel * ranks / (2 * (ranks - 1))
    assert sharp_latency_us(NVLS_TREE, ranks, nodes) == pytest.approx(latency_us, rel=1e-12)
    assert sharp_time_us(ALL_REDUCE, NVLS_TREE, 64 * MiB, ranks, nodes, graph, HOPPER) == \
        pytest.approx(latency_us + 64 * MiB / (1000 * algbw), rel=1e-12)


def test_nvls_tree_cap_binds_when_the_network_is_fast():
    # inter 96 x 2 = 192 and intra 63.75 exceed perChMaxNVLSTreeBw 57.7 (Hopper, 2 nodes)
    bus = sharp_bus_bandwidth(ALL_REDUCE, NVLS_TREE, 16, 2, SharpGraph(16, 40.0, 96.0), HOPPER)
    assert bus == pytest.approx(16 * 57.7 * 16 / 30, rel=1e-6)  # float cap, as NCCL's


def test_collnet_direct_and_chain_on_h100():
    """Direct: busBw 8 x 24 / (1 - 0) x 0.85 (SM90), x 0.5; GPU/NIC ratio 2 -> /1.5. Latency
    2(min(1, 7) x 3.7 + 7 x 0.4) + 31 = 44; Chain 2 x 7 x 2.8 + 30 = 69.2; one rank per node
    takes the tree's network latency (14)."""
    full, half = SharpGraph(8, 24.0, 24.0), SharpGraph(4, 24.0, 24.0)
    assert sharp_bus_bandwidth(ALL_REDUCE, COLLNET_DIRECT, 32, 4, full, HOPPER) == \
        pytest.approx(8 * 24 * 0.85 * 0.5, rel=1e-12)
    assert sharp_bus_bandwidth(ALL_REDUCE, COLLNET_DIRECT, 32, 4, half, HOPPER) == \
        pytest.approx(4 * 24 / 1.5 * 0.85 * 0.5, rel=1e-12)
    assert sharp_bus_bandwidth(ALL_REDUCE, COLLNET_CHAIN, 32, 4, full, HOPPER) == 8 * 24 * 0.5
    assert sharp_latency_us(COLLNET_DIRECT, 32, 4) == pytest.approx(44.0, rel=1e-12)
    assert sharp_latency_us(COLLNET_CHAIN, 32, 4) == pytest.approx(69.2, rel=1e-12)
    assert sharp_latency_us(COLLNET_CHAIN, 4, 4) == 14.0
    assert sharp_latency_us(COLLNET_DIRECT, 4, 4) == 14.0


def test_no_bandwidth_where_nccl_gives_none():
    # AG/RS across nodes with more ranks a node than CollNet heads (8 GPUs, 4 heads),
    # NVLS_TREE/Chain outside all-reduce, NVLS with one channel: NCCL's time -1, never chosen
    four_heads = SharpGraph(4, 50.0, 50.0)
    assert sharp_time_us(ALL_GATHER, NVLS, MiB, 16, 2, four_heads, HOPPER) is None
    assert sharp_time_us(REDUCE_SCATTER, COLLNET_DIRECT, MiB, 16, 2, four_heads, HOPPER) is None
    # one head per GPU (the SHARP plugin has iallgather / ireducescatter): 43 + S / (1000 x
    # 8 x min(50 x 0.85 x 7/8 x 7/8, 50)) us, busBw not converted to algbw
    assert sharp_time_us(ALL_GATHER, NVLS, MiB, 16, 2, H100_NODE, HOPPER) == pytest.approx(
        43 + MiB / (1000 * 8 * 50 * 0.85 * 7 / 8 * 7 / 8), rel=1e-12)
    assert sharp_time_us(ALL_GATHER, NVLS_TREE, MiB, 16, 2, H100_NODE, HOPPER) is None
    assert sharp_time_us(ALL_REDUCE, NVLS, MiB, 8, 1, SharpGraph(1, 50.0, 50.0), HOPPER) is None


def test_enable_conditions_follow_tuning_cc():
    """NVLS needs the switch's multicast (NCCL_NVLS_ENABLE auto); NVLS_TREE off on one node;
    CollNet and multi-node NVLS need NCCL_COLLNET_ENABLE; CollNet Direct an NVSwitch."""
    assert sharp_enabled(NVLS, 1, True, False, True)
    assert not sharp_enabled(NVLS, 1, False, False, True)  # A100: no NVLink SHARP
    assert not sharp_enabled(NVLS, 2, True, False, True)
    assert sharp_enabled(NVLS, 2, True, True, True)
    assert not sharp_enabled(NVLS_TREE, 1, True, True, True)
    assert sharp_enabled(NVLS_TREE, 2, True, False, True)
    assert not sharp_enabled(COLLNET_CHAIN, 2, True, False, True)
    assert sharp_enabled(COLLNET_CHAIN, 2, False, True, False)
    assert not sharp_enabled(COLLNET_DIRECT, 2, True, True, False)


def test_choice_by_size_on_one_h100_node():
    """NVLS 25 + S/(1000 x 1600/7) us against a 20 us + S/(1000 x 100) alternative: the
    alternative wins while S < 5 x 1000 / (1/100 - 7/1600) = 888.9 KB; ties keep the
    ring/tree (first minimum)."""
    enabled = {NVLS: True, NVLS_TREE: False}
    graphs = {NVLS: H100_NODE}
    crossover = 5 * 1000 / (1 / 100 - 7 / 1600)
    for nbytes, expected in ((4096, None), (int(crossover) - 1, None),
                             (int(crossover) + 1, NVLS), (256 * MiB, NVLS)):
        other = 20.0 + nbytes / (1000 * 100.0)
        assert sharp_choice(ALL_REDUCE, nbytes, 8, 1, graphs, HOPPER, enabled, other) == expected
    assert sharp_choice(ALL_REDUCE, 256 * MiB, 8, 1, graphs, HOPPER, {NVLS: False}, 1e9) is None


def test_a_run_takes_nvls_where_nccls_estimates_pick_it_on_dgx_h100():
    """The communicator's rule (nvls.nvls_in_group): on one DGX H100 node (450 GB/s of NVLink,
    18 links) NCCL's ring/LL estimate of 512 KiB, 6.6 + 14 x 0.6 + 524288 / (1000 x 87.7 x
    8/14) = 25.462 us, beats NVLS's on the searched graph (8 heads, bwIntra 40, bwInter 60:
    a channel min(40 x 0.85 x 7/8 x 2 = 59.5, 60), busBw 476, algbw 476 x 8/14 = 272 GB/s)
    25 + 524288 x 7 / 1.904e6 = 26.928 us; at 1 MiB NVLS's 28.855 us beats the ring's
    35.924 us (6.6 + 8.4 + 1048576 x 14 / 701600), and the run times NVLS over its links.
    A100 (no NVLS) and a forced protocol never take it."""
    gpus = tuple(range(8))
    h100 = LinkCalibration(nvls_nvlink_generation=4)
    for nbytes, ring_us, nvls_us in ((512 * 1024, 15.0 + 512 * 1024 * 14 / 701600,
                                      25.0 + 512 * 1024 * 7 / 1.904e6),
                                     (MiB, 15.0 + MiB * 14 / 701600, 25.0 + MiB * 7 / 1.904e6)):
        estimate = choose(ALL_REDUCE, nbytes, 8, 1, 450.0, 0.0)
        assert (estimate.label(), estimate.estimated_time_s * 1e6) == (
            "ring/LL", pytest.approx(ring_us, rel=1e-12))
        assert sharp_time_us(ALL_REDUCE, NVLS, nbytes, 8, 1, nvls_graph(8, 18, HOPPER),
                             HOPPER) == pytest.approx(nvls_us, rel=1e-12)
    assert nvls_in_group(gpus, 512 * 1024, 8, 450.0, h100, 15.0 + 512 * 1024 * 14 / 701600) \
        is None
    assert nvls_in_group(gpus, MiB, 8, 450.0, h100, 15.0 + MiB * 14 / 701600) == \
        nvls_all_reduce_time(MiB, 8, 450.0, h100.nvlink_efficiency, 4)
    assert nvls_in_group(gpus, MiB, 8, 450.0, LinkCalibration(), 1e9) is None
    assert nvls_in_group(gpus, MiB, 8, 450.0, replace(h100, nccl_proto="LL128"), 1e9) is None
    assert nvls_in_group(tuple(range(16)), MiB, 8, 450.0, h100, 1e9) is None  # two nodes
