"""The representative without FSDP where stages cross a leaf (or pod) boundary: replicas placed
unlike on the leaves send their pipeline pairs (and tied-embedding sums) over other classes of
link (a spine's latency) than replica 0's, so TP rank 0 of the first replica of each placement
runs on every stage (shortcuts/representative.py placement_replicas), every other replica the
image of its twin, instead of the quotient by rail symmetry. Iteration time and every stage's
exposure equal the full simulation (`Shortcuts()`) to 1e-9; replica 0 alone (the plain
representative, which replica_routes_why_not refuses) is more than 1e-3 off on each."""

from dataclasses import replace

import pytest

from simsp.shortcuts.check import Shortcuts
from tests.test_fsdp_leaf_replicas import tiny_leaves
from tests.test_representative_audit import largest_gap, metrics, scenario

LAYOUTS = {  # label -> (gpn, t, p, d, interleaved, untied, leaf, core, twins)
    # the audit's example: stage 2 on nodes 16-23, leaves of 20, replicas 4-7 across it
    "t1 p3 d8 on 1-GPU nodes, leaves of 20": (1, 1, 3, 8, False, True, None, False,
                                              (0, 0, 0, 0, 4, 4, 4, 4)),
    # the tied embedding's sum between the first and last stage crosses the spine too
    "tied embeddings": (1, 1, 3, 8, False, False, None, False, (0, 0, 0, 0, 4, 4, 4, 4)),
    # two model chunks per stage, each pair crossing as in the plain schedule
    "interleaved": (1, 1, 3, 8, True, True, None, False, (0, 0, 0, 0, 4, 4, 4, 4)),
    # TP groups across nodes (t2 on 1-GPU nodes): stage 2's replica 2 across the leaf boundary
    "t2 p3 d4 on 1-GPU nodes, leaves of 20": (1, 2, 3, 4, False, True, None, False, (0, 0, 2, 2)),
    # three placements, the pods' core tier crossed (leaves of 4, pods of 2 leaves)
    "t1 p3 d6 on 1-GPU nodes, leaves of 4, pods of 2": (1, 1, 3, 6, False, False, 4, True,
                                                        (0, 0, 2, 2, 4, 4)),
}


def layout(label, tmp_path):
    """The scenario of LAYOUTS[label] (on the default leaves of 20 where `leaf` is None)."""
    gpn, t, p, d, interleaved, untied, leaf, core, _twins = LAYOUTS[label]
    sc = scenario(gpn, t, p, d, interleaved, False, untied=untied)
    if leaf is None:
        return sc
    return replace(sc, cluster=replace(sc.cluster, system=str(tiny_leaves(tmp_path, gpn, leaf,
                                                                          core))))


@pytest.mark.parametrize("label", sorted(LAYOUTS))
def test_one_replica_per_placement(label, tmp_path):
    """One replica per placement runs, each replica's twin the first placed as it is: equal to
    the full simulation to 1e-9; replica 0 alone more than 1e-3 off (the gap rule 2 closes)."""
    sc = layout(label, tmp_path)
    fast = Shortcuts.for_scale(sc)
    twins = LAYOUTS[label][-1]
    assert fast.representative and fast.symmetry is None
    assert fast.twins == twins and fast.replicas == tuple(sorted(set(twins)))
    full = metrics(sc, Shortcuts())
    assert largest_gap(metrics(sc, fast), full) < 1e-9
    assert largest_gap(metrics(sc, replace(fast, replicas=(0,), twins=())), full) > 1e-3


def test_rule_one_still_falls_to_rail_symmetry():
    """Overlapped gradient reduction with the distributed optimizer on the audit's layout: the DP
    ring (0, ..., 3) meets pipeline sends at both ends of its hops (_met_at_both_ends), so the
    quotient by rail symmetry runs, not the placements' replicas; exact."""
    sc = scenario(1, 1, 3, 8, False, True, untied=True)
    fast = Shortcuts.for_scale(sc)
    assert fast.symmetry is not None and fast.replicas == (0,) and fast.twins == ()
    assert largest_gap(metrics(sc, fast), metrics(sc, Shortcuts())) < 1e-9
