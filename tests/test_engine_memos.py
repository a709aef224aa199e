"""The engine's memos of pure functions (docs/PERFORMANCE.md, "Per event and per op") give what
working the value out afresh gives, for every key they are asked: ring steps against the
textbook schedule, a ring channel's step latency against NCCL's per-step latencies on default
links, and a rank's kernel times against the cost model called for each kernel."""

import pytest
import simpy

from simsp.cluster.topology import build_topology
from simsp.engine.collectives.nccl_group import nccl_choice
from simsp.engine.collectives.nccl_tuning import RING
from simsp.engine.collectives.ring import channel_step_latency_s
from simsp.engine.collectives.ring_plan import (all_gather_steps, channel_rings,
                                                reduce_scatter_steps)
from simsp.engine.memory import Ledger
from simsp.engine.network import Network
from simsp.hardware.constants import LinkCalibration
from simsp.hardware.costmodel import kernel_time
from simsp.model.rank import Rank, TPGroup
from simsp.scenario.config import Cluster


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_ring_steps_are_the_textbook_schedule_and_every_call_a_list_of_its_own(n):
    """Reduce-scatter step k moves chunk c from rank (c+k+1) % n to (c+k+2) % n, all-gather
    from (c+k) % n to (c+k+1) % n (ring_plan.py's docstring); a caller's list is its own."""
    for steps, first_hop in ((reduce_scatter_steps(n), 1), (all_gather_steps(n), 0)):
        assert len(steps) == n - 1
        for k, step in enumerate(steps):
            moves = sorted(((c + k + first_hop) % n, (c + k + first_hop + 1) % n, c)
                           for c in range(n))
            assert [(s.src, s.dst, s.chunk) for s in step.sends] == moves
    reduce_scatter_steps(n).append(None)
    assert len(reduce_scatter_steps(n)) == n - 1


def test_channel_step_latency_is_each_choices_own_on_one_network():
    """On default links with no transfer overhead every hop inside a node costs NCCL's
    intra-node step and every node-crossing hop its inter-node step (nccl_group.py), and a
    step pays the ring's hops but its slowest, over n - 1 (pipelined_step_latency_s): 16 GPUs
    on 2 nodes, each channel 14 NVLink hops and 2 crossings. Two protocols' choices on the
    same network and channels each get their own."""
    calibration = LinkCalibration(transfer_overhead_s=0.0, nccl_algo="ring")
    graph = build_topology(Cluster(nodes=2))
    network = Network(simpy.Environment(), graph, calibration)
    gpus = list(range(16))
    choices = [nccl_choice("all_gather", graph, gpus, size, calibration, RING)
               for size in (2 ** 10, 2 ** 30)]  # LL at 1 KiB, Simple at 1 GiB
    assert choices[0].intra_step_s != choices[1].intra_step_s
    for _ in range(2):  # worked out, then recalled
        for choice in choices:
            expected = (14 * choice.intra_step_s + choice.inter_step_s) / 15
            for channel in channel_rings(gpus, 8):
                latency = channel_step_latency_s(network, gpus, channel, choice)
                assert latency == pytest.approx(expected, rel=1e-12)


def test_a_ranks_kernel_times_are_the_cost_models_for_each_kernel():
    """GEMMs of two shapes and a memory-bound kernel, each run twice: the compute stream is
    held for the cost model's time of each, called afresh, and busy seconds add up alike."""
    env = simpy.Environment()
    r = Rank(0, env, Ledger(0, 2 ** 40), TPGroup((0,), 0, False), mode="meta")
    kernels = [("gemm", 2 * 4096 * 12288 * 4608, 0, (4096, 12288, 4608)),
               ("gemm", 2 * 2048 * 4608 * 12288, 0, (2048, 4608, 12288)),
               ("elementwise", 0, 3 * 2 ** 20, None)] * 2

    def program():
        for kind, flops, nbytes, gemm in kernels:
            yield from r.compute("kernel", kind, flops, nbytes, gemm)

    env.process(program())
    env.run()
    seconds = [kernel_time(kind, flops, nbytes, gemm) for kind, flops, nbytes, gemm in kernels]
    assert seconds[0] != seconds[1]
    total = 0.0
    for s in seconds:  # the clock adds the holds one after another
        total += s
    assert env.now == total
    assert r.busy_s["gemm"] == pytest.approx(sum(seconds[:2]) * 2, rel=1e-15)
