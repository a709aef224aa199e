"""Whole iterations: numbers equal to one device, memory equal to K22's first-stage formula,
bubbles equal to N21's, 18 bytes per parameter, nothing left allocated."""

import math

import pytest

from simsp.scenario.loading import load_scenario
from simsp.metrics.collect import collect
from simsp.model.params import param_shapes
from simsp.model.sharding import local_shape
from simsp.training.driver.compare import compare_with_reference
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
from simsp.training.pipeline.plan import stage_param_names


def scenario(**sections):
    overrides = {}
    for section, values in sections.items():
        overrides.update({(section, k): v for k, v in values.items()})
    return load_scenario(None, overrides)


@pytest.mark.parametrize("p,schedule", [(2, "1f1b"), (4, "1f1b"), (2, "interleaved"),
                                        (2, "gpipe")])
def test_numeric_iteration_equals_the_single_device_reference(p, schedule):
    """t 2 with SP, d 2, p stages, 4 micro-batches per replica: loss and every gradient."""
    parallel = {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                "pipeline_model_parallel_size": p, "data_parallel_size": 2,
                "micro_batch_size": 2, "global_batch_size": 16, "schedule": schedule,
                "recompute_granularity": "selective"}
    if schedule == "interleaved":
        parallel["num_layers_per_virtual_pipeline_stage"] = 1
    sc = scenario(model={"num_layers": 4}, parallel=parallel, cluster={"nodes": 2})
    errors = compare_with_reference(simulate_iteration(sc))
    assert max(errors.values()) <= 1e-10, sorted(errors.items(), key=lambda kv: -kv[1])[:3]


def big_meta(**parallel):
    """Layers heavy enough that stages are near-uniform (embedding, head, p2p small)."""
    base = {"tensor_model_parallel_size": 2, "sequence_parallel": True,
            "recompute_granularity": "selective", "pipeline_model_parallel_size": 4,
            "global_batch_size": 8}
    base.update(parallel)
    return scenario(model={"hidden_size": 4096, "num_attention_heads": 32, "seq_length": 1024,
                           "vocab_size": 128, "num_layers": 32},
                    parallel=base, cluster={"nodes": 2}, run={"mode": "meta"})


def run_metrics(sc):
    shortcuts = Shortcuts.for_scale(sc)
    return collect(simulate_iteration(sc, shortcuts), shortcuts)


def stage_activation_peaks(metrics):
    return [r["activation_peak_bytes"] for r in metrics["ranks"] if r["tp"] == r["dp"] == 0]


@pytest.mark.parametrize("parallel", [{}, {"global_batch_size": 16}, {"schedule": "gpipe"},
                                      {"num_layers_per_virtual_pipeline_stage": 2},
                                      {"recompute_granularity": "full",
                                       "sequence_parallel": False}])
def test_first_stage_activations_equal_k22_formula(parallel):
    """K22 Eq. 5/6 with the interleave factor and the embedding mask, within 1%."""
    metrics = run_metrics(big_meta(**parallel))
    measured = stage_activation_peaks(metrics)[0]
    assert measured == pytest.approx(metrics["first_stage_activation_formula_bytes"], rel=0.01)


def test_later_1f1b_stages_hold_fewer_micro_batches():
    """1F1B stage r keeps min(p − r, m) micro-batches in flight (N21 §2.2)."""
    peaks = stage_activation_peaks(run_metrics(big_meta()))
    ratios = [peak / peaks[0] for peak in peaks]
    assert ratios == pytest.approx([1.0, 0.75, 0.5, 0.25], abs=0.01)


@pytest.mark.parametrize("parallel,v", [({}, 1), ({"global_batch_size": 16}, 1),
                                        ({"schedule": "gpipe"}, 1),
                                        ({"global_batch_size": 2}, 1),  # m = 1: N21's ratio 3
                                        ({"num_layers_per_virtual_pipeline_stage": 2}, 4),
                                        ({"num_layers_per_virtual_pipeline_stage": 4,
                                          "global_batch_size": 16}, 2)])
def test_bubble_fraction_matches_n21(parallel, v):
    """Idle over idle plus work: (p−1)/(m+p−1) for GPipe and 1F1B, (p−1)/(v·m+p−1)
    interleaved, i.e. N21's bubble time over ideal time (p−1)/m, (p−1)/(v·m) as a share; the
    small excess is the stages' wait for the embedding/head work of the end stages (real
    stages are not quite uniform) and for the tied-embedding reduction; interleaving makes v
    times more transfers."""
    sc = big_meta(**parallel)
    p, m = sc.parallel.pp, sc.parallel.num_micro_batches
    measured = run_metrics(sc)["bubble_fraction"]
    assert (p - 1) / (v * m + p - 1) <= measured < 1
    n21_ratio = (p - 1) / (v * m)  # bubble time over ideal time, N21 §2.2.1
    assert n21_ratio <= measured / (1 - measured) <= n21_ratio * (1.015 if v == 1 else 1.09)


def test_weights_gradients_optimizer_are_18_bytes_per_parameter():
    """fp16 weight 2 + fp32 grad 4 + fp32 master, Adam m, v 12 (K22 §4), per rank's shard."""
    sc = big_meta(distributed_optimizer=False)
    metrics = run_metrics(sc)
    shapes = param_shapes(sc.model)
    # Megatron pads v = 128 to a multiple of 128·t = 256 rows (make_vocab_size_divisible_by)
    shapes["embedding.word"] = (256, sc.model.hidden_size)
    from simsp.training.pipeline.plan import stage_plans
    from simsp.cluster.grid import RankGrid
    grid = RankGrid(sc.parallel.tp, sc.parallel.pp, sc.parallel.dp)
    plans = stage_plans(sc, grid)
    for row in metrics["ranks"]:
        names = stage_param_names(shapes, plans[row["rank"]])
        params = sum(math.prod(local_shape(n, shapes[n], sc.parallel.tp)) for n in names)
        assert (row["weights_bytes"], row["gradients_bytes"], row["optimizer_bytes"]) == (
            2 * params, 4 * params, 12 * params)


def test_distributed_optimizer_shards_the_optimizer_state_over_dp():
    plain = run_metrics(big_meta(data_parallel_size=2, global_batch_size=16))
    sharded = run_metrics(big_meta(data_parallel_size=2, global_batch_size=16,
                                   distributed_optimizer=True))
    for a, b in zip(plain["ranks"], sharded["ranks"]):
        assert b["optimizer_bytes"] == pytest.approx(a["optimizer_bytes"] / 2, rel=1e-3)
        assert b["weights_bytes"] == a["weights_bytes"]


def test_everything_allocated_is_freed_but_the_model_state():
    """After the optimizer step only weights, gradients and optimizer state remain live."""
    sc = scenario(model={"num_layers": 4}, parallel={
        "tensor_model_parallel_size": 2, "sequence_parallel": True,
        "pipeline_model_parallel_size": 2, "global_batch_size": 4, "micro_batch_size": 1})
    run = simulate_iteration(sc)
    for r in run.inputs.world.ranks.values():
        live = {c: b for c, b in r.ledger.current.items() if b}
        assert set(live) == {"weights", "gradients", "optimizer"}, live


def test_counted_gemm_flops_equal_the_k22_model_flops():
    """The GEMM FLOPs the ranks counted equal 72BLsh²(1 + s/6h + v/12hL) (K22 App. A)."""
    metrics = run_metrics(big_meta(recompute_granularity="none"))
    assert metrics["counted_model_flops"] == pytest.approx(metrics["model_flops"], rel=1e-9)



@pytest.mark.parametrize("extra", [
    # scatter/gather p2p (on by default without SP), one bucket per parameter, overlapped
    {"sequence_parallel": False, "overlap_grad_reduce": True, "ddp_bucket_size": 1},
    {"sequence_parallel": False, "scatter_gather_tensors_in_pipeline": False},
    {"overlap_grad_reduce": True, "ddp_bucket_size": 3000,  # several buckets, 2-byte grads
     "accumulate_allreduce_grads_in_fp32": False},
    {"schedule": "interleaved", "num_layers_per_virtual_pipeline_stage": 1,
     "overlap_p2p_communication": True, "overlap_grad_reduce": True, "ddp_bucket_size": 5000},
])
def test_numeric_runtime_variants_equal_the_single_device_reference(extra):
    """Megatron p2p calls, scatter/gather, bucketed and overlapped DP reduction: same numbers."""
    parallel = {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                "pipeline_model_parallel_size": 2, "data_parallel_size": 2,
                "micro_batch_size": 2, "global_batch_size": 8,
                "recompute_granularity": "selective", **extra}
    sc = scenario(model={"num_layers": 4}, parallel=parallel, cluster={"nodes": 2})
    run = simulate_iteration(sc)
    errors = compare_with_reference(run)
    assert max(errors.values()) <= 1e-10, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    for r in run.inputs.world.ranks.values():  # nothing but the model state outlives the iteration
        assert {c for c, b in r.ledger.current.items() if b} == {"weights", "gradients",
                                                                "optimizer"}


def test_exposure_breakdown_sums_to_the_iteration_time():
    """compute + tp_comm + pp_transfer + pp_wait + dp_comm + optimizer = iteration time, per
    stage; communication keys exclude waits; the tied-embedding drain is wait, not transfer."""
    metrics = run_metrics(big_meta(data_parallel_size=2, global_batch_size=16,
                                   overlap_grad_reduce=True))
    t = metrics["iteration_time_s"]
    for row, comm in zip(metrics["exposed_s_per_stage"], metrics["exposed_comm_s_per_stage"]):
        assert sorted(row) == sorted(["compute", "tp_comm", "pp_transfer", "pp_wait", "dp_comm",
                                      "optimizer"])
        assert sum(row.values()) == pytest.approx(t, rel=1e-9)
        assert min(row.values()) >= 0 and "pp_wait" not in comm
    last = metrics["exposed_s_per_stage"][-1]
    assert last["pp_wait"] > 10 * last["pp_transfer"]  # last stage waits for stage 0's drain


def test_no_bubble_with_one_stage():
    """p = 1: nothing to wait for, so no bubble and no pipeline wait, however long the
    embedding and head take; the bubble is pipeline wait over schedule work, in every output."""
    metrics = run_metrics(big_meta(pipeline_model_parallel_size=1))
    assert metrics["bubble_fraction"] == 0.0 and metrics["bubble_fraction_per_stage"] == [0.0]
    assert metrics["exposed_s_per_stage"][0]["pp_wait"] == 0.0
