"""Step replays of the replicas kept beside replica 0 (training/pipeline/step_replay.py): where
DP replicas are placed unlike on the leaves, each replica after the first of its placement runs
the first forward and backward of every chunk on each stage and replays the others' times and
sends. Iteration time and every stage's exposure equal the full simulation (`Shortcuts()`) to
1e-9 and, with the memory rows and counted FLOPs, the run with every step of those replicas
executed; replaying one stage's record on another (a stage's own steps dropped) is off."""

from dataclasses import replace

import pytest

import simsp.shortcuts.plan as plan_module
import simsp.training.pipeline.step_replay as step_replay
from simsp.shortcuts.check import Shortcuts
from simsp.shortcuts.plan import timing_plan
from tests.test_placement_replicas import layout
from tests.test_representative_audit import largest_gap, metrics, scenario


def replayed_replicas(sc, shortcuts) -> set[int]:
    """The DP indices of the ranks whose steps the plan replays."""
    per_stage = sc.parallel.tp * sc.parallel.dp
    return {rank % per_stage // sc.parallel.tp for rank in timing_plan(sc, shortcuts).replayed}


@pytest.mark.parametrize("label", ["interleaved", "t2 p3 d4 on 1-GPU nodes, leaves of 20",
                                   "t1 p3 d6 on 1-GPU nodes, leaves of 4, pods of 2"])
def test_replays_equal_every_step_run(label, tmp_path, monkeypatch):
    """Replica 0 and the first replica of each other placement run (tests/test_placement_replicas.py);
    the others' steps replay: exact against `Shortcuts()`, and the memory rows, counted FLOPs
    and per-stage exposure those of the run that executes every step (to 1e-12)."""
    sc = layout(label, tmp_path)
    fast = Shortcuts.for_scale(sc)
    assert replayed_replicas(sc, fast) == set(fast.replicas) - {0}
    replayed = metrics(sc, fast)
    assert largest_gap(replayed, metrics(sc, Shortcuts())) < 1e-9
    monkeypatch.setattr(plan_module, "step_replay_why_not", lambda sc: "off")
    assert replayed_replicas(sc, fast) == set()
    executed = metrics(sc, fast)
    assert largest_gap(replayed, executed) < 1e-12
    assert replayed["ranks"] == executed["ranks"]  # each replayed rank's rows: replica 0's
    assert replayed["counted_hardware_flops"] == executed["counted_hardware_flops"]


def test_stages_replaying_the_first_stages_times_are_off(monkeypatch):
    """Break test: t1 p3 d8 on 1-GPU nodes, leaves of 20, replica 4 replayed beside replica 0:
    its later stages replaying the times of its first stage's steps once recorded (whose
    forward holds the embedding, whose backward its gradient) in place of their own are more
    than 1e-3 off the full simulation."""
    sc = scenario(1, 1, 3, 8, False, False, untied=True)
    fast = Shortcuts.for_scale(sc)
    full = metrics(sc, Shortcuts())
    assert largest_gap(metrics(sc, fast), full) < 1e-9
    per_stage, real_replay = sc.parallel.tp * sc.parallel.dp, step_replay._replay

    def first_stages(kind, args, mb, chunk, record):
        first = args[1].replays.records.get((args[0].rank % per_stage, kind, chunk), record)
        return real_replay(kind, args, mb, chunk, replace(record, duration_s=first.duration_s))

    monkeypatch.setattr(step_replay, "_replay", first_stages)
    assert largest_gap(metrics(sc, fast), full) > 1e-3  # 4.3e-3


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
    from simsp.training.driver.iteration import simulate_iteration
    sc = scenario(1, 1, 3, 8, False, False, untied=True)
    run = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="full")
    assert run.inputs.replayed == {4, 12, 20}  # replica 4 on stages 0-2 (t1 d8)
    assert [rank for rank, _ in trace_plan(run, "full").ranks] == [0, 8, 16]
    assert all(ledger_of(run, rank) is run.inputs.world.ranks[rank - 4].ledger
               for rank in (4, 12, 20))
