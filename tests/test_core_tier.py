"""A three-tier fabric's core (hardware/fabric.py uplinks_can_bind): at 1:1 its links never bind,
so the shortcuts stay and equal the full simulation; oversubscribed it binds, the shortcuts are
refused with the reason, and forcing them would be wrong (docs/hardware.md#fabric)."""

from dataclasses import replace

from hypothesis import given, settings, strategies as st
import pytest

from simsp.cluster.topology import above_leaves, build_topology, gpu_name, route
from simsp.engine.fair_share import max_min_rates
from simsp.hardware.fabric import Fabric
from simsp.metrics.collect import collect
from simsp.scenario.config import Cluster
from simsp.shortcuts.check import Shortcuts, check_shortcuts
from simsp.training.driver.iteration import simulate_iteration
from tests.test_shortcut_layouts import layout_scenario, overlapped_scenario

IB = 25e9  # bytes/s: the default HDR NIC
# one node per scalable unit, pods of 2 units, three-tier above 2 units
THREE_TIER = Fabric(nodes_per_leaf=1, two_tier_max_units=2, units_per_pod=2)

SYSTEM = """name = "tiny-three-tier"
description = "4 A100 per node, one node per scalable unit, pods of 2 units above 2 units"
gpu = "a100-sxm-80gb"
gpus_per_nvlink_domain = {{ value = 4, source = "a test's" }}
nvswitch_generation = {{ value = 2, source = "a test's" }}
nics_per_node = {{ value = 4, source = "a test's" }}
nic = {{ value = "HDR", source = "a test's" }}
nic_Gbps = {{ value = 200, source = "a test's" }}
[fabric]
nodes_per_leaf = {{ value = 1, source = "a test's" }}
two_tier_max_units = {{ value = 2, source = "a test's" }}
units_per_pod = {{ value = 2, source = "a test's" }}
core_oversubscription = {{ value = {core}, source = "a test's" }}
"""


def _rates(graph, pairs, left_out=lambda edge: False):
    """Max-min rates of one flow per (src, dst) GPU pair over the links' raw speeds, the links
    `left_out` says dropped from every route."""
    flows = {i: tuple(e for e in route(graph, gpu_name(s), gpu_name(d)) if not left_out(e))
             for i, (s, d) in enumerate(pairs)}
    capacity = {edge: graph.edges[edge]["bandwidth_Bps"] for edge in graph.edges}
    return max_min_rates(flows, capacity)


@pytest.mark.parametrize("core, per_flow", [(1.0, IB), (4.0, IB / 2)])
def test_eight_flows_between_pods_through_a_4_to_1_core_get_half_a_nic(core, per_flow):
    # 4 nodes of 8 GPUs, pods {0, 1} and {2, 3}: node 0's 8 GPUs each send to the GPU of its
    # rail on node 2. Pod 0's bundle to the core: 2 nodes x 8 NICs x IB / core = 16 IB / core;
    # 1:1: 16 IB for 8 flows (the NICs bind: IB each); 4:1: 4 IB for 8 flows: IB / 2 each
    graph = build_topology(Cluster(nodes=4), fabric=replace(THREE_TIER,
                                                            core_oversubscription=core))
    rates = _rates(graph, [(rail, 16 + rail) for rail in range(8)])
    assert all(rate == pytest.approx(per_flow, rel=1e-12) for rate in rates.values())


@settings(max_examples=30, deadline=None)
@given(pairs=st.lists(st.tuples(st.integers(0, 47), st.integers(0, 47)).filter(
    lambda pair: pair[0] != pair[1]), min_size=1, max_size=40),
       leaves=st.sampled_from([1.0, 2.0]))
def test_links_above_the_leaves_cut_no_allocation_at_a_1_to_1_core(pairs, leaves):
    # 6 nodes of 8 GPUs in 3 pods: max-min rates of any flow set are the same with the core
    # bundles left out (they never bind at 1:1, whatever the leaves' ratio), and at 1:1
    # leaves with every link above the leaves left out
    graph = build_topology(Cluster(nodes=6), fabric=replace(THREE_TIER,
                                                            oversubscription=leaves))
    full = _rates(graph, pairs)
    left_out = _rates(graph, pairs, lambda e: above_leaves(e) and (leaves == 1 or "core" in e))
    assert left_out == pytest.approx(full, rel=1e-12)


def _three_tier(sc, tmp_path, core: float):
    """The scenario on 4-GPU nodes, one per scalable unit, pods of two: a core above 2 nodes,
    its pod bundles at `core`:1."""
    system = tmp_path / f"three-tier-{core:g}.toml"
    system.write_text(SYSTEM.format(core=core))
    return replace(sc, cluster=replace(sc.cluster, system=str(system)))


def _metrics(sc, shortcuts: Shortcuts) -> dict:
    return collect(simulate_iteration(sc, shortcuts, trace="none"), shortcuts)


LAYOUTS = {  # t2 p2 d8 on 8 nodes: each stage spans 2 pods, every pipeline pair crosses the core
    "rings alone": lambda: layout_scenario(4, 2, 2, 8, False, False, True, 4),
    # DP rings overlapped with TP on the NVLink ports: rail symmetry with image loads
    "rail symmetry": lambda: overlapped_scenario(4, 2, 2, 8, True, hidden=512, seq=256),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_shortcuts_across_a_1_to_1_core_equal_the_full_simulation(layout, tmp_path):
    sc = _three_tier(LAYOUTS[layout](), tmp_path, 1)
    fast = Shortcuts.for_scale(sc)
    assert fast.representative and fast.closed_form
    mine, full = _metrics(sc, fast), _metrics(sc, Shortcuts())
    assert mine["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-9)
    for a, b in zip(mine["exposed_s_per_stage"], full["exposed_s_per_stage"]):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-15)


def test_a_4_to_1_core_binds_so_the_shortcuts_are_refused(tmp_path):
    sc = _three_tier(LAYOUTS["rings alone"](), tmp_path, 4)
    refused = Shortcuts.for_scale(sc)
    assert not (refused.representative or refused.closed_form or refused.templates)
    assert all("the pods' uplinks to the core tier are oversubscribed 4:1 (8 scalable units "
               "need the core tier)" in why for why in refused.why().values())
    full = _metrics(sc, Shortcuts())
    assert _metrics(sc, refused)["iteration_time_s"] == full["iteration_time_s"]
    # what the refusal prevents: the shortcuts' verdict forced anyway leaves the core's load
    # out and is too fast, as fast as the 1:1 core
    forced = _metrics(sc, check_shortcuts(sc))["iteration_time_s"]
    at_1_to_1 = _metrics(_three_tier(LAYOUTS["rings alone"](), tmp_path, 1),
                         Shortcuts())["iteration_time_s"]
    assert forced == pytest.approx(at_1_to_1, rel=1e-9)
    assert forced < full["iteration_time_s"] * (1 - 1e-2)
