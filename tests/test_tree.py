"""NCCL's tree all-reduce: a hand-worked pipelined timeline, exact sums, the 2-node advantage."""

import numpy as np
import pytest
import simpy
from hypothesis import given, settings, strategies as st

from simsp.cluster.topology import build_topology
from simsp.scenario.config import Cluster
from simsp.engine.network import Network
from simsp.engine.collectives.ring_timing import busbw_GBps
from simsp.engine.collectives.tree import SLOT_BYTES, tree_all_reduce, tree_channels
from simsp.hardware.constants import LinkCalibration

GRAPH = build_topology(Cluster(nodes=3))
IB_BPS = 25e9 * 0.9  # one HDR NIC at the default ib_efficiency
RAIL_HOP_S = 2 * 1e-6  # GPU -> leaf -> GPU on one rail: two IB edges of 1 us


def run_tree(gpus, buffers, nbytes, elem_bytes=4):
    env = simpy.Environment()
    process = env.process(tree_all_reduce(env, Network(env, GRAPH, LinkCalibration()),
                                          list(gpus), buffers, nbytes, elem_bytes))
    env.run()
    return process.value


def test_hand_worked_two_slot_pipeline_between_two_nodes():
    # gpu0 (node 0, root) and gpu8 (node 1), same rail. S = 2 slots of 512 KiB; x = slot/IB.
    # up: gpu8 sends slot 0 over [0, x], slot 1 over [x, 2x]; they arrive at x+L and 2x+L.
    # root: slot 0 reduced at x+L, sent down over [x+L, 2x+L]; slot 1 down over [2x+L, 3x+L].
    # gpu8 holds the last result slot at 3x + 2L.
    x = SLOT_BYTES / IB_BPS
    _, stats = run_tree([0, 8], None, 2 * SLOT_BYTES)
    assert stats.time_s == pytest.approx(3 * x + 2 * RAIL_HOP_S, rel=1e-12)
    assert stats.bytes_sent == (2 * SLOT_BYTES, 2 * SLOT_BYTES)


def test_two_nodes_use_both_trees_and_every_rail():
    channels = tree_channels(list(range(16)), 8)
    roots = [ch.parent.index(None) for ch in channels]
    assert [ch.rail for ch in channels] == list(range(8))
    assert roots == [c if c % 2 == 0 else 8 + c for c in range(8)]  # trees alternate roots


@settings(max_examples=25, deadline=None)
@given(gpus=st.sampled_from([(0, 8), (0, 1, 8, 9), (0, 8, 16), (2, 3, 4, 10, 11, 12, 18, 19, 20)]),
       count=st.integers(0, 50), seed=st.integers(0, 2**16))
def test_every_member_gets_the_exact_sum(gpus, count, seed):
    rng = np.random.default_rng(seed)
    buffers = [rng.integers(-8, 9, size=(count,)).astype(np.float64) for _ in gpus]  # (count,)
    results, _ = run_tree(gpus, buffers, count * 8, elem_bytes=8)
    total = np.sum(np.stack(buffers), axis=0)  # (count,)
    assert all(np.array_equal(r, total) for r in results)


def test_tree_on_two_nodes_beats_the_nics_busbw():
    # the tree puts S per node on the network (half up, half down per tree) where the ring puts
    # 2(n-1)/n S: its busbw exceeds 8 NICs x 22.5 GB/s (NCCL issues #812, #946)
    nbytes = 256 << 20
    _, stats = run_tree(range(16), None, nbytes)
    assert busbw_GBps("all_reduce", 16, nbytes, stats.time_s) * 1e9 > 8 * IB_BPS
