"""The closed-form ring time against the stepwise ring, per link, whichever tier binds: on 16
GPUs of two nodes NCCL's 8 rail channels put 8 hops on every GPU's NVLink port (7 inside the
node, 1 relayed to the NIC by PXN), so fast InfiniBand leaves NVLink's 8-way sharing as the
bound and slow InfiniBand leaves the NIC. Dropping the sharing from ring_timing fails here."""

import pytest
import simpy

from simsp.cluster.topology import build_topology
from simsp.config import Cluster
from simsp.engine.collectives import RING_COLLECTIVES
from simsp.engine.network import Network
from simsp.engine.ring_plan import COLLECTIVES
from simsp.engine.ring_timing import collective_time
from simsp.hardware import LinkCalibration

CAL = LinkCalibration()
NVLINK_Bps = 300e9 * CAL.nvlink_efficiency  # one GPU's NVLink port, achieved


def stepwise_time(graph, collective, gpus, nbytes):
    """The ring run step by step over the fair-shared links, alone."""
    env = simpy.Environment()
    ring = RING_COLLECTIVES[collective](env, Network(env, graph, CAL), gpus, None, nbytes)
    process = env.process(ring)
    env.run()
    return process.value[1].time_s


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("ib_GBps,bound", [(100.0, "nvlink"), (12.5, "ib")])
def test_closed_form_equals_stepwise_whichever_tier_binds(collective, ib_GBps, bound):
    """Equal hop latencies on every shared port (1 us through the NVSwitch, IB latency 0) keep
    the 8 channels in step, so each step lasts 8 slices over one port (NVLink-bound) or one
    slice over one NIC (IB-bound): closed form and stepwise agree to rounding."""
    graph = build_topology(Cluster(nodes=2, ib_bandwidth_GBps=ib_GBps, nvlink_latency_us=1.0,
                                   ib_latency_us=0.0))
    gpus, nbytes = list(range(16)), 64 * 2 ** 20
    closed = collective_time(collective, graph, gpus, nbytes, CAL)
    assert closed == pytest.approx(stepwise_time(graph, collective, gpus, nbytes), rel=1e-9)
    steps = (2 if collective == "all_reduce" else 1) * 15
    port_bound = steps * (nbytes / 16) / NVLINK_Bps + steps * 1e-6  # 8 slices of S/128 a step
    if bound == "nvlink":
        assert closed == pytest.approx(port_bound, rel=1e-9)
    else:
        assert closed > 1.5 * port_bound


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_one_plan_drives_both_paths_with_its_protocol(collective):
    """A plan's per-step latency and bandwidth fraction reach the stepwise ring and the closed
    form alike; on one 8-GPU node (one channel, no shared port) each step is the NVSwitch hop's
    2 us + the step latency + a chunk over half the port: hand-worked."""
    from simsp.engine.collective_plan import plan_collective

    graph = build_topology(Cluster(nodes=1))
    gpus, nbytes = list(range(8)), 8 * 2 ** 20
    plan = plan_collective(collective, gpus, nbytes, 8, 2, step_latency_s=5e-6,
                           bandwidth_fraction=0.5)
    env = simpy.Environment()
    ring = RING_COLLECTIVES[collective](env, Network(env, graph, CAL), gpus, None, nbytes,
                                        plan=plan)
    process = env.process(ring)
    env.run()
    hand = plan.steps * (2e-6 + 5e-6 + (nbytes / 8) / (0.5 * NVLINK_Bps))
    assert process.value[1].time_s == pytest.approx(hand, rel=1e-9)
    assert collective_time(collective, graph, gpus, nbytes, CAL, plan=plan) == \
        pytest.approx(hand, rel=1e-9)
