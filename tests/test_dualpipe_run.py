"""DualPipe runs event by event (docs/dualpipe.md): every rank holds two stages (stage r as
chunk 0 of the down pipeline, stage p-1-r as chunk 1 of the up one), micro-batches 0..m/2-1
enter at rank 0 and m/2..m-1 at rank p-1, and each stage's two copies' gradients are summed
over the mirror pair (deepseek-ai/DualPipe examples/example_dualpipe.py). Checked: every
gradient equal to the single-device reference, on both copies; each rank's idle against the
unit-time scheduler on DualPipe's own op lists; PP + 1 stage activations per rank (DeepSeek-V3
report Table 2); and DualPipe's refusals."""

import numpy as np
import pytest

from simsp.errors import UserError
from simsp.training.driver.compare import compare_with_reference
from simsp.training.driver.iteration import simulate_iteration
from simsp.training.pipeline.dualpipe import dualpipe, dualpipe_steps
from simsp.training.pipeline.op_timing import Durations, simulate_ops
from tests.test_pipeline import run_metrics, scenario, stage_activation_peaks
from tests.test_zero_bubble_run import (idle_against_unit_time, only_model_state_left,
                                        pipeline_only)


@pytest.mark.parametrize("pp,t,d", [(4, 2, 2), (8, 1, 1)])
def test_numeric_iteration_equals_the_single_device_reference(pp, t, d):
    """PP 4 with t 2 + SP and d 2 (overlapped buckets, each chunk's after its last W), and PP 8,
    m 2·PP: loss and every gradient within 1e-10 of the reference, and each stage's two copies
    (rank r's chunk 0, rank p-1-r's chunk 1) holding the same, full gradient."""
    parallel = {"tensor_model_parallel_size": t, "sequence_parallel": t > 1,
                "pipeline_model_parallel_size": pp, "data_parallel_size": d,
                "micro_batch_size": 1, "global_batch_size": 2 * pp * d, "schedule": "dualpipe",
                "overlap_grad_reduce": True, "ddp_bucket_size": 3000}
    sc = scenario(model={"num_layers": pp}, parallel=parallel, cluster={"nodes": 2})
    run = simulate_iteration(sc)
    errors = compare_with_reference(run)
    assert max(errors.values()) <= 1e-10, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    assert only_model_state_left(run)
    plans, states = run.inputs.plans, run.states
    for rank, plan in plans.items():
        mirror = run.inputs.rank_of(plan.tp, plan.dp, pp - 1 - plan.pp, plan.cp)
        assert sorted(states[rank].grads) == sorted(states[mirror].grads)
        for name, grad in states[rank].grads.items():
            assert np.array_equal(grad.data, states[mirror].grads[name].data), name


def test_uneven_stages_equal_the_reference_with_each_pipeline_split_as_megatrons():
    """Megatron's uneven split (first stage 3 layers, last 1, the middle 2 each of 8) on both
    pipelines: rank r holds stage r's layers as chunk 0 and stage p-1-r's as chunk 1 (rank 0:
    layers 0-2 and 7, as DeepSeek-V3 pairs its heavy first stage with its light last one);
    every gradient within 1e-10 of the reference."""
    parallel = {"pipeline_model_parallel_size": 4, "micro_batch_size": 1,
                "global_batch_size": 8, "schedule": "dualpipe",
                "decoder_first_pipeline_num_layers": 3, "decoder_last_pipeline_num_layers": 1}
    run = simulate_iteration(scenario(model={"num_layers": 8}, parallel=parallel))
    layers = {plan.pp: [list(plan.layers(chunk)) for chunk in (0, 1)]
              for plan in run.inputs.plans.values()}
    assert layers == {0: [[0, 1, 2], [7]], 1: [[3, 4], [5, 6]], 2: [[5, 6], [3, 4]],
                      3: [[7], [0, 1, 2]]}
    errors = compare_with_reference(run)
    assert max(errors.values()) <= 1e-10, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    assert only_model_state_left(run)


def test_the_run_executes_dualpipes_op_lists():
    """The steps are upstream's ops in order, a pair as its F then its BW and a BW as B then W:
    rank 0 of PP 4, m 8 starts with upstream's step 1 (2(n-h-1) = 2 F0) and step 2 (F0 F1)."""
    steps = dualpipe_steps(4, 8)
    tasks = [t for op in dualpipe(4, 8).ops[0] for t in op.tasks]
    assert [str(s) for s in steps[0][:4]] == ["F0", "F1", "F2", "F4.1"]
    assert len(steps[0]) == sum(2 if t.kind == "BW" else 1 for t in tasks)


@pytest.mark.parametrize("pp,m", [(4, 8), (8, 16), (8, 24)])
def test_the_executed_steps_bubble_is_table_2s_with_pairs_sent_at_their_end(pp, m):
    """F = B = W = 1, no communication: the op lists the run executes, a pair (F and BW, 3 units)
    sending both outputs at its end, idle (PP/2 - 1)(F&B + B - 3W) on every rank, Table 2's B
    being the whole backward (2 units): (PP/2 - 1)(3 + 2 - 3)."""
    timeline = simulate_ops(dualpipe(pp, m), Durations(1.0, 1.0, 1.0))
    for rank in range(pp):
        assert timeline.bubble(rank) == pytest.approx((pp / 2 - 1) * (3 + 2 - 3), abs=1e-12)


def test_each_ranks_idle_is_the_unit_time_schedulers():
    """p 4, m 8, t 1: each rank's idle within the iteration against op_timing.simulate_ops of
    DualPipe's op lists with the run's own F, B, W times of a middle rank: within 4% (what is
    over is the p2p hops and the end ranks' embedding, head and loss)."""
    for idle, unit_time in idle_against_unit_time("dualpipe", dualpipe):
        assert idle == pytest.approx(unit_time, rel=0.04)


def test_every_rank_holds_pp_plus_1_stage_activations():
    """Table 2's PP + 1 micro-batches of one stage on every DualPipe rank (p 4, m 8), a stage's
    micro-batch being 1F1B's stage-1 peak less its stage-2 peak: the middle ranks to the byte,
    the end ranks (embedding and head) at most 1% more."""
    p = 4
    one_f_one_b = stage_activation_peaks(run_metrics(pipeline_only("1f1b")))
    unit = one_f_one_b[1] - one_f_one_b[2]
    peaks = stage_activation_peaks(run_metrics(pipeline_only("dualpipe")))
    assert peaks[1:p - 1] == [(p + 1) * unit] * (p - 2)
    for end in (peaks[0], peaks[-1]):
        assert (p + 1) * unit <= end <= 1.01 * (p + 1) * unit


@pytest.mark.parametrize("parallel,field,reason", [
    ({"pipeline_model_parallel_size": 2, "global_batch_size": 5}, "global_batch_size",
     "even number of micro-batches, at least 2 x 2, got 5"),
    ({"pipeline_model_parallel_size": 4, "global_batch_size": 6}, "global_batch_size",
     "at least 2 x 4"),
    ({"pipeline_model_parallel_size": 1}, "pipeline_model_parallel_size",
     "even number of pipeline ranks, got 1")])
def test_what_dualpipe_refuses(parallel, field, reason):
    """DualPipe's asserts (dualpipe.py: even ranks, even micro-batches >= 2 x ranks) and what
    it does not run with yet, each an error on its field."""
    with pytest.raises(UserError, match=reason) as error:
        scenario(model={"num_layers": 8},
                 parallel={"schedule": "dualpipe", "global_batch_size": 8, **parallel})
    assert error.value.field == f"parallel.{field}"
