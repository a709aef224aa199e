"""The expert-data-parallel groups as owners of traffic (docs/shortcuts.md, "The traffic and its
links"; docs/moe.md): their gradient reductions share NICs with the EP all-to-alls and the
pipeline sends, so the check must see them; with them listed, meta mode's shortcuts equal the
full simulation (Shortcuts()) to 1e-9."""

from dataclasses import replace

import pytest

from simsp.shortcuts.check import Shortcuts
from simsp.shortcuts.clashes import Overlaps, conflicts
from simsp.shortcuts.traffic import expert_owners
from tests.test_shortcut_ep_quotient import assert_equal_to_full, moe_layout


def test_expert_owners_list_the_expert_dp_groups():
    """t 2, d 4, p 2, EP 2, ETP 1 (16 ranks): the expert grid is rank = ep + 2·edp + 8·pp
    (cluster/expert_grid.py, Megatron's order), so EP groups are (0, 1), (2, 3), ... and
    EDP = t·d/(ETP·EP) = 4: (0, 2, 4, 6), (1, 3, 5, 7) on stage 0, +8 on stage 1."""
    owners = expert_owners(moe_layout("1f1b", 4, 2, 4, 2))
    assert [g for kind, g in owners if kind == "ep"] == [(a, a + 1) for a in range(0, 16, 2)]
    assert [g for kind, g in owners if kind == "edp"] == [
        (0, 2, 4, 6), (1, 3, 5, 7), (8, 10, 12, 14), (9, 11, 13, 15)]


def test_no_expert_dp_group_where_ep_covers_the_replicas():
    """t 1, d = EP 8 (DeepSeek-V3's EP = DP): each expert on one rank of a stage, EDP 1, so
    no expert reduction crosses ranks and no "edp" owner is listed."""
    owners = expert_owners(moe_layout("1f1b", 4, 1, 8, 8))
    assert {kind for kind, _ in owners} == {"ep"}


def test_expert_and_dense_reductions_are_in_turn_on_one_stream():
    """On GPU 0's NIC a DP ring hop and an EDP ring hop of groups holding GPU 0 are in turn
    (one DP stream per rank, training/data_parallel/grad_buckets.py); under
    --overlap-grad-reduce an EDP hop meets an EP all-to-all's hop as a DP one does."""
    nic = ("gpu0", "leaf0/rail0")
    dp, edp, ep = ("dp", (0, 4, 8, 12)), ("edp", (0, 8)), ("ep", (0, 1, 2, 3, 4, 5, 6, 7))
    overlapped = Overlaps(grad_reduce=True, p2p=False)
    assert list(conflicts({nic: [dp, edp]}, overlapped)) == []
    assert list(conflicts({nic: [edp, ep]}, overlapped)) == [(nic, edp, ep)]
    assert list(conflicts({nic: [edp, ep]}, Overlaps(grad_reduce=False, p2p=False))) == []


def test_dualpipe_d16_ep8_expert_dp_rings_run_step_by_step():
    """DualPipe, d 16 / EP 8 on 4-GPU nodes (EP groups of two nodes, EDP groups (r, r + 8)):
    each EDP ring crosses the NICs its EP group's all-to-all uses while the other chunk's
    backward runs, so it runs step by step; timed alone it came out 2.2% fast."""
    sc = moe_layout("dualpipe", 4, 1, 16, 8, global_batch_size=64)
    fast = Shortcuts.for_scale(sc)
    assert dict(fast.methods)[(0, 8)] == "step_by_step"
    assert fast.representative and fast.symmetry.link_reps  # under the quotient
    assert_equal_to_full(sc, fast)


@pytest.mark.parametrize("schedule, gpn, d, ep", [
    ("1f1b", 4, 16, 8), ("zb-h1", 4, 16, 8), ("dualpipe", 4, 8, 4), ("zb-h1", 2, 8, 4)])
def test_expert_dp_variants_equal_the_full_simulation(schedule, gpn, d, ep):
    """Other schedules and sizes, EP groups in a node or across two: equal to the full
    simulation with the EDP groups checked."""
    sc = moe_layout(schedule, gpn, 1, d, ep, global_batch_size=4 * d)
    fast = Shortcuts.for_scale(sc)
    assert (0, ep) in dict(fast.methods)
    assert_equal_to_full(sc, fast)


def test_expert_dp_rings_across_a_leaf_boundary(monkeypatch):
    """DualPipe d 16 / EP 8 on 4-GPU nodes, leaves of 2 nodes: stage 0 spans leaves {0, 1} and
    {2, 3}, every EDP ring (r, r + 8) crosses the spine; equal to the full simulation."""
    from simsp.hardware import cluster_hardware

    monkeypatch.setattr(cluster_hardware, "DEFAULT", replace(cluster_hardware.DEFAULT, nodes_per_leaf=2))
    sc = moe_layout("dualpipe", 4, 1, 16, 8, global_batch_size=64)
    fast = Shortcuts.for_scale(sc)
    assert dict(fast.methods)[(0, 8)] == "step_by_step"
    assert_equal_to_full(sc, fast)


def test_expert_dp_rings_without_the_representative():
    """Imbalanced routing (no rail symmetry, no representative: every rank runs), DualPipe
    d 16 / EP 8: the EDP rings meet the all-to-alls, run step by step; timed in closed form
    they came out 1.8% fast."""
    sc = moe_layout("dualpipe", 4, 1, 16, 8, global_batch_size=64)
    sc = replace(sc, model=replace(sc.model, moe_routing_imbalance=0.5))
    fast = Shortcuts.for_scale(sc)
    assert not fast.representative and dict(fast.methods)[(0, 8)] == "step_by_step"
    assert_equal_to_full(sc, fast)
