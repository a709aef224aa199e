"""A CP group run as one program (training/context_parallel/shadows.py, engine/slice_clocks.py):
CP rank 0 of each stage runs, its shadows follow in vector clocks. Against the run where every
CP rank runs its own program (the oracle: the same shortcuts with the shadows refused) and the
full simulation (`Shortcuts()`: every rank, every send a fair-shared flow), the iteration time
agrees to 1e-12 relative and every stage's exposure to 1e-12 of it (the network
times a p2p flow's wake-up from its last rate solve, which other transfers move by an ulp), the
counted FLOPs and every rank's memory peak exactly; a shadow left at its entry clock after its
CP calls' own TE kernels, or sent out of the ring at its leader's end, fails. Where pipeline
transfers would share a link beyond its capacity the run is made again per rank."""

from dataclasses import replace

import numpy as np
import pytest

from simsp.metrics.collect import collect
from simsp.shortcuts.plan import cp_shadow_why_not
from simsp.training.context_parallel import ring_pass
from simsp.training.context_parallel import shadows as shadows_module
from simsp.training.driver import iteration
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
from tests.test_cp_lone_ring import cp_scenario as tied_scenario


def cp_scenario(*args, ib_GBps: float = 2.0, **kwargs):
    """tests/test_cp_lone_ring.py's tiny CP model (its ring's sends outlast its blocks on
    2 GB/s InfiniBand: CP ranks wait on each other) with its output layer untied (a tied
    embedding's all-reduce times its stages' arrivals itself: the guard refuses it)."""
    sc = tied_scenario(*args, **kwargs)
    sc = replace(sc, model=replace(sc.model, untie_embeddings_and_output_weights=True))
    return replace(sc, cluster=replace(sc.cluster, ib_bandwidth_GBps=ib_GBps))


def _metrics(sc, monkeypatch, shadows: bool):
    """(metrics, the ranks that ran as shadows) with the CP shadows on or refused."""
    with monkeypatch.context() as patch:
        if not shadows:
            patch.setattr(iteration, "cp_shadow_why_not", lambda *args: "refused")
        shortcuts = Shortcuts.for_scale(sc)
        run = simulate_iteration(sc, shortcuts, trace="none")
        world = run.inputs.world
        return collect(run, shortcuts), (world.shadows.shadowed() if world.shadows else ())


def _agree(fast: dict, oracle: dict) -> bool:
    """Iteration to 1e-12 relative, every stage's exposure to 1e-12 of it; FLOPs and every
    rank's peak exactly."""
    t = oracle["iteration_time_s"]
    rows = zip(fast["exposed_s_per_stage"], oracle["exposed_s_per_stage"])
    return (abs(fast["iteration_time_s"] - t) <= 1e-12 * t
            and all(abs(a[k] - b[k]) <= 1e-12 * t for a, b in rows for k in b)
            and fast["counted_model_flops"] == oracle["counted_model_flops"]
            and [r["peak_bytes"] for r in fast["ranks"]] ==
            [r["peak_bytes"] for r in oracle["ranks"]])


LAYOUTS = [  # gpn, t, cp, p, d, interleaved, InfiniBand GB/s; against the full simulation
    (2, 2, 4, 2, 1, False, 2.0, True),  # CP 4 over four nodes, TP 2, PP 2 (1F1B): CP ranks wait
    (2, 2, 4, 4, 1, True, 6.0, False),  # PP 4 interleaved (at 2 GB/s its sends would meet)
    (4, 4, 2, 2, 1, False, 2.0, True),  # CP pairs across nodes, each TP group a node
    (2, 2, 4, 2, 2, False, 2.0, False),  # two replicas: gradients reduced over both groups
]


@pytest.mark.parametrize("gpn, t, cp, p, d, interleaved, ib, against_full", LAYOUTS)
def test_shadows_equal_every_cp_rank_run(gpn, t, cp, p, d, interleaved, ib, against_full,
                                         monkeypatch):
    sc = cp_scenario(gpn, t, cp, p, d, "p2p", interleaved, seq=96 * cp, ib_GBps=ib)
    assert cp_shadow_why_not(sc, Shortcuts.for_scale(sc), "none") == ""
    fast, shadowed = _metrics(sc, monkeypatch, True)
    oracle, none = _metrics(sc, monkeypatch, False)
    leaders = p * len(Shortcuts.for_scale(sc).replicas)  # CP rank 0 of each stage and replica
    assert len(shadowed) == leaders * (cp - 1) and not none
    assert _agree(fast, oracle)
    if against_full:  # the full simulation: every rank, every send a fair-shared flow
        assert _agree(fast, collect(simulate_iteration(sc, Shortcuts(), trace="none"),
                                    Shortcuts()))
    rows = [r for r in fast["ranks"] if r["tp"] == 0]
    assert sum(not r["simulated"] for r in rows) >= leaders * (cp - 1)  # the leader's rows


@pytest.mark.parametrize("broken", ["bookkeeping", "ring"])
def test_a_shadow_left_behind_fails(broken, monkeypatch):
    sc = cp_scenario(2, 2, 4, 2, 1, "p2p", False, seq=384)
    oracle, _ = _metrics(sc, monkeypatch, False)
    with monkeypatch.context() as patch:
        if broken == "bookkeeping":  # every slice moved by the leader's kernels' delay
            patch.setattr(shadows_module.CpShadows, "land", lambda self, vector: None)
        else:  # every slice leaves the ring at the leader's end
            work = ring_pass.forward_pass
            def leader_end(ring, *args, **kwargs):
                ends, waited, posts = work(ring, *args, **kwargs)
                return np.full_like(ends, ends[0]), waited, posts
            patch.setattr(ring_pass, "forward_pass", leader_end)
        fast, shadowed = _metrics(sc, monkeypatch, True)
    assert shadowed and not _agree(fast, oracle)


def test_shared_links_run_every_rank(monkeypatch):
    # PP 2 interleaved: a rank's activation and gradient go to the same stage at once
    sc = cp_scenario(2, 2, 4, 2, 1, "p2p", True, seq=384, ib_GBps=25.0)
    fast, shadowed = _metrics(sc, monkeypatch, True)
    oracle, _ = _metrics(sc, monkeypatch, False)
    assert not shadowed and fast == oracle  # refused in the run, made again per rank


def test_guard_names_what_it_cannot_follow():
    sc = cp_scenario(2, 2, 4, 2, 2, "p2p", True, seq=384, overlap=True)
    assert "overlapped DP communication" in cp_shadow_why_not(sc, Shortcuts.for_scale(sc),
                                                              "none")
    sc = cp_scenario(2, 2, 2, 2, 1, "a2a", True, seq=384)
    assert "--cp-comm-type a2a" in cp_shadow_why_not(sc, Shortcuts.for_scale(sc), "none")
    sc = cp_scenario(2, 2, 4, 2, 1, "p2p", True, seq=384)
    assert cp_shadow_why_not(sc, Shortcuts.for_scale(sc), "full") == "traced compute"
    assert "the full simulation" in cp_shadow_why_not(sc, Shortcuts(), "none")
    tied = tied_scenario(2, 2, 4, 2, 1, "p2p", True, seq=384)
    assert cp_shadow_why_not(tied, Shortcuts.for_scale(tied), "none") == "tied embeddings"
