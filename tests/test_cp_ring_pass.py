"""A p2p ring call worked out for its whole CP group in max-plus arithmetic
(training/context_parallel/ring_pass.py) ends every rank's steps, sends and waits at the very
floats the event run does: with the pass and without it (each step one timeout, each send one
event, context_parallel/ring.py) iteration time, every stage's exposure, every simulated rank's
counters and memory peaks agree to the bit, on layouts whose ranks enter each call at different
times; and the pass equals the full simulation (`Shortcuts()`: every send a fair-shared flow,
every kernel on the stream) to 1e-9 s. A pass that drops one rank's step fails."""

from dataclasses import replace

import pytest
import simpy

from simsp.metrics.collect import collect
from simsp.scenario.work import (CP_LONE_SECONDS_PER_RANK_PAIR, CP_PASS_SECONDS_PER_RANK_PAIR,
                                 layer_steps, pair_seconds)
from simsp.training.context_parallel import attention, ring_pass
from simsp.training.driver import iteration
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
from tests.test_cp_lone_ring import cp_scenario
from tests.test_cp_shortcuts import exposures_apart


@pytest.fixture(autouse=True)
def every_cp_rank_runs(monkeypatch):
    """Every simulated CP rank runs its own program, its own counters and ledger compared
    (a CP group as one program: tests/test_cp_shadows.py)."""
    monkeypatch.setattr(iteration, "cp_shadow_why_not", lambda *args: "each rank compared")


def _run(sc, shortcuts, monkeypatch, arithmetic: bool):
    """(metrics, per simulated rank (counters, memory peaks), events, ring passes worked)."""
    passes = []
    work = ring_pass.forward_pass

    def counted(ring, entries, steps=True):
        passes.append(ring.cp)
        return work(ring, entries, steps)

    with monkeypatch.context() as patch:
        patch.setattr(ring_pass, "forward_pass", counted)
        if not arithmetic:
            patch.setattr(attention, "charged_apart", lambda r: False)
        run = simulate_iteration(sc, shortcuts, trace="none")
    ranks = {rank: (r.flops, r.busy_s, r.exposed_s, r.comm_bytes, r.ledger.summary().peak_total,
                    r.ledger.summary().peak_by_category)
             for rank, r in run.inputs.world.ranks.items()}
    return collect(run, shortcuts), ranks, next(run.inputs.world.env._eid), passes


LAYOUTS = [  # gpn, t, cp, p, interleaved; against the full simulation here or not
    # (tests/test_cp_lone_ring.py compares the first three, now run by the pass, with it)
    (4, 4, 2, 2, False, False),  # CP pairs across nodes, each TP group a node
    (2, 2, 4, 2, True, False),  # CP 4 over four nodes, TP 2, PP 2 interleaved
    (4, 1, 4, 2, False, False),  # CP 4 inside a node (NVLink), two stages
    (4, 2, 3, 1, False, True),  # CP 3 of TP 2 on 4-GPU nodes: two hops on NVLink, one on IB
    (2, 1, 8, 1, False, True),  # CP 8 over four 2-GPU nodes: four IB, four NVLink hops
]


@pytest.mark.parametrize("gpn, t, cp, p, interleaved, against_full", LAYOUTS)
def test_ring_pass_equals_event_run_and_full_simulation(gpn, t, cp, p, interleaved,
                                                        against_full, monkeypatch):
    sc = cp_scenario(gpn, t, cp, p, 1, "p2p", interleaved, seq=96 * cp)
    fast = Shortcuts.for_scale(sc)
    metrics, ranks, events, passes = _run(sc, fast, monkeypatch, True)
    event_metrics, event_ranks, event_events, event_passes = _run(sc, fast, monkeypatch, False)
    assert passes and set(passes) == {cp} and not event_passes
    assert events < event_events
    assert metrics == event_metrics and ranks == event_ranks  # to the bit
    if against_full:
        full, _, _, _ = _run(sc, Shortcuts(), monkeypatch, True)
        assert exposures_apart(metrics, full) <= 1e-9


def test_a_pass_dropping_a_step_fails(monkeypatch):
    """Rank 1's step 1 left out of the pass (its block compute and its send, delivered as
    posted, forward and backward) moves the iteration past the tolerance."""
    sc = cp_scenario(4, 2, 3, 1, 1, "p2p", seq=288)
    compute, send = ring_pass._compute, ring_pass._send

    def no_compute(times, phase, step, clock, kernels, end):
        if step == 1:
            first, rest = kernels[0].copy(), tuple(row.copy() for row in kernels[1])  # (c,)
            for row in (first,) + rest:
                row[1] = 0.0
            kernels = (first, rest)
        compute(times, phase, step, clock, kernels, end)

    def no_send(kind, step, posts, start, delivered, lands):
        send(kind, step, posts, start, delivered, lands)
        if step == 1:
            delivered[1] = posts[1]  # (c,) written in place

    monkeypatch.setattr(ring_pass, "_compute", no_compute)
    monkeypatch.setattr(ring_pass, "_send", no_send)
    fast, _, _, passes = _run(sc, Shortcuts.for_scale(sc), monkeypatch, True)
    full, _, _, _ = _run(sc, Shortcuts(), monkeypatch, True)
    assert passes and exposures_apart(fast, full) > 1e-9


def test_estimate_prices_the_pass_only_where_it_runs():
    """The work estimate's CP pairs (scenario/work.py pair_seconds): a lone ring's calls priced
    as worked out in arithmetic, but under SM contention (no pass: steps and sends as events)
    at the lone rate."""
    sc = cp_scenario(4, 2, 3, 1, 1, "p2p", seq=288)
    pairs = layer_steps(sc) * 3 ** 2
    assert pair_seconds(sc, cp_ranks=True, cp_lone=True) == pytest.approx(
        pairs * CP_PASS_SECONDS_PER_RANK_PAIR, rel=1e-12)
    contended = replace(sc, cluster=replace(sc.cluster, sm_contention=True))
    assert pair_seconds(contended, cp_ranks=True, cp_lone=True) == pytest.approx(
        pairs * CP_LONE_SECONDS_PER_RANK_PAIR, rel=1e-12)


def test_a_rank_wakes_exactly_at_its_end_without_a_landing_delay(monkeypatch):
    """Where no single delay lands on a rank's end (model/replay.py delay_to None), the rank
    still wakes at exactly that float: an event queued at it (ring_pass._sleep_until)."""
    env = simpy.Environment()
    woke = []

    def rank():
        yield env.timeout(0.1)
        yield from ring_pass._sleep_until(env, 0.7000000000000001)
        woke.append(env.now)

    monkeypatch.setattr(ring_pass, "delay_to", lambda now, target: None)
    env.process(rank())
    env.run()
    assert woke == [0.7000000000000001]
