"""The fabric as data (hardware/fabric.py, cluster/topology.py): scalable units, oversubscribed
leaf uplinks, a core tier, and the shortcuts refusing what their proofs do not cover."""

import subprocess
import sys

import networkx as nx
import pytest

from simsp.cluster.topology import (CORE, SPINE, build_topology, gpu_name, leaf_name, placement,
                                    route,
                                    route_tier, spine_name)
from simsp.engine.collectives.ring_alone import alone_time, shares_a_link
from simsp.engine.fair_share import max_min_rates
from simsp.hardware.constants import LinkCalibration
from simsp.hardware.fabric import DEFAULT, Fabric
from simsp.hardware.cluster_hardware import fabric_of
from simsp.hardware.profiles import system_profile
from simsp.scenario.config import Cluster, Scenario, Parallel, Run
from simsp.shortcuts.check import Shortcuts

IB = 25e9  # bytes/s: the default HDR NIC


def _rates(graph, pairs):
    """Max-min rates of one flow per (src, dst) GPU pair over the graph's raw link speeds."""
    flows = {i: tuple(route(graph, gpu_name(s), gpu_name(d))) for i, (s, d) in enumerate(pairs)}
    capacity = {edge: graph.edges[edge]["bandwidth_Bps"] for edge in graph.edges}
    return max_min_rates(flows, capacity)


@pytest.mark.parametrize("ratio, per_flow", [(1.0, IB), (2.0, IB / 2)])
def test_a_ring_across_leaves_at_2_to_1_gets_half_the_cross_leaf_bandwidth(ratio, per_flow):
    # 4 nodes, 2 per leaf; a rail-0 ring 0 -> 16 -> 8 -> 24 -> 0 (node 0, 2, 1, 3): every hop
    # crosses the spine, two hops leave each leaf and two enter it. Leaf uplink = 2 nodes x IB
    # / ratio: at 1:1 2 IB for 2 flows (the NICs bind: IB each); at 2:1 IB for 2 flows: IB/2.
    graph = build_topology(Cluster(nodes=4), fabric=Fabric(nodes_per_leaf=2,
                                                           oversubscription=ratio))
    assert graph.edges[leaf_name(0, 0), SPINE]["bandwidth_Bps"] == 2 * IB / ratio
    rates = _rates(graph, [(0, 16), (16, 8), (8, 24), (24, 0)])
    assert all(rate == pytest.approx(per_flow, rel=1e-12) for rate in rates.values())
    # same leaf, same rail (0 -> 8): the uplink is not on its route, the NIC binds
    assert _rates(graph, [(0, 8)])[0] == pytest.approx(IB, rel=1e-12)


def test_an_oversubscribed_ring_pays_twice_the_bandwidth_term():
    # one GPU per node, one node per leaf: every hop of a 2-rank ring crosses an uplink of
    # IB / ratio, so at 2:1 the bytes take twice as long; the difference of two sizes cancels
    # the latencies: T(S2) - T(S1) at 2:1 = 2 x that at 1:1 (same algorithm and protocol)
    cal = LinkCalibration(nccl_algo="ring", nccl_proto="Simple")
    slopes = []
    for ratio in (1.0, 2.0):
        graph = build_topology(Cluster(nodes=2, gpus_per_node=1),
                               fabric=Fabric(nodes_per_leaf=1, oversubscription=ratio))
        t1, t2 = (alone_time("all_gather", graph, [0, 1], size, cal) for size in (2**26, 2**28))
        slopes.append(t2 - t1)
    assert slopes[1] == pytest.approx(2 * slopes[0], rel=1e-9)


THREE_TIER = Fabric(nodes_per_leaf=1, two_tier_max_units=2, units_per_pod=2)


def test_a_three_tier_route_climbs_to_the_core_in_six_hops():
    # 6 nodes, one per unit, 3 units > 2 two-tier: pods {0, 1}, {2, 3}, {4, 5}
    graph = build_topology(Cluster(nodes=6), fabric=THREE_TIER)
    far = route(graph, gpu_name(0), gpu_name(4 * 8))
    assert [v for _, v in far] == [leaf_name(0, 0), spine_name(0), CORE, spine_name(2),
                                   leaf_name(4, 0), gpu_name(32)]
    assert len(far) == 6 == nx.shortest_path_length(graph, gpu_name(0), gpu_name(32))
    near = route(graph, gpu_name(0), gpu_name(8))  # same pod: leaf, pod spine, leaf
    assert len(near) == 4 == nx.shortest_path_length(graph, gpu_name(0), gpu_name(8))
    assert [route_tier(graph, 0, dst) for dst in (0, 1, 8, 32)] == ["self", "nvlink", "spine",
                                                                     "core"]
    # a pod spine's bundle to the core: its 2 nodes x 8 NICs
    assert graph.edges[spine_name(2), CORE]["bandwidth_Bps"] == 2 * 8 * IB


def test_the_default_fabric_is_the_historical_one():
    assert fabric_of(Cluster()) == DEFAULT == Fabric(nodes_per_leaf=20)
    graph = build_topology(Cluster(nodes=41))
    assert graph.edges[leaf_name(1, 0), SPINE]["bandwidth_Bps"] == 20 * IB
    assert graph.edges[leaf_name(2, 7), SPINE]["bandwidth_Bps"] == 1 * IB
    assert CORE not in graph and route_tier(graph, 0, 20 * 8) == "spine"
    assert route_tier(graph, 0, 19 * 8) == "leaf"


def test_a_dgx_h100_leaf_serves_a_superpod_scalable_unit_of_32_nodes():
    graph = build_topology(Cluster(system="dgx-h100", nodes=33, ib_bandwidth_GBps=50.0))
    assert route_tier(graph, 0, 31 * 8) == "leaf" and route_tier(graph, 0, 32 * 8) == "spine"
    assert graph.edges[leaf_name(0, 0), SPINE]["bandwidth_Bps"] == 32 * 50e9


# DGX SuperPOD B200 RA, "DGX SuperPOD Architecture", Table 3 (8 rails, 32 nodes per SU):
# SUs -> (leaf, spine, core) switches, copied from the document
SUPERPOD_TABLE_3 = {2: (16, 8, 0), 4: (32, 16, 0), 8: (64, 32, 0), 16: (128, 128, 64),
                    32: (256, 256, 128), 64: (512, 512, 256)}


@pytest.mark.parametrize("units", sorted(SUPERPOD_TABLE_3))
def test_switch_counts_are_the_superpod_reference_architecture_s(units):
    fabric = system_profile("dgx-b200").fabric
    counts = fabric.switch_counts(units * 32, 8)
    assert (counts["leaf"], counts["spine"], counts["core"]) == SUPERPOD_TABLE_3[units]


def test_gb200_nvl72_keeps_72_gpus_per_nvlink_domain():
    system = system_profile("gb200-nvl72")
    assert system.gpus_per_nvlink_domain == 72 and system.fabric.nodes_per_leaf == 8


def _meta(**cluster) -> Scenario:
    return Scenario(cluster=Cluster(**cluster), parallel=Parallel(data_parallel_size=16),
                    run=Run(mode="meta"))


def test_the_shortcuts_refuse_an_oversubscribed_fabric_with_a_reason():
    assert Shortcuts.for_scale(_meta(nodes=2)).closed_form
    refused = Shortcuts.for_scale(_meta(nodes=2, fabric_oversubscription=2.0))
    assert not (refused.representative or refused.closed_form or refused.templates)
    assert all("oversubscribed 2:1" in why for why in refused.why().values())
    # 257 nodes of 32 per SU: 9 SUs, three-tier; the SuperPOD's core is 1:1, so its links
    # never bind and the shortcuts are kept (docs/hardware.md#fabric)
    core = Shortcuts.for_scale(_meta(system="dgx-h100", nodes=257))
    assert core.closed_form and core.why()["closed_form"].startswith("used")


CORE_4_TO_1 = Fabric(nodes_per_leaf=1, two_tier_max_units=2, units_per_pod=2,
                     core_oversubscription=4.0)


def test_ring_alone_counts_uplinks_only_where_they_can_bind():
    # the rail-0 ring 0 -> 16 -> 8 -> 24 (nodes 0, 2, 1, 3) sends two hops up out of each
    # leaf of 2 nodes: at 1:1 the uplinks never bind and are skipped (no link carries two
    # hops: its closed form is exact), through a 1:1 core too; at 2:1, or through a core at
    # 4:1, they count and it shares
    ring = [0, 16, 8, 24]
    for fabric in (Fabric(nodes_per_leaf=2), THREE_TIER):
        assert not shares_a_link(build_topology(Cluster(nodes=4), fabric=fabric), ring)
    for fabric in (Fabric(nodes_per_leaf=2, oversubscription=2.0), CORE_4_TO_1):
        assert shares_a_link(build_topology(Cluster(nodes=4), fabric=fabric), ring)


def test_the_oversubscription_field_is_bounded():
    run = subprocess.run([sys.executable, "-m", "simsp.cli", "run", "scenarios/tiny.toml",
                          "--fabric-oversubscription", "0.5"], capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "error: cluster.fabric_oversubscription: 0.5 is outside [1, 64] :1 (a leaf has at "
        "least one uplink per 64 downlinks; 1 is non-blocking)"]


@pytest.mark.parametrize("ranks, nodes, counts", [
    (16, 2, "14 nvlink, 2 leaf"),  # 2 nodes of one SU: the 2 node crossings stay on a leaf
    # 64 nodes = 2 SUs of 32: of the 64 node crossings, 31 -> 32 and 63 -> 0 cross the spine
    (512, 64, "448 nvlink, 62 leaf, 2 spine")])
def test_simsp_ring_shows_each_hop_s_route_class(ranks, nodes, counts):
    run = subprocess.run([sys.executable, "-m", "simsp.cli", "ring", "--system", "dgx-h100",
                          "--ranks", str(ranks), "--nodes", str(nodes), "--size", "1M"],
                         capture_output=True, text=True)
    assert run.stdout.splitlines()[-1] == (f"# channel 0's hops by route class: {counts}; "
                                           f"fabric 32 nodes per leaf, 1:1")


def test_a_group_s_placement_tells_pods_apart():
    # units of one node, pods of 2 units (3 units: three-tier): nodes 0-1 share pod 0, nodes
    # 1-2 straddle pods 0 and 1, so the two pairs route differently and must not look alike
    a = placement((0, 8), 8, 6, THREE_TIER)
    b = placement((8, 16), 8, 6, THREE_TIER)
    assert a != b and a[1][-1] == 0 and b[1][-1] == 1
    assert placement((0, 8), 8, 6) == placement((0, 8), 8, 6, DEFAULT)  # two-tier: as before


def test_sharp_is_data_of_the_switches():
    assert [system_profile(n).fabric.sharp_generation for n in ("dgx-a100", "dgx-h100",
                                                                "dgx-h800")] == [2, 3, None]
