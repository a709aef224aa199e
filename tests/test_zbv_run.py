"""ZB-V runs event by event (docs/schedules.md): two chunks per stage placed as a V (stage r
holds virtual stages r and 2p-1-r, embedding and head on stage 0, the turn local to stage p-1),
every gradient equal to the single-device reference, each stage's bubble equal to the unit-time
scheduler's with the run's own step times, and each stage's activation peak p stages' worth
(2p half-stage chunks, arXiv:2401.10241 §6), as 1F1B's first stage."""

import pytest

from simsp.errors import UserError
from simsp.report.run.figures.schedule import stage_intervals
from simsp.training.driver.compare import compare_with_reference
from simsp.training.driver.iteration import simulate_iteration
from simsp.training.pipeline.dualpipe import dualpipev
from simsp.training.pipeline.op_step import OpSchedule, single
from simsp.training.pipeline.zero_bubble import zbv
from tests.test_pipeline import run_metrics, scenario, stage_activation_peaks
from tests.test_zero_bubble_run import (idle_against_unit_time, only_model_state_left,
                                        pipeline_only)


def zbv_ops(p: int, m: int) -> OpSchedule:
    """ZB-V's step lists as ops, every micro-batch down chunk 0 of stages 0..p-1 and back up
    chunk 1 of stages p-1..0 (the V, arXiv:2401.10241 §6)."""
    route = tuple((stage, 0) for stage in range(p)) + \
        tuple((stage, 1) for stage in reversed(range(p)))
    return OpSchedule("zbv", tuple(tuple(single(s.kind, s.micro_batch, s.chunk) for s in steps)
                                   for steps in zbv(p, m)), tuple(route for _ in range(m)))


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
@pytest.mark.parametrize("pp", [2, 4])
def test_numeric_iteration_equals_the_single_device_reference(pp, schedule):
    """t 2 with SP, d 2 with overlapped bucket reduction (each chunk's buckets after its last
    W), m 8: loss and every gradient, the tied word table summed on stage 0 alone. DualPipeV
    (deepseek-ai/DualPipe dualpipev.py's op lists) runs on the same V, its F&B pairs as F then
    B and its full backwards as B then W."""
    parallel = {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                "pipeline_model_parallel_size": pp, "data_parallel_size": 2,
                "micro_batch_size": 1, "global_batch_size": 16, "schedule": schedule,
                "overlap_grad_reduce": True, "ddp_bucket_size": 3000}
    sc = scenario(model={"num_layers": 2 * pp}, parallel=parallel, cluster={"nodes": 2})
    run = simulate_iteration(sc)
    errors = compare_with_reference(run)
    assert max(errors.values()) <= 1e-10, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    assert only_model_state_left(run)
    chunks = [(kind, chunk) for kind, _mb, chunk, *_ in run.results.steps[0]]
    assert all(chunks.count((kind, c)) == 8 for kind in "FBW" for c in (0, 1))


def test_stage_bubbles_are_the_unit_time_schedulers():
    """p 4, m 8, t 1: each stage's idle time within the iteration (from the first step's start
    on any stage to the last end) against op_timing.simulate_ops of the same step lists with
    the run's own F, B, W times of a middle chunk: within 3% (what is over is the p2p hops and
    stage 0's embedding, head and loss)."""
    for idle, unit_time in idle_against_unit_time("zbv", zbv_ops):
        assert idle == pytest.approx(unit_time, rel=0.03)


def test_dualpipev_ranks_idle_is_its_op_lists_with_full_backwards_sent_after_w():
    """DualPipeV at p 4, m 8, t 1: each rank's idle against op_timing.simulate_ops of
    dualpipev.py's op lists (a pair's and a full backward's outputs sent when the op ends, as
    `_backward_chunk(enable_zb=False)` sends after B and W) with the run's own F, B, W: within
    5% (the p2p hops, rank 0's embedding, head and loss). Sending a full backward's input
    gradient before its W, as the run once did, left 6-8% less idle than upstream's order
    allows."""
    for idle, unit_time in idle_against_unit_time("dualpipev", dualpipev):
        assert idle == pytest.approx(unit_time, rel=0.05)


def test_the_schedule_figure_draws_each_kind_of_step_apart():
    """schedule.png's bars: every stage's 2m F, 2m B and 2m W steps (m micro-batches through
    two chunks) each under its own kind, at the times the run recorded."""
    sc = pipeline_only("zbv")
    run = simulate_iteration(sc)
    m = sc.parallel.num_micro_batches
    for rank, steps in run.results.steps.items():
        bars = stage_intervals(run, rank, [])
        for kind, name in (("F", "forward"), ("B", "backward"), ("W", "weight gradient")):
            recorded = sorted((b, e) for k, *_, b, e in steps if k == kind)
            assert len(recorded) == 2 * m
            assert [tuple(bar) for bar in bars[name]] == recorded


def test_every_stage_holds_the_first_stage_of_1f1b():
    """Activations in flight (docs/schedules.md): 2p chunks of L/2p layers on every stage of
    ZB-V, p micro-batches of L/p layers on 1F1B's first. One micro-batch of one stage's layers
    is 1F1B's stage-1 peak less its stage-2 peak (p-1 and p-2 in flight, no embedding or head);
    ZB-V's stages 1..p-1 hold p of them to the byte; stage 0 holds 1F1B's first stage (its
    embedding output too) and at most 1% more (the head's loss inputs)."""
    p = 4
    one_f_one_b = stage_activation_peaks(run_metrics(pipeline_only("1f1b")))
    unit = one_f_one_b[1] - one_f_one_b[2]
    zbv = stage_activation_peaks(run_metrics(pipeline_only("zbv")))
    assert zbv[1:] == [p * unit] * (p - 1)
    assert one_f_one_b[0] <= zbv[0] <= 1.01 * one_f_one_b[0]


@pytest.mark.parametrize("model,parallel,reason", [
    ({"num_layers": 6}, {}, "divisible by 2 x 2"),
    ({}, {"decoder_first_pipeline_num_layers": 2}, "uneven pipeline stages"),
    ({}, {"pipeline_model_parallel_size": 1}, "pipeline_model_parallel_size > 1"),
    ({}, {"schedule": "dualpipev", "global_batch_size": 2}, "at least 2 x 2 micro-batches")])
def test_what_zbv_does_not_run_with_is_refused(model, parallel, reason):
    with pytest.raises(UserError, match=reason):
        scenario(model={"num_layers": 8, **model},
                 parallel={"schedule": "zbv", "pipeline_model_parallel_size": 2, **parallel})


def test_dualpipev_holds_2n_plus_1_chunks_per_rank():
    """docs/dualpipe.md's hand count: 2n + 1 chunk activations on every DualPipeV rank (n = 4
    ranks, m = 8), a chunk half a stage of 1F1B (unit: 1F1B's stage-1 peak less its stage-2
    peak, one micro-batch of a stage): ranks 1..n-1 to the byte, rank 0 (embedding and head) at
    most 1% more."""
    n = 4
    one_f_one_b = stage_activation_peaks(run_metrics(pipeline_only("1f1b")))
    chunk = (one_f_one_b[1] - one_f_one_b[2]) // 2
    peaks = stage_activation_peaks(run_metrics(pipeline_only("dualpipev")))
    assert peaks[1:] == [(2 * n + 1) * chunk] * (n - 1)
    assert (2 * n + 1) * chunk <= peaks[0] <= 1.01 * (2 * n + 1) * chunk
