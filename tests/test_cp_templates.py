"""Layer templates with context parallelism (model/replay.py SplitTemplate): a simulated rank's
layer step is recorded once, split at its CP attention calls, and replayed with those calls run
for real. On small CP layouts whose ranks wait on each other in every call (CP across nodes, CP
with TP and PP interleaved, CP 3 over uneven hops, a2a, a2a+p2p, allgather, the core recomputed
inside the backward, CP inside a node) the iteration with templates equals the same run without them (every
layer op run) and the full simulation (`Shortcuts()`): iteration time and every stage's exposure
to 1e-9 s, every simulated rank's memory peaks and FLOPs equal, busy seconds to 1e-12. A replay
that skips one segment's time, or one ledger change, fails that comparison."""

from dataclasses import replace

import pytest

from simsp.metrics.collect import collect
from simsp.model import replay
from simsp.training.driver import iteration
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
from tests.test_cp_lone_ring import cp_scenario
from tests.test_cp_shortcuts import exposures_apart


@pytest.fixture(autouse=True)
def every_cp_rank_runs(monkeypatch):
    """Every simulated CP rank runs its own program, its own counters and ledger compared
    (a CP group as one program: tests/test_cp_shadows.py)."""
    monkeypatch.setattr(iteration, "cp_shadow_why_not", lambda *args: "each rank compared")


def _run(sc, shortcuts):
    """(metrics, per simulated rank (FLOPs, comm bytes, busy s, peaks), events, templates)."""
    run = simulate_iteration(sc, shortcuts, trace="none")
    ranks = {rank: (dict(r.flops), dict(r.comm_bytes), dict(r.busy_s),
                    r.ledger.summary().peak_total, r.ledger.summary().peak_by_category)
             for rank, r in run.inputs.world.ranks.items()}
    split = getattr(run.inputs.layers, "split", {})
    return collect(run, shortcuts), ranks, next(run.inputs.world.env._eid), split


def _agree(ranks: dict, other: dict) -> bool:
    """FLOPs, bytes and peaks equal, busy seconds to 1e-12 (replays add them n at once)."""
    for rank, (flops, comm, busy, peak, by_category) in ranks.items():
        o_flops, o_comm, o_busy, o_peak, o_by_category = other[rank]
        if (flops, comm, peak, by_category) != (o_flops, o_comm, o_peak, o_by_category):
            return False
        if busy.keys() != o_busy.keys() or any(
                abs(busy[k] - o_busy[k]) > 1e-12 * max(1.0, abs(o_busy[k])) for k in busy):
            return False
    return True


# cp_scenario(gpn, t, cp, p, d, comm type, interleaved), overrides, against the full simulation
# here (tests/test_cp_lone_ring.py, test_cp_ring_pass.py and test_cp_shortcuts.py compare the
# others' fast runs, templates included, with it)
LAYOUTS = {
    "cp2_across_nodes": ((4, 4, 2, 2, 1, "p2p", False), {}, False),
    "cp4_tp2_pp2_interleaved": ((2, 2, 4, 2, 1, "p2p", True), {}, False),
    "cp3_uneven_hops": ((4, 2, 3, 1, 1, "p2p", False), {}, True),
    "a2a_p2p": ((2, 1, 4, 1, 1, "a2a+p2p", False), {}, True),
    "a2a": ((4, 2, 2, 2, 1, "a2a", False), {}, False),
    "allgather": ((4, 4, 2, 2, 1, "allgather", False), {}, False),
    "selective_core_attn": ((2, 2, 4, 2, 1, "p2p", True),
                            {"recompute_granularity": "selective"}, False),
    "cp4_in_a_node": ((4, 1, 4, 2, 1, "p2p", False), {}, False),
}


def _scenario(args, overrides):
    sc = cp_scenario(*args, seq=96 * args[2])
    return replace(sc, parallel=replace(sc.parallel, **overrides)) if overrides else sc


@pytest.mark.parametrize("name", LAYOUTS)
def test_split_templates_equal_every_op_run_and_full_simulation(name):
    args, overrides, against_full = LAYOUTS[name]
    sc = _scenario(args, overrides)
    fast = Shortcuts.for_scale(sc)
    assert fast.templates and fast.why()["templates"].startswith("used: every layer step of "
                                                                 "a simulated rank")
    metrics, ranks, events, split = _run(sc, fast)
    direct, direct_ranks, direct_events, _ = _run(sc, replace(fast, templates=False))
    assert split and events < direct_events
    assert exposures_apart(metrics, direct) <= 1e-9
    assert _agree(ranks, direct_ranks)
    if against_full:
        full, _, _, _ = _run(sc, Shortcuts())
        assert exposures_apart(metrics, full) <= 1e-9
    if overrides:  # the core recomputed: the backward's template holds two CP calls
        calls = {kind[1][0]: [p.method for p in tpl.pieces if isinstance(p, replay.CpCall)]
                 for kind, tpl in split.items()}
        assert calls == {"F": ["forward"], "B": ["forward", "backward"]}


def _without_transients(block):
    """The block less every tensor it allocates then frees and touches in no other way."""
    ops = [(op.offset_s, op.delta_bytes, op.key, op.category, op.op) for op in block.ops]
    signs = {}
    for _, delta, key, _, _ in ops:
        signs.setdefault(key, []).append(delta > 0)
    transient = {key for key, seen in signs.items() if seen == [True, False]}
    return replay.OpBlock(tuple(op for op in ops if op[2] not in transient), block.categories)


def test_a_replay_skipping_ops_fails(monkeypatch):
    """Replays that leave out their first segment's time, or their segments' transient
    tensors, move the iteration or the memory peaks away from the every-op run."""
    args, overrides, _ = LAYOUTS["cp2_across_nodes"]
    sc = _scenario(args, overrides)
    fast = Shortcuts.for_scale(sc)
    direct, direct_ranks, _, _ = _run(sc, replace(fast, templates=False))
    honest = replay._replay_split

    def no_time(r, tpl, x):
        first = replace(tpl.pieces[0], duration_s=0.0)
        return honest(r, replace(tpl, pieces=(first,) + tpl.pieces[1:]), x)

    def no_transients(r, tpl, x):
        pieces = tuple(replace(p, block=_without_transients(p.block))
                       if isinstance(p, replay.Segment) else p for p in tpl.pieces)
        return honest(r, replace(tpl, pieces=pieces), x)

    monkeypatch.setattr(replay, "_replay_split", no_time)
    metrics, _, _, _ = _run(sc, fast)
    assert exposures_apart(metrics, direct) > 1e-9
    monkeypatch.setattr(replay, "_replay_split", no_transients)
    _, ranks, _, _ = _run(sc, fast)
    assert not _agree(ranks, direct_ranks)


def test_sm_contention_refuses_split_templates():
    """Under --sm-contention a CP exchange's kernels could slow the compute beside them: the
    verdict says so and no template is recorded."""
    sc = cp_scenario(4, 4, 2, 2, 1, "p2p", seq=192)
    sc = replace(sc, cluster=replace(sc.cluster, sm_contention=True))
    fast = Shortcuts.for_scale(sc)
    assert not fast.templates
    assert fast.why()["templates"].startswith("not used: SM contention")
    assert not _run(sc, fast)[3]
