"""--recompute-method {uniform,block} with --recompute-num-layers N (Megatron-LM full recompute,
transformer_block.py `_checkpointed_forward`): numbers equal to one device, activation peaks
equal to hand formulas, hardware FLOPs counting exactly the recomputed layers, errors."""

import subprocess
import sys

import pytest

from simsp import analytic
from simsp.scenario.loading import load_scenario
from simsp.errors import UserError
from simsp.metrics.collect import collect
from simsp.training.driver.compare import compare_with_reference
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
from simsp.training.pipeline.plan import Segment, recompute_segments

S, B, H, A, L = 256, 1, 512, 8, 8  # meta model: 2 stages of 4 layers


def scenario(method=None, n=None, extra=None, granularity="full"):
    overrides = {("parallel", "recompute_granularity"): granularity}
    if method:
        overrides[("parallel", "recompute_method")] = method
    if n:
        overrides[("parallel", "recompute_num_layers")] = n
    overrides.update(extra or {})
    return load_scenario(None, overrides)


def meta(method=None, n=None, granularity="full", **parallel):
    """t 1, p 2 (1F1B), 4 micro-batches, dropout on: stage 0 holds 2 micro-batches."""
    extra = {("model", "num_layers"): L, ("model", "hidden_size"): H,
             ("model", "num_attention_heads"): A, ("model", "seq_length"): S,
             ("parallel", "pipeline_model_parallel_size"): 2,
             ("parallel", "global_batch_size"): 4, ("run", "mode"): "meta"}
    extra.update({("parallel", k): v for k, v in parallel.items()})
    return scenario(method, n, extra, granularity)


def run_metrics(sc):
    shortcuts = Shortcuts.for_scale(sc)
    return collect(simulate_iteration(sc, shortcuts), shortcuts)


def test_segments_follow_megatron_checkpointed_forward():
    layers = range(4, 8)
    assert recompute_segments(meta(), layers) == tuple(Segment((i,), True) for i in layers)
    assert recompute_segments(meta("uniform", 2), layers) == (Segment((4, 5), True),
                                                              Segment((6, 7), True))
    assert recompute_segments(meta("block", 3), layers) == (
        Segment((4,), True), Segment((5,), True), Segment((6,), True), Segment((7,), False))
    none = meta(granularity="selective")
    assert all(not seg.checkpointed for seg in recompute_segments(none, layers))


@pytest.mark.parametrize("method,n,p,virtual", [("uniform", 2, 2, None), ("uniform", 4, 1, None),
                                                ("block", 1, 2, None), ("block", 1, 2, 1)])
def test_numeric_iteration_equals_the_single_device_reference(method, n, p, virtual):
    """t 2 with SP, 4 layers, 4 micro-batches: loss and every gradient as on one device."""
    extra = {("model", "num_layers"): 4, ("parallel", "tensor_model_parallel_size"): 2,
             ("parallel", "sequence_parallel"): True, ("parallel", "micro_batch_size"): 1,
             ("parallel", "pipeline_model_parallel_size"): p,
             ("parallel", "global_batch_size"): 4}
    if virtual:
        extra[("parallel", "num_layers_per_virtual_pipeline_stage")] = virtual
    run = simulate_iteration(scenario(method, n, extra))
    assert run.inputs.world.ranks[0].flops["recompute"] > 0
    errors = compare_with_reference(run)
    assert max(errors.values()) <= 1e-10, sorted(errors.items(), key=lambda kv: -kv[1])[:3]


def _hand_peak(kept_per_mb: int, rebuilt: int) -> int:
    """Stage 0 at its peak (K22 §4.2.3): 2 micro-batches kept + one rebuilt recompute unit +
    the embedding dropout mask (sbh bytes) of each micro-batch in flight."""
    return 2 * kept_per_mb + rebuilt + 2 * S * B * H


LAYER_INPUT = 2 * S * B * H  # fp16 (s, b, h), t = 1
FULL_LAYER = S * B * H * (34 + 5 * A * S // H)  # K22 Table 2, no parallelism


@pytest.mark.parametrize("method,n,expected", [
    (None, None, _hand_peak(4 * LAYER_INPUT, FULL_LAYER - LAYER_INPUT)),
    ("uniform", 2, _hand_peak(2 * LAYER_INPUT, 2 * FULL_LAYER - LAYER_INPUT)),
    ("uniform", 4, _hand_peak(LAYER_INPUT, 4 * FULL_LAYER - LAYER_INPUT)),
    ("block", 1, _hand_peak(LAYER_INPUT + 3 * FULL_LAYER, 0)),
    ("block", 3, _hand_peak(3 * LAYER_INPUT + FULL_LAYER, 0)),
    ("block", 4, _hand_peak(4 * LAYER_INPUT, FULL_LAYER - LAYER_INPUT)),
])
def test_first_stage_activation_peak_equals_the_hand_formula(method, n, expected):
    """Uniform N keeps one input per group and rebuilds N layers at once (N·full − the reused
    input); block N keeps N inputs and 4 − N whole layers."""
    sc = meta(method, n)
    measured = run_metrics(sc)["ranks"][0]["activation_peak_bytes"]
    assert measured == expected
    assert analytic.first_stage_activation_bytes(sc) == expected


def test_layout_reports_the_method():
    layout = run_metrics(meta("block", 2))["layout"]
    assert (layout["recompute_method"], layout["recompute_num_layers"]) == ("block", 2)
    layout = run_metrics(meta(granularity="selective"))["layout"]
    assert (layout["recompute_method"], layout["recompute_num_layers"]) == (None, None)


@pytest.mark.parametrize("method,n,virtual,recomputed", [
    ("uniform", 2, None, L), ("block", 1, None, 2), ("block", 3, None, 6), ("block", 1, 2, 4)])
def test_hardware_flops_count_the_recomputed_layers(method, n, virtual, recomputed):
    """Counted GEMM FLOPs = K22 model FLOPs + one forward (24bsh² + 4bs²h, App. A) per
    recomputed layer and micro-batch: all L (uniform), N per model chunk (block)."""
    chunks = {"num_layers_per_virtual_pipeline_stage": virtual} if virtual else {}
    sc = meta(method, n, **chunks)
    metrics = run_metrics(sc)
    extra = recomputed * 4 * B * (24 * S * H * H + 4 * S * S * H)  # 4 micro-batches
    assert metrics["counted_hardware_flops"] - metrics["counted_model_flops"] == extra
    assert metrics["hardware_flops"] == pytest.approx(metrics["model_flops"] + extra, rel=1e-12)
    assert metrics["counted_hardware_flops"] == pytest.approx(metrics["hardware_flops"], rel=1e-9)


def test_uniform_hardware_flops_are_n21s_96_form():
    m, p = meta("uniform", 2).model, meta("uniform", 2).parallel
    G, s, h, v = p.global_batch, S, H, m.vocab_size
    n21 = 96 * G * L * s * h * h * (1 + s / (6 * h) + v / (16 * h * L))
    assert analytic.hardware_flops(m, p) == pytest.approx(n21, rel=1e-12)


@pytest.mark.parametrize("method,n", [("uniform", 2), ("block", 2)])
def test_layer_templates_match_executing_every_op(method, n):
    """The scale shortcut replays recompute groups exactly: same time, ledger and counters."""
    sc = meta(method, n, tensor_model_parallel_size=2, sequence_parallel=True)
    executed = simulate_iteration(sc, Shortcuts(True, True, False))
    replayed = simulate_iteration(sc, Shortcuts(True, True, True))
    assert max(replayed.results.end_s.values()) == pytest.approx(
        max(executed.results.end_s.values()), rel=1e-12)
    for rank, r in executed.inputs.world.ranks.items():
        twin = replayed.inputs.world.ranks[rank]
        rows = lambda ev: sorted((round(e.time_s, 12), e.key, e.category, e.delta_bytes)
                                 for e in ev)
        assert rows(twin.ledger.events) == rows(r.ledger.events)
        assert twin.flops == r.flops


@pytest.mark.parametrize("overrides,field", [
    ({"recompute_method": "block"}, "parallel.recompute_method"),
    ({"recompute_num_layers": 1, "recompute_granularity": "selective"},
     "parallel.recompute_num_layers"),
    ({"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 3},
     "parallel.recompute_num_layers"),
    ({"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 5},
     "parallel.recompute_num_layers"),
    ({"recompute_granularity": "full", "recompute_num_layers": 0},
     "parallel.recompute_num_layers"),
    ({"recompute_granularity": "full", "recompute_method": "random"},
     "parallel.recompute_method"),
])
def test_bad_recompute_method_settings_name_the_field(overrides, field):
    """4 layers per stage: uniform 3 does not divide them, block 5 exceeds them."""
    base = {("model", "num_layers"): 8, ("parallel", "pipeline_model_parallel_size"): 2}
    base.update({("parallel", k): v for k, v in overrides.items()})
    with pytest.raises(UserError) as info:
        load_scenario(None, base)
    assert info.value.field == field


def test_block_counts_layers_per_virtual_chunk():
    """Interleaved with 2-layer chunks: block 2 is fine, block 3 is not."""
    base = {("model", "num_layers"): 8, ("parallel", "pipeline_model_parallel_size"): 2,
            ("parallel", "num_layers_per_virtual_pipeline_stage"): 2,
            ("parallel", "global_batch_size"): 2, ("parallel", "recompute_granularity"): "full",
            ("parallel", "recompute_method"): "block"}
    load_scenario(None, {**base, ("parallel", "recompute_num_layers"): 2})
    with pytest.raises(UserError):
        load_scenario(None, {**base, ("parallel", "recompute_num_layers"): 3})


def test_cli_flags_and_error_line():
    args = [sys.executable, "-m", "simsp.cli", "layer", "--recompute-method", "block"]
    done = subprocess.run(args, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.startswith("error: parallel.recompute_method:")
    assert done.stderr.count("\n") == 1


def test_layer_command_runs_one_layer_as_its_own_group(capsys):
    """`simsp layer` cuts the model to one layer: a group setting for 4 layers must not fail."""
    from simsp.cli import main
    code = main(["layer", "--num-layers", "4", "--recompute-granularity", "full",
                 "--recompute-method", "block", "--recompute-num-layers", "2", "--json"])
    assert code == 0 and '"layer_input"' in capsys.readouterr().out
