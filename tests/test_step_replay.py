"""Step replays of the replicas kept beside replica 0 (training/pipeline/step_replay.py): where
DP replicas are placed unlike on the leaves, each replica after the first of its placement runs
the first forward and backward of every chunk on each stage until two runs agree, then replays
the others' timeouts and sends. Iteration time and every stage's exposure equal the full
simulation (`Shortcuts()`) to 1e-9 and, bit for bit with the memory rows and counted FLOPs, the
run with every step of those replicas executed; a replay that loses its step's time is off."""

from dataclasses import replace

import pytest

import simsp.shortcuts.plan as plan_module
import simsp.training.pipeline.step_replay as step_replay
from simsp.metrics.collect import collect
from simsp.shortcuts.check import Shortcuts
from simsp.training.driver.iteration import simulate_iteration
from tests.test_fsdp_leaf_replicas import tiny_leaves
from tests.test_representative_audit import largest_gap, metrics, scenario

LAYOUTS = {  # label -> (gpn, t, p, d, interleaved, leaf, core): tests/test_placement_replicas.py's
    "t1 p3 d8, leaves of 20": (1, 1, 3, 8, False, None, False),
    "interleaved": (1, 1, 3, 8, True, None, False),
    "t2 p3 d4 (TP across nodes)": (1, 2, 3, 4, False, None, False),
    "t1 p3 d6, leaves of 4, pods of 2": (1, 1, 3, 6, False, 4, True),
}


def layout(label, tmp_path, micro=6):
    """LAYOUTS[label] with `micro` micro-batches per stage (enough for replays to start)."""
    gpn, t, p, d, interleaved, leaf, core = LAYOUTS[label]
    sc = scenario(gpn, t, p, d, interleaved, False, untied=True, micro=micro)
    if leaf is None:
        return sc
    return replace(sc, cluster=replace(sc.cluster, system=str(tiny_leaves(tmp_path, gpn, leaf,
                                                                          core))))


def replayed_metrics(sc, shortcuts) -> tuple[dict, int]:
    """Metrics of one meta iteration and how many steps replayed."""
    run = simulate_iteration(sc, shortcuts, trace="none")
    return collect(run, shortcuts), run.inputs.replays.replayed_steps if run.inputs.replays else 0


def replayed_ranks(sc, shortcuts) -> int:
    """How many ranks the timing plan marks replayed (training/pipeline/step_replay.py)."""
    return len(plan_module.timing_plan(sc, shortcuts).replayed)


@pytest.mark.parametrize("label", sorted(LAYOUTS))
def test_replays_equal_every_step_run(label, tmp_path, monkeypatch):
    """The replicas beside replica 0 replay most of their steps: equal to `Shortcuts()` to
    1e-9, and bit for bit (iteration, every stage's exposure, memory rows, counted FLOPs) to
    the run that executes every step."""
    sc = layout(label, tmp_path)
    fast = Shortcuts.for_scale(sc)
    assert len(fast.replicas) > 1
    replayed, replays = replayed_metrics(sc, fast)
    assert replays > 0
    replaying = replayed_ranks(sc, fast)
    assert largest_gap(replayed, metrics(sc, Shortcuts())) < 1e-9
    monkeypatch.setattr(plan_module, "step_replay_why_not", lambda sc: "off")
    executed, replays = replayed_metrics(sc, fast)
    assert replays == 0
    for key in ("iteration_time_s", "exposed_s_per_stage", "counted_hardware_flops"):
        assert replayed[key] == executed[key], key
    assert [dict(r, simulated=None) for r in replayed["ranks"]] == [
        dict(r, simulated=None) for r in executed["ranks"]]
    # a replayed rank's memory row is its stage's replica 0's: not its own, so not "simulated"
    mine = sum(r["simulated"] for r in replayed["ranks"])
    assert mine == sum(r["simulated"] for r in executed["ranks"]) - replaying
    assert "replay their steps" in replayed["shortcuts_used"]["representative"]
    assert "replay" not in executed["shortcuts_used"]["representative"]


def test_a_replay_that_loses_its_step_is_off(monkeypatch):
    """Break test: t1 p3 d8 on 1-GPU nodes, leaves of 20, replica 4 replaying its middle
    stage's steps (the first and last stage run every step: their embedding and head wait on
    collectives, not timeouts): a replay that waits its record's timeouts but the last (here
    none: the replayed steps dropped) is as far off the full simulation as replica 4 left out
    (6.8e-3): the replayed replica arrives at the DP rings early."""
    sc = scenario(1, 1, 3, 8, False, False, untied=True, micro=6)
    fast = Shortcuts.for_scale(sc)
    full = metrics(sc, Shortcuts())
    real_wait = step_replay._wait_delays

    def one_short(env, delays, begin_at):
        return (yield from real_wait(env, delays[:-1], min(begin_at, len(delays) - 1)))

    monkeypatch.setattr(step_replay, "_wait_delays", one_short)
    assert largest_gap(metrics(sc, fast), full) > 1e-3


def test_steps_never_confirmed_stop_being_recorded(monkeypatch):
    """A step that waits on another event than a timeout (the last stage's backward, on its
    loss's collectives) is never confirmed: after GIVE_UP_AFTER such runs in a row it runs
    unrecorded. Bit for bit (iteration, every stage's exposure, memory rows, counted FLOPs)
    the run that records every step, the other steps replaying as many times (t1 p3 d8,
    leaves of 20: replica 4 on stages 0-2)."""
    sc = scenario(1, 1, 3, 8, False, False, untied=True, micro=6)
    fast = Shortcuts.for_scale(sc)
    monkeypatch.setattr(step_replay, "GIVE_UP_AFTER", 10 ** 9)
    recorded, replays = replayed_metrics(sc, fast)
    monkeypatch.setattr(step_replay, "GIVE_UP_AFTER", 1)
    run = simulate_iteration(sc, fast, trace="none")
    assert {key for key, n in run.inputs.replays.inexact.items() if n} == {(20, "B", 0)}
    assert run.inputs.replays.replayed_steps == replays > 0
    unrecorded = collect(run, fast)
    for key in ("iteration_time_s", "exposed_s_per_stage", "counted_hardware_flops", "ranks"):
        assert unrecorded[key] == recorded[key], key


@pytest.mark.parametrize("overrides, blocker", [
    ({"overlap_grad_reduce": True}, "overlapped DP communication"),
    ({"overlap_p2p_communication": True, "num_layers_per_virtual_pipeline_stage": 1},
     "overlapped p2p"),
    ({"delay_wgrad_compute": True}, "delayed weight gradients"),
])
def test_steps_that_are_not_pure_delays_run(overrides, blocker):
    """Where a step may meet other work on its rank (overlapped DP or p2p communication,
    deferred weight gradients), no step replays (shortcuts/plan.py step_replay_why_not)."""
    sc = scenario(1, 1, 3, 8, False, False, untied=True)
    sc = replace(sc, parallel=replace(sc.parallel, **overrides))
    assert blocker in plan_module.step_replay_why_not(sc)


def test_the_audited_rows_replay():
    """benchmarks/speed.py's 530b-d8 and 1t-d6: their replicas placed unlike replay."""
    from simsp.scenario.loading import load_scenario
    for path, d, nodes in (("scenarios/paper-530b.toml", 8, 280),
                           ("scenarios/paper-1t.toml", 6, 384)):
        sc = load_scenario(path, {("parallel", "data_parallel_size"): d,
                                  ("parallel", "global_batch_size"): {8: 2240, 6: 3072}[d],
                                  ("cluster", "nodes"): nodes})
        assert plan_module.step_replay_why_not(sc) == ""


def test_replayed_ranks_are_left_out_of_the_trace():
    """The replayed ranks are timing only: the trace lays out replica 0's ranks alone, and the
    replayed ranks' memory is read from replica 0's rank of their stage."""
    from simsp.metrics.memory import ledger_of
    from simsp.report.run.trace.plan import trace_plan
    sc = scenario(1, 1, 3, 8, False, False, untied=True)
    run = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="full")
    assert run.inputs.replayed == {4, 12, 20}  # replica 4 on stages 0-2 (t1 d8)
    assert [rank for rank, _ in trace_plan(run, "full").ranks] == [0, 8, 16]
    assert all(ledger_of(run, rank) is run.inputs.world.ranks[rank - 4].ledger
               for rank in (4, 12, 20))
