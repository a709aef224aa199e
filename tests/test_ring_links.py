"""The closed-form ring time against the stepwise ring, per link, whichever tier binds: on 16
GPUs of two nodes NCCL's 8 rail channels put 8 hops on every GPU's NVLink port (7 inside the
node, 1 relayed to the NIC by PXN), so fast InfiniBand leaves NVLink's 8-way sharing as the
bound and slow InfiniBand leaves the NIC. Dropping the sharing from ring_timing fails here."""

import pytest
import simpy

from simsp.cluster.topology import build_topology
from simsp.scenario.config import Cluster
from simsp.engine.collectives.ring import RING_COLLECTIVES
from simsp.engine.collectives.nccl_group import nccl_choice
from simsp.engine.collectives.nccl_tuning import RING
from simsp.engine.network import Network
from simsp.engine.collectives.ring_plan import COLLECTIVES
from simsp.engine.collectives.ring_timing import collective_time
from simsp.hardware.constants import LinkCalibration

# the ring forced (NCCL_ALGO=ring): on two nodes of 12.5 GB/s NICs NCCL's tree graph (bwIntra
# raised to 24 by the search's pass 2, bwInter 12) would win the all-reduce
CAL = LinkCalibration(nccl_algo="ring")
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


# ------------------------------------------------------------------------------------------
# The ring alone (engine/collectives/ring_alone.py): exact where the closed form is not
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("per_node,nodes,stride,ib_GBps,collective", [
    (8, 2, 1, 100.0, "all_reduce"),  # NVLink-bound: 8 hops of unequal latency on every port
    (8, 2, 1, 100.0, "all_gather"),
    (8, 4, 1, 12.5, "reduce_scatter"),  # NIC-bound
    (8, 2, 2, 100.0, "reduce_scatter"),  # half the GPUs of each node: relays are members
    (4, 3, 1, 100.0, "all_gather"),  # 4 GPUs per node; 2 MiB is no multiple of 12 x 4 slices
    (2, 4, 1, 25.0, "all_reduce"),  # 2 GPUs per node
])
def test_ring_alone_equals_stepwise_with_latency(per_node, nodes, stride, ib_GBps, collective):
    """With the links' own latencies (the PXN hop crosses NVLink and InfiniBand, an NVLink hop
    only NVLink), the ring alone is the stepwise ring: one node's piece of one channel where
    the ring is symmetric, the whole ring where not (4 x 3: unequal slices)."""
    from simsp.engine.collectives.ring_alone import alone_stats, node_segment

    graph = build_topology(Cluster(nodes=nodes, gpus_per_node=per_node,
                                   ib_bandwidth_GBps=ib_GBps))
    gpus, nbytes = list(range(0, per_node * nodes, stride)), 2 * 2 ** 20
    alone = alone_stats(collective, graph, gpus, nbytes, CAL)
    assert alone.time_s == pytest.approx(stepwise_time(graph, collective, gpus, nbytes),
                                         rel=1e-9)
    symmetric = node_segment(graph, gpus, CAL, collective, nbytes, 2) is not None
    assert symmetric == ((per_node, nodes) != (4, 3))


def test_one_member_per_node_has_no_node_piece():
    """A ring with one GPU on each of 4 nodes (Megatron-FSDP's DP group at TP 8) has no NVLink
    hop for a node's piece to stand on: no piece, the whole ring stepped instead (this raised
    IndexError)."""
    from simsp.engine.collectives.ring_alone import node_segment

    graph = build_topology(Cluster(nodes=4))
    assert node_segment(graph, [0, 8, 16, 24], CAL, "all_gather", 2 * 2 ** 20, 2) is None


def test_pipelined_latency_keeps_channels_sharing_a_port_in_step():
    """On 16 GPUs NVLink-bound (8 hops per NVLink port) every hop of a channel pays the ring's
    one pipelined step latency (NCCL's, docs/nccl.md), PXN relays included, so the channels
    stay in step and the closed form is the stepwise ring to rounding, every collective, 2 and
    4 nodes; both above the port's work: base + steps x 8 slices / port rate."""
    for nodes in (2, 4):
        graph = build_topology(Cluster(nodes=nodes, ib_bandwidth_GBps=100.0))
        gpus, nbytes = list(range(8 * nodes)), 64 * 2 ** 20
        for collective, steps in (("all_gather", 8 * nodes - 1), ("all_reduce", 16 * nodes - 2)):
            stepwise = stepwise_time(graph, collective, gpus, nbytes)
            closed = collective_time(collective, graph, gpus, nbytes, CAL)
            choice = nccl_choice(collective, graph, gpus, nbytes, CAL, RING)
            port_bound = choice.base_latency_s + steps * (nbytes / (8 * nodes)) / (
                NVLINK_Bps * choice.bandwidth_fraction)
            assert closed == pytest.approx(stepwise, rel=1e-12)
            assert port_bound < stepwise


@pytest.mark.parametrize("per_node,first,nodes,ib_GBps,collective", [
    (8, 18, 3, 100.0, "all_gather"),  # NVLink-bound; 18 -> 19 on a leaf, 19 -> 20 -> 18 spine
    (8, 18, 3, 12.5, "reduce_scatter"),  # NIC-bound
    (4, 18, 4, 100.0, "all_reduce"),  # 19 -> 20 and 21 -> 18 cross the spine
])
def test_one_channel_equals_stepwise_across_a_leaf_boundary(per_node, first, nodes, ib_GBps,
                                                             collective):
    """A ring across a leaf boundary (docs/shortcuts.md): its channels are alike, so channel 0's
    whole ring on each node's port (channel_segment) is the stepwise ring; with NCCL's pipelined
    step latency (docs/nccl.md) every hop of a channel pays the same latency, so the nodes are
    alike too and one node's piece (node_segment) is the stepwise ring as well."""
    from simsp.engine.collectives.ring_alone import (alone_stats, channel_segment, node_segment,
                                                      segment_time)

    cluster = Cluster(nodes=first + nodes, gpus_per_node=per_node, ib_bandwidth_GBps=ib_GBps)
    graph = build_topology(cluster, range(first, first + nodes))
    gpus = list(range(first * per_node, (first + nodes) * per_node))
    nbytes = 3 * 2 ** 21  # equal slices: 3 x 2^20 elements, a multiple of n x m
    stepwise = stepwise_time(graph, collective, gpus, nbytes)
    for segment_of in (node_segment, channel_segment):
        segment = segment_of(graph, gpus, CAL, collective, nbytes, 2)
        assert segment is not None
        end_s = segment_time(graph, CAL, collective, len(gpus), segment)
        assert end_s == pytest.approx(stepwise, rel=1e-9)
    alone = alone_stats(collective, graph, gpus, nbytes, CAL)
    assert alone.time_s == pytest.approx(stepwise, rel=1e-9)
