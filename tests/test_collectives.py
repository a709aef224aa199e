"""Ring collectives: exact results against direct numpy sums, bytes per rank, and timing."""

import numpy as np
import pytest
import simpy
from hypothesis import given, settings, strategies as st

from simsp.cluster.topology import build_topology
from simsp.scenario.config import Cluster
from simsp.engine.collectives.ring import (RING_COLLECTIVES, ring_all_gather, ring_all_reduce,
                                      ring_reduce_scatter)
from simsp.engine.network import Network
from simsp.engine.collectives.nccl_group import nccl_choice
from simsp.engine.collectives.ring_plan import (ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, STEPS, apply_step,
                                    chunk_counts, chunk_offsets, initial_holdings)
from simsp.engine.collectives.ring_timing import busbw_GBps
from simsp.hardware.constants import LinkCalibration

CLUSTER = Cluster(nodes=2)
CAL = LinkCalibration()
GRAPH = build_topology(CLUSTER)
NVLINK_BPS = CLUSTER.nvlink_bandwidth_GBps * 1e9 * CAL.nvlink_efficiency
IB_BPS = CLUSTER.ib_bandwidth_GBps * 1e9 * CAL.ib_efficiency


def run_ring(collective, gpus, buffers, nbytes, elem_bytes=2, cal=CAL):
    """Run one ring collective alone; return (results, stats, network)."""
    env = simpy.Environment()
    network = Network(env, GRAPH, cal)
    process = env.process(RING_COLLECTIVES[collective](env, network, list(gpus), buffers,
                                                       nbytes, elem_bytes))
    env.run()
    results, stats = process.value
    return results, stats, network


def integer_buffers(n, shape, dtype=np.float64, seed=0):
    """Rank r's buffer: small integers, so every summation order is exact."""
    rng = np.random.default_rng(seed)
    return [rng.integers(-8, 9, size=shape).astype(dtype) for _ in range(n)]  # n x shape


def test_all_reduce_equals_the_direct_sum_bit_for_bit():
    buffers = integer_buffers(8, (3, 5, 7), np.float32)  # 8 x (3, 5, 7): 105 elements, 105 % 8 = 1
    results, stats, _ = run_ring(ALL_REDUCE, range(8), buffers, 105 * 2)
    expected = np.sum(np.stack(buffers), axis=0)  # (3, 5, 7)
    for result in results:
        assert result.shape == (3, 5, 7) and result.dtype == np.float32
        assert np.array_equal(result, expected)
    assert stats.steps == 2 * (8 - 1)


def test_rank_r_filled_with_r_sums_to_n_choose_2():
    n = 6
    buffers = [np.full(12, float(r)) for r in range(n)]  # n x (12,)
    results, _, _ = run_ring(ALL_REDUCE, range(n), buffers, 12 * 8, elem_bytes=8)
    assert all(np.array_equal(r, np.full(12, n * (n - 1) / 2)) for r in results)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 16), count=st.integers(0, 45), seed=st.integers(0, 2**16))
def test_ring_results_are_exact_for_any_group_and_size(n, count, seed):
    buffers = integer_buffers(n, (count,), seed=seed)  # n x (count,)
    total = np.sum(np.stack(buffers), axis=0)  # (count,)
    offsets, counts = chunk_offsets(chunk_counts(count, n)), chunk_counts(count, n)
    gpus = range(n)
    reduced, _, _ = run_ring(REDUCE_SCATTER, gpus, buffers, count * 2)
    for rank in range(n):
        assert np.array_equal(reduced[rank], total[offsets[rank]:offsets[rank] + counts[rank]])
    chunks = [b[offsets[r]:offsets[r] + counts[r]] for r, b in enumerate(buffers)]
    gathered, _, _ = run_ring(ALL_GATHER, gpus, chunks, count * 2)
    assert all(np.array_equal(g, np.concatenate(chunks)) for g in gathered)
    summed, _, _ = run_ring(ALL_REDUCE, gpus, buffers, count * 2)
    assert all(np.array_equal(s, total) for s in summed)


def test_bytes_per_rank_follow_the_ring_volumes_exactly():
    n, nbytes = 8, 8 * 1024 * 2  # S divisible by n
    _, ar, network = run_ring(ALL_REDUCE, range(n), None, nbytes)
    _, rs, _ = run_ring(REDUCE_SCATTER, range(n), None, nbytes)
    _, ag, _ = run_ring(ALL_GATHER, range(n), None, nbytes)
    # docs/MODEL.md#collectives: all-reduce 2(n-1)/n*S per rank, RS and AG (n-1)/n*S each.
    assert ar.bytes_sent == (2 * (n - 1) * nbytes // n,) * n
    assert rs.bytes_sent == ag.bytes_sent == ((n - 1) * nbytes // n,) * n
    assert ar.bytes_sent == tuple(a + b for a, b in zip(rs.bytes_sent, ag.bytes_sent))
    assert ar.bytes_received == ar.bytes_sent
    # the links carry each data byte 1/fraction times over (LL's flags, fewer NCCL channels:
    # engine/nccl_group.wire_bytes); ring/Simple on every channel carries it once
    choice = nccl_choice(ALL_REDUCE, network.graph, list(range(n)), nbytes, network.calibration,
                         "ring")
    assert (choice.algorithm, choice.protocol) == ("ring", "LL") and choice.bandwidth_fraction < 1
    assert [network.bytes_sent[g] for g in range(n)] == pytest.approx(
        [b / choice.bandwidth_fraction for b in ar.bytes_sent], rel=1e-12)


def test_uneven_chunks_each_rank_sends_all_but_the_chunks_it_keeps():
    n, count = 5, 23  # chunks 5, 5, 5, 4, 4 elements
    chunk_bytes = [c * 2 for c in chunk_counts(count, n)]
    _, rs, _ = run_ring(REDUCE_SCATTER, range(n), None, count * 2)
    _, ag, _ = run_ring(ALL_GATHER, range(n), None, count * 2)
    # RS: rank i never sends chunk i (it ends there); AG: rank i never sends chunk i+1.
    assert list(rs.bytes_sent) == [count * 2 - chunk_bytes[i] for i in range(n)]
    assert list(ag.bytes_sent) == [count * 2 - chunk_bytes[(i + 1) % n] for i in range(n)]


def test_plan_all_reduce_is_reduce_scatter_then_all_gather():
    for n in (1, 2, 5, 8):
        assert STEPS[ALL_REDUCE](n) == STEPS[REDUCE_SCATTER](n) + STEPS[ALL_GATHER](n)
        assert len(STEPS[REDUCE_SCATTER](n)) == len(STEPS[ALL_GATHER](n)) == n - 1


@pytest.mark.parametrize("collective", [REDUCE_SCATTER, ALL_GATHER, ALL_REDUCE])
def test_plan_holdings_end_where_the_collective_says(collective):
    n = 6
    holdings = initial_holdings(collective, n)
    for step in STEPS[collective](n):
        holdings = apply_step(holdings, step)
    everyone = frozenset(range(n))
    if collective == REDUCE_SCATTER:
        assert all(holdings[r][r] == everyone for r in range(n))
    elif collective == ALL_GATHER:
        assert all(holdings[r][c] == {c} for r in range(n) for c in range(n))
    else:
        assert all(h == everyone for row in holdings for h in row)


@pytest.mark.parametrize("gpus", [range(8), range(16)])
@pytest.mark.parametrize("nbytes", [8, 1 << 20, 256 << 20])
def test_all_reduce_time_is_reduce_scatter_time_plus_all_gather_time(gpus, nbytes):
    # at one protocol (NCCL_PROTO=Simple) the all-reduce is the two phases' steps, paying
    # NCCL's base latency (8.4 us, tuning.cc) once where RS and AG pay it once each
    simple = LinkCalibration(nccl_proto="Simple")
    _, ar, _ = run_ring(ALL_REDUCE, gpus, None, nbytes, cal=simple)
    _, rs, _ = run_ring(REDUCE_SCATTER, gpus, None, nbytes, cal=simple)
    _, ag, _ = run_ring(ALL_GATHER, gpus, None, nbytes, cal=simple)
    assert ar.protocol == rs.protocol == ag.protocol == "Simple"
    assert ar.time_s + 8.4e-6 == pytest.approx(rs.time_s + ag.time_s, rel=0.01)


def test_large_all_reduce_on_one_node_runs_at_achieved_nvlink_speed():
    n, nbytes = 8, 256 << 20
    _, stats, _ = run_ring(ALL_REDUCE, range(n), None, nbytes)
    busbw = busbw_GBps(ALL_REDUCE, n, nbytes, stats.time_s) * 1e9
    # NCCL's ring/Simple base latency (8.4 us, tuning.cc), then per step: NCCL's ring/Simple
    # NVLink step latency (3.4 us, tuning.cc hwLatencies) + S/n bytes at the achieved NVLink rate.
    assert (stats.protocol, stats.nchannels) == ("Simple", 24)
    expected_s = 8.4e-6 + 2 * (n - 1) * (3.4e-6 + nbytes / n / NVLINK_BPS)
    assert stats.time_s == pytest.approx(expected_s, rel=1e-9)
    assert 0.97 * NVLINK_BPS < busbw <= NVLINK_BPS  # the 56 us of latency: 2.7% of 2.1 ms


def test_ring_across_nodes_is_bound_by_all_eight_nics():
    n, nbytes = 16, 256 << 20
    _, stats, _ = run_ring(ALL_REDUCE, range(n), None, nbytes)
    busbw = busbw_GBps(ALL_REDUCE, n, nbytes, stats.time_s) * 1e9
    # 8 channels, one per rail: each NIC carries one channel's slice S/8 (NCCL per-rail rings),
    # 30 steps of S/16/8 at the NIC's achieved rate after ring/Simple's base latency (8.4 us)
    # and NCCL's ring latency (tuning.cc: 28 NVLink steps at max(3.4, 3 x 2.0 network
    # overhead) + 2 node crossings at 14 us = 196 us, 7% of the time)
    expected_s = (8.4 + 28 * 6.0 + 2 * 14.0) * 1e-6 + 30 * nbytes / n / 8 / IB_BPS
    assert stats.time_s == pytest.approx(expected_s, rel=1e-9)
    assert 0.9 * 8 * IB_BPS < busbw <= 8 * IB_BPS
    assert len(stats.channels) == 8


def test_tiny_messages_are_latency_bound():
    n = 16
    _, stats, _ = run_ring(ALL_REDUCE, range(n), None, 8)
    # NCCL runs it with LL (tuning.cc): base 6.6 us, then NCCL's ring latency on the default
    # links, each node crossing paid once per phase as the chunks travel: 28 NVLink steps at
    # max(0.6, 2.0 network post overhead) us + 2 crossings at 2.7 us (not 30 steps at the
    # slowest hop's); the 8 bytes add under 1%
    assert stats.protocol == "LL"
    assert stats.time_s == pytest.approx((6.6 + 28 * 2.0 + 2 * 2.7) * 1e-6, rel=0.01)
    assert busbw_GBps(ALL_REDUCE, n, 8, stats.time_s) * 1e9 < 1e-4 * IB_BPS


def test_meta_mode_moves_the_same_bytes_in_the_same_time_as_numeric():
    buffers = integer_buffers(4, (1000,))  # 4 x (1000,)
    _, numeric, _ = run_ring(ALL_REDUCE, [0, 1, 8, 9], buffers, 2000)
    _, meta, _ = run_ring(ALL_REDUCE, [0, 1, 8, 9], None, 2000)
    assert (numeric.time_s, numeric.bytes_sent) == (meta.time_s, meta.bytes_sent)


def test_a_group_of_one_is_immediate_and_returns_its_own_data():
    buffer = np.arange(6.0).reshape(2, 3)  # (2, 3)
    results, stats, _ = run_ring(ALL_REDUCE, [3], [buffer], 12)
    assert np.array_equal(results[0], buffer) and results[0] is not buffer
    assert (stats.steps, stats.time_s, stats.bytes_sent) == (0, 0.0, (0,))


def test_inconsistent_inputs_are_rejected():
    with pytest.raises(ValueError, match="whole number"):
        run_ring(ALL_REDUCE, range(2), None, 7)
    with pytest.raises(ValueError, match="every rank"):
        run_ring(ALL_REDUCE, range(2), [np.zeros(4), None], 8)
    with pytest.raises(ValueError, match="elements"):
        run_ring(REDUCE_SCATTER, range(2), [np.zeros(4), np.zeros(4)], 10)
    with pytest.raises(ValueError, match="contributes"):
        run_ring(ALL_GATHER, range(2), [np.zeros(3), np.zeros(3)], 8)


def test_ring_functions_are_usable_with_yield_from():
    env = simpy.Environment()
    network = Network(env, GRAPH, CAL)
    out = {}

    def program():
        reduced, _ = yield from ring_reduce_scatter(env, network, [0, 1], [np.ones(4)] * 2, 8)
        gathered, _ = yield from ring_all_gather(env, network, [0, 1], reduced, 8)
        summed, _ = yield from ring_all_reduce(env, network, [0, 1], [np.ones(4)] * 2, 8)
        out["equal"] = all(np.array_equal(g, s) for g, s in zip(gathered, summed))

    env.process(program())
    env.run()
    assert out["equal"]
