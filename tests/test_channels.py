"""NCCL channels: per-rail ring layout, a hand-worked two-channel timeline, NICs per node,
exact numeric results and bytes per channel, and the closed form against the stepwise rings."""

import numpy as np
import pytest
import simpy
from hypothesis import given, settings, strategies as st

from simsp.cluster.grid import RankGrid
from simsp.cluster.topology import build_topology
from simsp.scenario.config import Cluster
from simsp.engine.collectives.ring import RING_COLLECTIVES
from simsp.engine.network import Network
from simsp.engine.collectives.ring_plan import (ALL_GATHER, ALL_REDUCE, COLLECTIVES, REDUCE_SCATTER,
                                    channel_bytes, channel_rings, chunk_counts, chunk_offsets)
from simsp.engine.collectives.ring_timing import (busbw_GBps, closed_form_stats, collective_time,
                                      phase_step_times)
from simsp.hardware.constants import LinkCalibration

CLUSTER = Cluster(nodes=2)
CAL = LinkCalibration()
GRAPH = build_topology(CLUSTER)
IB_BPS = 25e9 * 0.9  # HDR NIC, 25 GB/s per direction, at the default ib_efficiency
NVLINK_HOP_S = 2e-6  # default nvlink_latency_us: one hop through the NVSwitch
IB_EDGE_S = 1e-6  # default ib_latency_us per IB edge


def run_ring(collective, gpus, buffers, nbytes, elem_bytes=2, graph=GRAPH):
    """One ring collective alone on the links; (results, stats)."""
    env = simpy.Environment()
    network = Network(env, graph, CAL)
    process = env.process(RING_COLLECTIVES[collective](env, network, list(gpus), buffers,
                                                       nbytes, elem_bytes))
    env.run()
    return process.value


def test_two_nodes_of_eight_make_eight_rail_channels():
    channels = channel_rings(list(range(16)), 8)
    assert [c.rail for c in channels] == list(range(8))
    # channel 3 enters each node at its 3rd GPU and leaves from its 2nd, relaying through the
    # GPU on rail 3 (PXN) so the node crossing stays on rail 3
    assert channels[3].order == (3, 4, 5, 6, 7, 0, 1, 2, 11, 12, 13, 14, 15, 8, 9, 10)
    assert channels[3].via[7] == 3 and channels[3].via[15] == 11
    assert sum(v is not None for v in channels[3].via) == 2


def test_one_node_is_one_ring_in_group_order():
    (channel,) = channel_rings([8, 9, 10, 11], 8)
    assert channel.order == (0, 1, 2, 3) and channel.rail is None
    assert channel.via == (None,) * 4


def test_hand_worked_two_channel_ring_timeline():
    # gpus 0, 1 on node 0 and 8, 9 on node 1: two channels, on rails 0 and 1.
    # Channel 0: 0 -> 1 -> (NVLink to gpu0, its NIC) 8 -> 9 -> (NVLink to gpu8, NIC) 0.
    # Channel 1: 1 -> 0 -> (via gpu1) 9 -> 8 -> (via gpu9) 1.
    # The NIC is a node crossing's only shared-free bottleneck: 22.5 GB/s. Each GPU's NVLink
    # egress carries two flows, one NIC-bound at 22.5 GB/s, the other gets 234 - 22.5 GB/s and
    # finishes first. S = 18 MB of 2-byte elements: 4 chunks of 4.5 MB, each split in 2 slices
    # of 2.25 MB. NCCL runs it as ring/Simple on every channel (tuning.cc): its base latency of
    # 8.4 us once per call, and its ring latency on the default links, 4 NVLink steps at
    # max(3.4, 3 x 2.0 network overhead) us + 2 node crossings at 14 us = 52 us, spread over
    # the 6 steps.
    nbytes = 18_000_000
    step_s = 52e-6 / 6 + 2_250_000 / IB_BPS
    base_s = 8.4e-6
    _, stats = run_ring(ALL_REDUCE, [0, 1, 8, 9], None, nbytes)
    assert (stats.protocol, stats.nchannels) == ("Simple", 4)
    assert stats.time_s == pytest.approx(base_s + 6 * step_s, rel=1e-12)  # 2(n-1) = 6 steps
    assert [c.time_s for c in stats.channels] == pytest.approx([base_s + 6 * step_s] * 2,
                                                                rel=1e-12)
    assert [c.nbytes for c in stats.channels] == [9_000_000, 9_000_000]
    # each ring position sends 2(n-1)/n of its channel's half: 13.5 MB; per GPU 27 MB = 2(n-1)/n S
    assert [c.bytes_sent for c in stats.channels] == [(6_750_000 * 2,) * 4] * 2
    assert stats.bytes_sent == (27_000_000,) * 4
    assert [(c.rail, c.gpus) for c in stats.channels] == [(0, (0, 1, 8, 9)), (1, (1, 0, 9, 8))]
    assert collective_time(ALL_REDUCE, GRAPH, [0, 1, 8, 9], nbytes, CAL) == pytest.approx(
        base_s + 6 * step_s, rel=1e-12)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_a_rail_aligned_data_parallel_group_uses_8_over_t_nics_per_node(t):
    grid = RankGrid(tp=t, pp=1, dp=16 // t)  # 16 GPUs on two nodes
    group = list(grid.dp_group(0))  # ranks 0, t, 2t, ...: every t-th rail
    channels = channel_rings(group, 8)
    assert sorted(c.rail for c in channels) == list(range(0, 8, t))
    nbytes = 256 << 20
    _, stats = run_ring(ALL_REDUCE, group, None, nbytes)
    busbw = busbw_GBps(ALL_REDUCE, len(group), nbytes, stats.time_s) * 1e9
    assert 0.9 * (8 // t) * IB_BPS < busbw <= (8 // t) * IB_BPS


@settings(max_examples=25, deadline=None)
@given(gpus=st.sampled_from([(0, 1, 2, 8, 9, 10), (0, 8, 1, 9), (3, 5, 11, 13, 7, 15),
                             (0, 1, 2, 3, 4, 8, 9, 10, 11, 12), tuple(range(16))]),
       count=st.integers(0, 61), seed=st.integers(0, 2**16))
def test_channel_results_are_exact_and_contiguous(gpus, count, seed):
    n = len(gpus)
    rng = np.random.default_rng(seed)
    buffers = [rng.integers(-8, 9, size=count).astype(np.float64) for _ in range(n)]  # n x (count,)
    total = np.sum(np.stack(buffers), axis=0)  # (count,)
    counts, offsets = chunk_counts(count, n), chunk_offsets(chunk_counts(count, n))
    reduced, _ = run_ring(REDUCE_SCATTER, gpus, buffers, count * 2)
    for i in range(n):  # member i gets its whole contiguous chunk i, from every channel's slice
        assert np.array_equal(reduced[i], total[offsets[i]:offsets[i] + counts[i]])
    gathered, _ = run_ring(ALL_GATHER, gpus, reduced, count * 2)
    assert all(np.array_equal(g, total) for g in gathered)
    summed, _ = run_ring(ALL_REDUCE, gpus, buffers, count * 2)
    assert all(np.array_equal(s, total) for s in summed)


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("gpus", [(0, 1, 2, 8, 9, 10), tuple(range(16)), (0, 2, 8, 10)])
@pytest.mark.parametrize("nbytes", [6, 1_000_002])
def test_closed_form_bytes_and_times_match_the_stepwise_channels(collective, gpus, nbytes):
    _, stepwise = run_ring(collective, gpus, None, nbytes)
    closed = closed_form_stats(collective, GRAPH, list(gpus), nbytes, CAL)
    assert (closed.bytes_sent, closed.bytes_received, closed.steps) == (
        stepwise.bytes_sent, stepwise.bytes_received, stepwise.steps)
    assert [c.bytes_sent for c in closed.channels] == [c.bytes_sent for c in stepwise.channels]
    assert closed.time_s == pytest.approx(stepwise.time_s, rel=0.01)
    sent, _ = channel_bytes(collective, chunk_counts(nbytes // 2, len(gpus)), 2,
                            channel_rings(list(gpus), 8))
    assert tuple(sent) == stepwise.bytes_sent


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 300), seed=st.integers(0, 2**16), first_hop=st.integers(0, 1))
def test_phase_step_times_equal_the_direct_maximum(n, seed, first_hop):
    rng = np.random.default_rng(seed)
    hop_kinds = [(2e-6, 2.34e11), (4e-6, 2.25e10), (6e-6, 2.25e10)]
    hops = [hop_kinds[k] for k in rng.integers(0, 3, size=n)]
    chunk_bytes = [int(b) for b in rng.choice([1000, 1002, 1004], size=n)]
    direct = [max(hops[p][0] + chunk_bytes[(p - s - first_hop) % n] / hops[p][1]
                  for p in range(n)) for s in range(n - 1)]
    assert phase_step_times(hops, chunk_bytes, first_hop) == direct  # the same floats


def test_big_rings_time_in_closed_form_quickly_and_are_nic_bound():
    graph = build_topology(Cluster(nodes=64))
    nbytes = 1 << 30
    time_s = collective_time(ALL_REDUCE, graph, list(range(512)), nbytes, CAL, 4)
    # 8 channels x 22.5 GB/s at most, less the 1022 steps' latencies
    busbw = busbw_GBps(ALL_REDUCE, 512, nbytes, time_s) * 1e9
    steps = 2 * 511
    bound_s = steps * nbytes / (512 * 8) / IB_BPS
    assert time_s > bound_s and busbw < 8 * IB_BPS
    assert time_s < bound_s + steps * (NVLINK_HOP_S + 4 * IB_EDGE_S) * 1.0001


def test_numeric_iteration_with_multi_channel_dp_equals_the_single_device_reference():
    """d 4 over two 4-GPU nodes: every DP group runs as two rail channels; loss and gradients
    still equal one device's (≤ 1e-10)."""
    from simsp.scenario.loading import load_scenario
    from simsp.training.driver.compare import compare_with_reference
    from simsp.training.driver.iteration import simulate_iteration

    values = {("model", "num_layers"): 2, ("parallel", "tensor_model_parallel_size"): 2,
              ("parallel", "sequence_parallel"): True, ("parallel", "data_parallel_size"): 4,
              ("parallel", "micro_batch_size"): 2, ("parallel", "global_batch_size"): 16,
              ("cluster", "nodes"): 2, ("cluster", "gpus_per_node"): 4}
    sc = load_scenario(None, values)
    assert len(channel_rings([0, 2, 4, 6], 4)) == 2
    errors = compare_with_reference(simulate_iteration(sc))
    assert max(errors.values()) <= 1e-10, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
