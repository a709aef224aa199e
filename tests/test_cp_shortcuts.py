"""With context parallelism the fast path times collectives in closed form where no ring
shares a link with other traffic, the CP exchanges included (shortcuts/cp_traffic.py), and
equals the full simulation (--no-shortcuts) to 1% in iteration time and every stage's
exposure, on CP groups inside a node and spanning nodes (tiny models, meta mode)."""

import pytest

from simsp.training.driver.iteration import Shortcuts
from tests.test_cp_representative_dp import cp_layout
from tests.test_shortcut_layouts import assert_same, fast_and_full


def cp_scenario(gpn, t, cp, p, d, comm_type, overlap):
    """A 2p-layer flash model of hidden 96 (12 heads, 4 KV groups, 96 tokens) on
    ceil(t·cp·p·d / gpn) nodes, meta mode (tests/test_cp_representative_dp.py cp_layout)."""
    return cp_layout(gpn, t, cp, p, d, comm_type, overlap)


@pytest.mark.parametrize("gpn, t, cp, p, d, comm_type, overlap", [
    (8, 2, 2, 2, 2, "p2p", True),  # CP groups inside a node, DP over the dp_cp groups
    (4, 4, 2, 2, 1, "p2p", False),  # each CP pair spans two nodes (ranks 4 apart)
    (2, 1, 4, 1, 2, "a2a", True),  # a CP group of 4 over two nodes, Ulysses all-to-alls
    (4, 2, 2, 1, 2, "allgather", False),  # the K/V all-gather as a ring collective
])
def test_cp_fast_path_equals_full_simulation(gpn, t, cp, p, d, comm_type, overlap):
    sc = cp_scenario(gpn, t, cp, p, d, comm_type, overlap)
    assert Shortcuts.for_scale(sc).closed_form
    fast, full = fast_and_full(sc)
    assert_same(fast, full)


def test_the_stage_table_names_each_stages_cp0_rank():
    """t 2 cp 2 p 2 d 2: stage 1 begins at rank t·c·d = 8 (rank 2 is stage 0's cp rank 1)."""
    from simsp.metrics.collect import collect
    from simsp.report.run.summary_md import summary_text
    from simsp.training.driver.iteration import simulate_iteration
    sc = cp_scenario(8, 2, 2, 2, 2, "p2p", False)
    fast = Shortcuts.for_scale(sc)
    text = summary_text(collect(simulate_iteration(sc, fast, trace="none"), fast))
    table = text.split("## Pipeline stages")[1].split("\n\n")[1].splitlines()
    assert [row.split(" | ")[:2] for row in table[2:]] == [["| 0", "0"], ["| 1", "8"]]


def exposures_apart(fast, full) -> float:
    """The largest difference of iteration time and any stage's exposure (seconds)."""
    stages = zip(fast["exposed_s_per_stage"], full["exposed_s_per_stage"])
    return max([abs(fast["iteration_time_s"] - full["iteration_time_s"])]
               + [abs(mine[kind] - theirs[kind]) for mine, theirs in stages for kind in theirs])


@pytest.mark.parametrize("gpn, t, cp, p, comm_type, simulated", [
    (4, 4, 2, 2, "p2p", (0, 4, 8, 12)),  # CP pairs across nodes, each TP group a node
    (4, 4, 2, 2, "allgather", (0, 4, 8, 12)),  # the K/V all-gather's rings across nodes
    (2, 2, 4, 1, "p2p", (0, 2, 4, 6)),  # a CP group of 4 over four 2-GPU nodes
])
def test_cp_representative_runs_tp_rank_0_and_equals_full_simulation(gpn, t, cp, p, comm_type,
                                                                     simulated):
    """d 1, no overlapped DP: the TP ranks > 0 are images of TP rank 0 (the TP shift renames
    rails) and no link carries their traffic and a simulated owner's at once, so only TP rank
    0's CP ranks of each stage run (rank tp + t·cp_rank + t·c·d·stage, hand-listed), equal to
    --no-shortcuts to 1e-9 in iteration time and every stage's exposure."""
    from simsp.shortcuts.plan import simulated_ranks
    sc = cp_scenario(gpn, t, cp, p, 1, comm_type, False)
    shortcuts = Shortcuts.for_scale(sc)
    assert shortcuts.representative and simulated_ranks(sc, shortcuts) == simulated
    fast, full = fast_and_full(sc)
    assert exposures_apart(fast, full) <= 1e-9


def test_cp_representative_is_refused_where_left_out_traffic_may_meet_a_simulated_ring():
    """t 2 cp 4 on 4-GPU nodes with --overlap-grad-reduce: TP rank 1's gradient ring (its dp_cp
    group 1, 3, 5, 7, left out) may meet the TP group (0, 1) (simulated) on GPU 1's NVLink
    port, so every rank runs; without the overlap the two are in turn and TP rank 0 runs."""
    refused = Shortcuts.for_scale(cp_scenario(4, 2, 4, 1, 1, "p2p", True))
    assert not refused.representative
    assert "nvswitch->gpu1" in refused.why()["representative"]
    assert Shortcuts.for_scale(cp_scenario(4, 2, 4, 1, 1, "p2p", False)).representative
