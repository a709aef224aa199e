"""Ring attention's timeline on the links: CP = 2 forward and backward worked by hand."""

import pytest
import simpy

from simsp.cluster.topology import build_topology
from simsp.scenario.config import Cluster
from simsp.engine.memory import Ledger
from simsp.engine.network import Network
from simsp.hardware.constants import LinkCalibration
from simsp.training.context_parallel.ring import CpRing, exchange_bytes, run_ring

CLUSTER = Cluster(nodes=1)
CAL = LinkCalibration()
NVLINK_BPS = CLUSTER.nvlink_bandwidth_GBps * 1e9 * CAL.nvlink_efficiency
NVLINK_LATENCY_S = CLUSTER.nvlink_latency_us * 1e-6
KV_BYTES = 8_000_000


def _run(cp, forward_s, backward_s, gpus=None):
    env = simpy.Environment()
    network = Network(env, build_topology(CLUSTER), CAL)
    ledgers = {r: Ledger(r, 10**12, clock=lambda: env.now) for r in range(cp)}
    ring = CpRing(env, network, gpus or tuple(range(cp)), KV_BYTES, ledgers)
    return run_ring(env, ring, forward_s, backward_s), network, ledgers


@pytest.mark.parametrize("compute_s", [10e-6, 400e-6])  # transfer exposed / hidden
def test_cp2_forward_and_backward_by_hand(compute_s):
    t = NVLINK_LATENCY_S + KV_BYTES / NVLINK_BPS  # one K/V block (or dK/dV) over NVLink
    f0, f1 = compute_s, 0.5 * compute_s  # block times of steps 0 and 1
    b0, b1 = 2 * compute_s, 1.5 * compute_s
    timeline, network, ledgers = _run(2, [[f0, f1]] * 2, [[b0, b1]] * 2)
    forward_end = max(f0, t) + f1  # step 1 waits for the K/V sent during step 0
    backward_step0 = forward_end + max(b0, t)  # K/V to rank r - 1 under the block backward
    backward_end = backward_step0 + max(b1, t)  # dK/dV back to its owner under step 1
    for rank in range(2):
        assert abs(timeline.ends[("forward", rank)] - forward_end) < 1e-12
        assert abs(timeline.compute[("forward", rank, 1)][0] - max(f0, t)) < 1e-12
        assert abs(timeline.ends[("backward", rank)] - backward_end) < 1e-12
    sent = sorted((tr.src, tr.dst, tr.nbytes, tr.start_s) for tr in network.transfers)
    assert sent == sorted([(0, 1, KV_BYTES, 0.0), (1, 0, KV_BYTES, 0.0)]
                          + [(s, d, KV_BYTES, forward_end) for s, d in ((0, 1), (1, 0))]
                          + [(s, d, KV_BYTES, backward_step0) for s, d in ((0, 1), (1, 0))])
    peaks = ledgers[0].summary().peak_by_category
    assert peaks["communication"] == 4 * KV_BYTES  # the backward's two (K/V, dK/dV) buffers
    assert peaks["activations"] == KV_BYTES  # rank r + 1's K/V, saved for backward
    log = [(e[1], e[3]) for e in ledgers[0].events]  # (key, signed bytes) in order
    assert log[:2] == [("cp_kv_0", KV_BYTES), ("cp_kv_1", KV_BYTES)]  # 2 K/V in forward
    assert ledgers[0].total == 0


def test_transfer_waits_for_the_later_rank_to_post():
    t = NVLINK_LATENCY_S + KV_BYTES / NVLINK_BPS
    late = 300e-6  # rank 1's step 0 block is slow: it posts step 1 only at `late`
    fast = [10e-6] * 3
    _, network, _ = _run(3, [fast, [late, 10e-6, 10e-6], fast], [[1e-6] * 3] * 3)
    step1 = {(tr.src, tr.dst): tr.start_s for tr in network.transfers
             if "forward step 1" in tr.label}
    assert abs(step1[(0, 1)] - late) < 1e-12  # rank 0 posted at t, waits for its receiver
    assert abs(step1[(1, 2)] - late) < 1e-12
    assert abs(step1[(2, 0)] - t) < 1e-12  # ranks 2 and 0 both posted when step 0's K/V landed


def test_exchange_sizes_follow_te():
    assert [exchange_bytes("forward", i, 4, 1) for i in range(4)] == [1, 1, 1, 0]
    assert [exchange_bytes("backward", i, 4, 1) for i in range(4)] == [1, 2, 2, 1]
    assert exchange_bytes("backward", 0, 1, 1) == 0


def test_ulysses_cp2_by_hand():
    from simsp.training.context_parallel.a2a import CpAllToAll
    env = simpy.Environment()
    network = Network(env, build_topology(CLUSTER), CAL)
    qkv, out = 3 * KV_BYTES, KV_BYTES
    group = CpAllToAll(env, network, (0, 1), qkv, out)
    attn, attn_bwd = 50e-6, 120e-6
    for rank in range(2):
        env.process(group.run_rank(rank, attn, attn_bwd))
    env.run()
    piece = lambda n: NVLINK_LATENCY_S + (n / 2) / NVLINK_BPS  # noqa: E731  half to the peer
    forward_end = piece(qkv) + attn + piece(out)
    backward_end = forward_end + piece(out) + attn_bwd + piece(qkv)
    for rank in range(2):
        assert abs(group.ends[("forward", rank)] - forward_end) < 1e-12
        assert abs(group.ends[("backward", rank)] - backward_end) < 1e-12
    assert len(network.transfers) == 8  # 4 exchanges x 2 directions


def test_ulysses_cp4_pieces_share_the_sender_link():
    from simsp.training.context_parallel.a2a import CpAllToAll
    env = simpy.Environment()
    network = Network(env, build_topology(CLUSTER), CAL)
    group = CpAllToAll(env, network, (0, 1, 2, 3), 4 * KV_BYTES, 4 * KV_BYTES)
    for rank in range(4):
        env.process(group.run_rank(rank, 0.0, 0.0))
    env.run()
    # each rank sends 3 pieces of KV_BYTES at once over its one NVLink: 3x one piece's drain
    one = NVLINK_LATENCY_S + 3 * KV_BYTES / NVLINK_BPS
    assert abs(group.ends[("forward", 0)] - 2 * one) < 1e-12


def test_block_seconds_are_the_flash_gemms_of_half_blocks_after_the_diagonal():
    from simsp.hardware.costmodel import active_calibration, gemm_efficiency
    from simsp.training.context_parallel.ring import block_seconds
    cal = active_calibration()
    b, heads, n, d = 1, 8, 4096, 128
    half = cal.launch_overhead_s + 2 * b * heads * n * (n // 2) * d / (
        cal.peak_flops * gemm_efficiency(n, d, n // 2))
    whole = cal.launch_overhead_s + 2 * b * heads * n * n * d / (
        cal.peak_flops * gemm_efficiency(n, d, n))
    assert abs(block_seconds(b, heads, n, d, True, False) - 2 * whole) < 1e-15
    assert abs(block_seconds(b, heads, n, d, False, False) - 2 * half) < 1e-15
    assert abs(block_seconds(b, heads, n, d, False, True) - 5 * half) < 1e-15
    assert abs(block_seconds(b, heads, n, d, True, True) - 5 * whole) < 1e-15


def test_the_diagonal_block_is_forward_first_and_backward_last():
    """TE's AttnFuncWithCPAndKVP2P: forward `i == 0`, backward (reversed) `i == cp_size - 1`."""
    from simsp.training.context_parallel.ring_kernels import source_rank
    from simsp.report.lessons.ring_attention import held_rank
    from simsp.training.context_parallel.ring import diagonal_step
    assert [diagonal_step("forward", cp) for cp in (1, 2, 4)] == [0, 0, 0]
    assert [diagonal_step("backward", cp) for cp in (1, 2, 4)] == [0, 1, 3]
    assert all(source_rank(r, diagonal_step("forward", 4), 4) == r for r in range(4))
    assert all(held_rank("backward", r, diagonal_step("backward", 4), 4) == r for r in range(4))


def test_cp4_exposed_transfers_chain_step_by_step():
    t = NVLINK_LATENCY_S + KV_BYTES / NVLINK_BPS  # K/V alone (and dK/dV alone)
    t2 = NVLINK_LATENCY_S + 2 * KV_BYTES / NVLINK_BPS  # K/V with dK/dV, steps 1..cp-2
    f, b = 5e-6, 8e-6  # block times shorter than any transfer: every transfer exposed
    timeline, _, _ = _run(4, [[f] * 4] * 4, [[b] * 4] * 4)
    forward_end = 3 * t + f
    backward_end = forward_end + t + 2 * t2 + t
    for rank in range(4):
        assert abs(timeline.ends[("forward", rank)] - forward_end) < 1e-12
        assert abs(timeline.ends[("backward", rank)] - backward_end) < 1e-12
