"""Small-message latency on an uncalibrated cluster is NCCL's own (NVIDIA/nccl v2.30.7
src/graph/tuning.cc ncclTopoTuneModel: baseLatencies + steps x hwLatencies; the per-step figures
are typed here from tuning.cc, not imported from simsp), per algorithm, protocol and collective,
one node and across nodes; calibrated link latencies scale the steps of their tier."""

from dataclasses import replace

import pytest
import simpy

from simsp.cluster.topology import build_topology
from simsp.engine.collectives.ring import RING_COLLECTIVES
from simsp.engine.collectives.ring_alone import alone_time
from simsp.engine.collectives.ring_timing import collective_time
from simsp.engine.network import Network
from simsp.hardware.constants import LinkCalibration
from simsp.scenario.config import Cluster

# tuning.cc baseLatencies (us): [tree, ring] x [LL, LL128, Simple]
BASE = {("tree", "LL"): 6.8, ("tree", "LL128"): 14.0, ("tree", "Simple"): 8.4,
        ("ring", "LL"): 6.6, ("ring", "LL128"): 14.0, ("ring", "Simple"): 8.4}
# tuning.cc hwLatencies (us per step): NVLink and NET rows
NVLINK = {("tree", "LL"): 0.6, ("tree", "LL128"): 1.25, ("tree", "Simple"): 4.0,
          ("ring", "LL"): 0.6, ("ring", "LL128"): 1.9, ("ring", "Simple"): 3.4}
NET = {("tree", "LL"): 5.0, ("tree", "LL128"): 8.5, ("tree", "Simple"): 14.0,
       ("ring", "LL"): 2.7, ("ring", "LL128"): 4.0, ("ring", "Simple"): 14.0}
NET_OVERHEAD = 2.0  # tuning.cc getNetOverhead, x86 AMD; a multi-node ring's intra steps pay it
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


def latency_us(collective, algo, proto, nodes, per_node=8):
    """tuning.cc's latency of a collective over nodes x per_node ranks, worked by hand: a tree
    pays 2((ppn-1) intra + floor(log2 nodes) inter) steps; a ring 2(n-1) steps for an
    all-reduce (n-1 for RS / AG), 2(nodes-1) (nodes-1) of them on the network."""
    ranks = nodes * per_node
    if algo == "tree":
        return BASE[algo, proto] + 2 * ((per_node - 1) * NVLINK[algo, proto]
                                        + (nodes.bit_length() - 1) * NET[algo, proto])
    intra = NVLINK[algo, proto]
    if nodes > 1:
        intra = max(intra, NET_OVERHEAD * (3 if proto == "Simple" else 1))
    net = NET["tree" if per_node == 1 else algo, proto]  # one rank per node: the tree's
    phases = 2 if collective == "all_reduce" else 1
    steps, inter_steps = phases * (ranks - 1), phases * (nodes - 1)
    return BASE[algo, proto] + (steps - inter_steps) * intra + inter_steps * net


def setup(algo, proto, nodes, per_node=8, cluster=Cluster()):
    """(graph, gpus, calibration) of the whole cluster with NCCL_ALGO / NCCL_PROTO forced."""
    cluster = replace(cluster, nodes=nodes, gpus_per_node=per_node, nccl_algo=algo,
                      nccl_proto=proto)
    return (build_topology(cluster), list(range(nodes * per_node)),
            LinkCalibration.from_cluster(cluster))


def stepwise_us(collective, graph, gpus, calibration, nbytes=0):
    """The ring run step by step over the network (meta mode), in us."""
    env = simpy.Environment()
    process = env.process(RING_COLLECTIVES[collective](env, Network(env, graph, calibration),
                                                       gpus, None, nbytes))
    env.run()
    return process.value[1].time_s * 1e6


@pytest.mark.parametrize("algo, proto", sorted(BASE))
@pytest.mark.parametrize("nodes", [1, 2, 4, 16])
def test_all_reduce_latency_is_nccls(algo, proto, nodes):
    """No data: the closed form and the timing of a ring alone cost exactly NCCL's latency."""
    graph, gpus, calibration = setup(algo, proto, nodes)
    expected = latency_us("all_reduce", algo, proto, nodes)
    assert collective_time("all_reduce", graph, gpus, 0, calibration) * 1e6 == pytest.approx(
        expected, rel=1e-12)
    assert alone_time("all_reduce", graph, gpus, 0, calibration) * 1e6 == pytest.approx(
        expected, rel=1e-12)


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("proto", ["LL", "LL128", "Simple"])
@pytest.mark.parametrize("nodes, per_node", [(1, 8), (2, 8), (4, 1)])
def test_ring_latency_is_nccls_step_by_step(collective, proto, nodes, per_node):
    """The stepwise ring pays the same: NCCL's latency, node crossings once per phase each
    (a two-node ring does not pay the network's latency on all of its steps)."""
    graph, gpus, calibration = setup("ring", proto, nodes, per_node)
    expected = latency_us(collective, "ring", proto, nodes, per_node)
    assert stepwise_us(collective, graph, gpus, calibration) == pytest.approx(expected,
                                                                              rel=1e-12)
    assert collective_time(collective, graph, gpus, 0, calibration) * 1e6 == pytest.approx(
        expected, rel=1e-12)


def test_worked_examples():
    """By hand: one node ring/LL 6.6 + 14 x 0.6 = 15.0 us; 2 nodes ring/Simple all-reduce
    8.4 + 28 x max(3.4, 3 x 2.0) + 2 x 14 = 204.4 us (step-synchronous, every step at the
    network's 14 us: 8.4 + 30 x 14 = 428.4); 16 nodes tree/LL 6.8 + 2 (7 x 0.6 + 4 x 5.0) =
    55.2 us (nccl-tests on 128 A100s measured 58 us)."""
    cases = [("ring", "LL", 1, 15.0), ("ring", "Simple", 2, 204.4), ("tree", "LL", 16, 55.2)]
    for algo, proto, nodes, expected in cases:
        graph, gpus, calibration = setup(algo, proto, nodes)
        assert collective_time("all_reduce", graph, gpus, 0, calibration) * 1e6 == (
            pytest.approx(expected, rel=1e-12))


@pytest.mark.parametrize("nbytes", [4, 64, 1024])
def test_small_sizes_add_the_data_at_the_choices_rate(nbytes):
    """One node, ring/LL, a few small sizes: NCCL's latency plus 14 steps of the largest chunk
    slice (ceil(nbytes / 2 / 8) bf16 elements) at the LL rate on one channel. By hand from
    tuning.cc: ring LL busBw on one node = min(llMaxBw 87.7, 0.5 x 12 x 20) = 87.7 GB/s of
    ring/Simple's 240; enqueue.cc keeps 1 of 24 channels (bytes < 2 x 512 x 8 x 8), busBw
    min(87.7, 0.5 x 0.5 x 20) = 5 GB/s: the link's 300 GB/s x 0.78 x 5 / 240 = 4.875 GB/s."""
    graph, gpus, calibration = setup("ring", "LL", 1)
    chunk_bytes = 2 * -(-nbytes // 2 // 8)
    expected = 15.0 + 14 * chunk_bytes / 4.875e9 * 1e6
    assert collective_time("all_reduce", graph, gpus, nbytes, calibration) * 1e6 == (
        pytest.approx(expected, rel=1e-9))


def test_calibrated_links_scale_their_tiers_steps():
    """NVLink hops at twice the default latency double every intra-node step, not the base.
    With InfiniBand links at three times too (2 nodes, ring/LL all-reduce) a node crossing is
    a PXN route, NVLink to the relay (2 -> 4 us) then two IB links (2 -> 6 us), so its step
    scales by 10 / 4: 6.6 + 28 x 2 x 2.0 + 2 x 2.5 x 2.7 = 132.1 us."""
    slow = replace(Cluster(), nvlink_latency_us=2 * Cluster().nvlink_latency_us)
    graph, gpus, calibration = setup("ring", "Simple", 1, cluster=slow)
    expected = BASE["ring", "Simple"] + 2 * 14 * NVLINK["ring", "Simple"]
    assert collective_time("all_reduce", graph, gpus, 0, calibration) * 1e6 == pytest.approx(
        expected, rel=1e-12)
    both = replace(slow, ib_latency_us=3 * Cluster().ib_latency_us)
    graph, gpus, calibration = setup("ring", "LL", 2, cluster=both)
    assert collective_time("all_reduce", graph, gpus, 0, calibration) * 1e6 == pytest.approx(
        132.1, rel=1e-12)
