"""The closed-form ring time against the stepwise ring, per link, whichever tier binds: on 16
GPUs of two nodes NCCL's 8 rail channels put 8 hops on every GPU's NVLink port (7 inside the
node, 1 relayed to the NIC by PXN), so fast InfiniBand leaves NVLink's 8-way sharing as the
bound and slow InfiniBand leaves the NIC. Dropping the sharing from ring_timing fails here."""

import pytest
import simpy

from simsp.cluster.topology import build_topology
from simsp.config import Cluster
from simsp.engine.collectives import RING_COLLECTIVES
from simsp.engine.nccl_group import nccl_choice
from simsp.engine.nccl_tuning import RING
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
    """With no link latency the 8 channels stay in step, so each step lasts 8 slices over one
    port (NVLink-bound) or one slice over one NIC (IB-bound): closed form and stepwise agree
    to rounding, both at NCCL's protocol (its base latency, its bandwidth fraction)."""
    graph = build_topology(Cluster(nodes=2, ib_bandwidth_GBps=ib_GBps, nvlink_latency_us=0.0,
                                   ib_latency_us=0.0))
    gpus, nbytes = list(range(16)), 64 * 2 ** 20
    closed = collective_time(collective, graph, gpus, nbytes, CAL)
    assert closed == pytest.approx(stepwise_time(graph, collective, gpus, nbytes), rel=1e-9)
    choice = nccl_choice(collective, graph, gpus, nbytes, CAL, RING)
    steps = (2 if collective == "all_reduce" else 1) * 15
    port_bound = choice.base_latency_s + steps * (nbytes / 16) / (
        NVLINK_Bps * choice.bandwidth_fraction)  # 8 slices of S/128 through one port a step
    if bound == "nvlink":
        assert closed == pytest.approx(port_bound, rel=1e-9)
    else:
        assert closed > 1.5 * port_bound
