"""A CP group run as one program (training/context_parallel/shadows.py, engine/slice_clocks.py)
is not yet proven exact (a pipeline transfer's delivery per slice), so the guard refuses it and
every CP run is the per-rank one; it names each thing it cannot follow."""

from dataclasses import replace

from simsp.shortcuts.plan import cp_shadow_why_not
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
from tests.test_cp_lone_ring import cp_scenario as tied_scenario


def cp_scenario(*args, **kwargs):
    """tests/test_cp_lone_ring.py's tiny CP model, its output layer untied."""
    sc = tied_scenario(*args, **kwargs)
    return replace(sc, model=replace(sc.model, untie_embeddings_and_output_weights=True))


def test_guard_names_what_it_cannot_follow():
    sc = cp_scenario(2, 2, 4, 2, 2, "p2p", True, seq=384)
    assert "d > 1" in cp_shadow_why_not(sc, Shortcuts.for_scale(sc), "none")
    sc = cp_scenario(2, 2, 2, 2, 1, "a2a", True, seq=384)
    assert "--cp-comm-type a2a" in cp_shadow_why_not(sc, Shortcuts.for_scale(sc), "none")
    sc = cp_scenario(2, 2, 4, 2, 1, "p2p", True, seq=384)
    assert "traced compute" in cp_shadow_why_not(sc, Shortcuts.for_scale(sc), "full")
    assert "the full simulation" in cp_shadow_why_not(sc, Shortcuts(), "none")
    assert cp_shadow_why_not(sc, Shortcuts.for_scale(sc), "none") == \
        "pipeline transfers not proven alone on their links"


def test_refused_shadows_leave_every_cp_rank_running():
    sc = cp_scenario(2, 2, 4, 2, 1, "p2p", True, seq=384)
    run = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none")
    assert run.inputs.world.shadows is None
    assert len(run.results.end_s) == 2 * 4  # every CP rank of TP rank 0 on both stages ended
