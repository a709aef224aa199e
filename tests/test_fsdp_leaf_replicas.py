"""The representative under Megatron-FSDP where stages cross a leaf (or pod) boundary: replicas
placed unlike on the leaves run unlike (a spine hop's latency), so TP rank 0 of the first
replica of each placement and kind of shard runs (shortcuts/representative.py fsdp_replicas),
and a DP ring of one member per node, run as its piece, runs one hop from each simulated
member's NIC up to the next one's NIC down (engine/collectives/ring_alone.py
_lone_member_hops). Iteration time and every stage's exposure equal the full simulation
(`Shortcuts()`) to 1e-9; replica 0 alone (the plain representative) was 2.0e-3 and 4.1e-3
short."""

from dataclasses import replace

import pytest

from simsp.shortcuts.check import Shortcuts
from tests.test_representative_audit import largest_gap, metrics, scenario

SYSTEM = """name = "tiny-leaves"
description = "{gpn} A100 per node, {leaf} nodes per leaf{pods}"
gpu = "a100-sxm-80gb"
gpus_per_nvlink_domain = {{ value = {gpn}, source = "a test's" }}
nvswitch_generation = {{ value = 2, source = "a test's" }}
nics_per_node = {{ value = {gpn}, source = "a test's" }}
nic = {{ value = "HDR", source = "a test's" }}
nic_Gbps = {{ value = 200, source = "a test's" }}
[fabric]
nodes_per_leaf = {{ value = {leaf}, source = "a test's" }}
"""
CORE = """two_tier_max_units = { value = 2, source = "a test's" }
units_per_pod = { value = 2, source = "a test's" }
"""


def fsdp(sc, strategy: str = "optim_grads_params", system=None):
    """`sc` under Megatron-FSDP with `strategy` (on `system`, a path, where given)."""
    parallel = replace(sc.parallel, use_megatron_fsdp=True,
                       data_parallel_sharding_strategy=strategy)
    cluster = sc.cluster if system is None else replace(sc.cluster, system=str(system))
    return replace(sc, parallel=parallel, cluster=cluster)


def tiny_leaves(tmp_path, gpn: int, leaf: int, core: bool = False):
    """A system of `gpn`-GPU nodes, `leaf` nodes per leaf; with `core`, pods of 2 units and a
    core tier above 2 units (1:1)."""
    path = tmp_path / f"leaves-{gpn}-{leaf}-{core}.toml"
    text = SYSTEM.format(gpn=gpn, leaf=leaf, pods=", pods of 2 leaves" if core else "")
    path.write_text(text + (CORE if core else ""))
    return path


def gaps(sc):
    """(the verdict, its gap to the full simulation, replica 0 alone's gap)."""
    fast = Shortcuts.for_scale(sc)
    full = metrics(sc, Shortcuts())
    alone = replace(fast, replicas=(0,))
    return fast, largest_gap(metrics(sc, fast), full), largest_gap(metrics(sc, alone), full)


@pytest.mark.parametrize("strategy", ["optim_grads_params", "optim_grads"])
def test_stage_across_a_leaf_boundary(strategy):
    """t1 p3 d8 on 1-GPU nodes, leaves of 20: stage 2 on nodes 16-23, replicas 0-3 on leaf 0
    and 4-7 across it (their pairs 12 -> 20 ... on a spine): two placements, replicas 0 and 4
    run, the DP rings' pieces hop 0 -> 4 and 4 -> 0 on their NICs. Exact; replica 0 alone is
    more than 1e-3 short (the gap this closes), and so are both replicas with the rings'
    pieces on replica 0's NIC alone (a spine-crossing replica's sends then meet no ring)."""
    sc = fsdp(scenario(1, 1, 3, 8, False, False, untied=True), strategy)
    fast, gap, alone = gaps(sc)
    assert fast.twins == (0, 0, 0, 0, 4, 4, 4, 4)
    assert fast.replicas == (0, 4)
    assert gap < 1e-9
    assert alone > 1e-3
    lone_piece = replace(fast, twins=())
    assert largest_gap(metrics(sc, lone_piece), metrics(sc, Shortcuts())) > 1e-3


LAYOUTS = {  # label -> (gpn, t, p, d, leaf, core, strategy, SP): one member per node, rings pieced
    # replicas 0, 1, 4, 5 and 2, 3 placed alike: 0 and 2 run
    "t1 p2 d6 on 1-GPU nodes, leaves of 4": (1, 1, 2, 6, 4, False, "optim_grads", False),
    # three placements (0, 2, 4 run), the pods' core crossed
    "t1 p3 d6 on 1-GPU nodes, leaves of 4, pods of 2": (1, 1, 3, 6, 4, True,
                                                        "optim_grads_params", False),
    # TP fills the node, SP: kinds of shard and of placement at once (0, 1, 2, 3, 5 run)
    "t2 SP p2 d6 on 2-GPU nodes, leaves of 4": (2, 2, 2, 6, 4, False, "optim_grads", True),
}


def leaf_layout(label: str, tmp_path):
    """One of the FSDP layouts across leaves, on its tiny fabric."""
    gpn, t, p, d, leaf, core, strategy, sp = LAYOUTS[label]
    sc = scenario(gpn, t, p, d, False, False, untied=True)
    sc = replace(sc, parallel=replace(sc.parallel, sequence_parallel=sp))
    return fsdp(sc, strategy, system=tiny_leaves(tmp_path, gpn, leaf, core))


@pytest.mark.parametrize("label", sorted(LAYOUTS))
def test_more_layouts_across_leaves(label, tmp_path):
    """Equal to the full simulation to 1e-9 (iteration and every stage's exposure)."""
    sc, d = leaf_layout(label, tmp_path), LAYOUTS[label][3]
    fast = Shortcuts.for_scale(sc)
    assert fast.representative and len(set(fast.twins)) > 1 and len(fast.replicas) < d
    assert largest_gap(metrics(sc, fast), metrics(sc, Shortcuts())) < 1e-9
