"""The zero-bubble schedules run event by event (docs/schedules.md): every gradient equal to
the single-device reference with the weight gradients deferred to W steps (TP+SP, PP 4, DP with
overlapped bucket reduction, and MoE with EP), ZB-H1's first-stage activation peak equal to
1F1B's, and the run's stage idle time equal to the ZB paper's closed forms with the run's own
step times."""

import pytest

from simsp.errors import UserError
from simsp.training.driver.compare import compare_with_reference
from simsp.training.driver.iteration import simulate_iteration
from simsp.training.pipeline.op_timing import Durations, simulate_ops
from tests.test_moe_expert_parallel import scenario as moe_scenario
from tests.test_pipeline import big_meta, run_metrics, scenario, stage_activation_peaks


def only_model_state_left(run) -> bool:
    """Nothing but weights, gradients and optimizer state outlives the iteration (every W
    step freed what its B held)."""
    return all({c for c, b in r.ledger.current.items() if b} == {"weights", "gradients",
                                                                 "optimizer"}
               for r in run.inputs.world.ranks.values())


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-h2"])
def test_numeric_iteration_equals_the_single_device_reference(schedule):
    """t 2 with SP, p 4, d 2, m = 8 (ZB-H2's 2p - 1 warm-up fits), DP buckets reduced as soon
    as the last micro-batch's W makes them ready."""
    parallel = {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                "pipeline_model_parallel_size": 4, "data_parallel_size": 2,
                "micro_batch_size": 1, "global_batch_size": 16, "schedule": schedule,
                "overlap_grad_reduce": True, "ddp_bucket_size": 3000}
    sc = scenario(model={"num_layers": 4}, parallel=parallel, cluster={"nodes": 2})
    run = simulate_iteration(sc)
    errors = compare_with_reference(run)
    assert max(errors.values()) <= 1e-10, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    assert only_model_state_left(run)
    kinds = [kind for kind, *_ in run.results.steps[0]]
    assert kinds.count("W") == kinds.count("B") == 8


def test_moe_with_expert_parallelism_equals_the_reference():
    """EP 2 over DP 2 with PP 2, all-to-all dispatch, top-2 with dropping, ZB-H1."""
    sc = moe_scenario(pipeline_model_parallel_size=2, moe_expert_capacity_factor=0.5,
                      global_batch_size=16, schedule="zb-h1")
    run = simulate_iteration(sc)
    errors = compare_with_reference(run)
    assert max(errors.values()) <= 1e-10, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    assert only_model_state_left(run)


def pipeline_only(schedule: str):
    """p 4, t 1, m 8: layers heavy enough that the end stages' embedding and head are small."""
    return big_meta(schedule=schedule, global_batch_size=16, tensor_model_parallel_size=1,
                    sequence_parallel=False)


def idle_against_unit_time(schedule: str, ops_of) -> list[tuple[float, float]]:
    """p 4, m 8, t 1: per stage (its idle time within the iteration, from the first step's start
    on any stage to the last end; op_timing.simulate_ops's bubble of `ops_of(p, m)`'s op lists
    with the run's own F, B, W times of a middle stage)."""
    sc = pipeline_only(schedule)
    steps = simulate_iteration(sc).results.steps
    ranks = sorted(steps)[:sc.parallel.pp]
    times = {kind: end - begin for kind, *_, begin, end in reversed(steps[ranks[1]])}
    timeline = simulate_ops(ops_of(sc.parallel.pp, sc.parallel.num_micro_batches),
                            Durations(times["F"], times["B"], times["W"]))
    start = min(steps[r][0][3] for r in ranks)
    end = max(steps[r][-1][4] for r in ranks)
    return [(end - start - sum(e - b for *_, b, e in steps[r]), timeline.bubble(stage))
            for stage, r in enumerate(ranks)]


def stage_rows(metrics) -> list[dict]:
    """The tp 0, dp 0 rank of each stage, in stage order."""
    return [r for r in metrics["ranks"] if r["tp"] == r["dp"] == 0]


def test_first_stage_peaks_are_the_papers():
    """ZB-H1 keeps 1F1B's p - r micro-batches between F and B on stage r (arXiv:2401.10241
    §2.1): every stage's activation peak is 1F1B's to the byte; its W of micro-batch i waits for
    its B of i + r, so r + 1 Ws are pending at most, each holding what the first stage's one
    holds (held_for_wgrad, a middle stage's one layer's worth), and every later stage's peak is
    above 1F1B's. ZB-H2's first stage holds 2p - 1 micro-batches (§2.2): 1F1B's p
    micro-batches' peak times (2p - 1)/p, to the byte, and no later stage more."""
    p = 4
    one_f_one_b = run_metrics(pipeline_only("1f1b"))
    zb_h1_run = run_metrics(pipeline_only("zb-h1"))
    zb_h1 = stage_activation_peaks(zb_h1_run)
    assert zb_h1 == stage_activation_peaks(one_f_one_b)
    held = [r["peak_by_category_bytes"]["held_for_wgrad"] for r in stage_rows(zb_h1_run)]
    assert held[1:3] == [2 * held[0], 3 * held[0]] and held[0] > 0
    assert all(z["peak_bytes"] > o["peak_bytes"]
               for z, o in zip(stage_rows(zb_h1_run)[1:], stage_rows(one_f_one_b)[1:]))
    one_f_one_b = stage_activation_peaks(one_f_one_b)
    zb_h2 = stage_activation_peaks(run_metrics(pipeline_only("zb-h2")))
    assert zb_h2[0] * p == one_f_one_b[0] * (2 * p - 1)
    assert max(zb_h2) == zb_h2[0]


def stage_idle_and_step_times(sc):
    """The largest stage idle between its own first and last step, and (T_F, T_B, T_W) of a
    middle stage (no embedding, no head), from the run's recorded steps."""
    run = simulate_iteration(sc)
    idle = 0.0
    for steps in run.results.steps.values():
        work = sum(end - begin for *_, begin, end in steps)
        idle = max(idle, steps[-1][4] - steps[0][3] - work)
    middle = run.results.steps[min(run.results.steps) + 1]
    times = {kind: end - begin for kind, *_, begin, end in middle}
    return idle, (times["F"], times["B"], times["W"])


@pytest.mark.parametrize("schedule,w_factor", [("zb-h1", 1), ("zb-h2", 2)])
def test_stage_idle_is_the_papers_closed_form(schedule, w_factor):
    """ZB §2: the largest stage idle is (p-1)(T_F+T_B-T_W) for ZB-H1, (p-1)(T_F+T_B-2T_W) for
    ZB-H2, here with the run's own step times; what is over is the p2p transfers on the
    critical path (2(p - 1) hops of an 8 MiB activation or gradient over NVLink) and the end
    stages' embedding, head and loss (unfused cross-entropy, Megatron's default,
    docs/fusions.md): 1.4% (ZB-H1) and 2.8% (ZB-H2) here, so within 3%."""
    sc = pipeline_only(schedule)
    p = sc.parallel.pp
    idle, (f, b, w) = stage_idle_and_step_times(sc)
    closed_form = (p - 1) * (f + b - w_factor * w)
    assert closed_form <= idle <= closed_form * 1.03


@pytest.mark.parametrize("field,value", [("use_megatron_fsdp", True), ("cpu_offloading", True)])
def test_what_zero_bubble_does_not_run_with_is_refused(field, value):
    with pytest.raises(UserError, match=f"parallel.{field}"):
        scenario(parallel={"schedule": "zb-h1", "pipeline_model_parallel_size": 2, field: value})
