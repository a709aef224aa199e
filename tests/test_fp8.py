"""FP8 training (simsp/scenario/precision.py, simsp/model/fp8.py): bytes by category for one layer
against a hand-worked count, FP8 GEMM timing, refusal on A100."""

import subprocess
import sys

import pytest

from simsp.scenario.loading import load_scenario
from simsp.hardware.costmodel import gemm_seconds
from simsp.hardware.constants import compute_for
from simsp.training.driver.layer_sim import simulate_layer

S, B, H, A, T = 64, 2, 128, 4, 2  # sequence, micro-batch, hidden, heads, TP


def _meta(history: int = 1) -> int:
    """Delayed scaling's buffers of one TE linear by hand: 3 forward quantizers (input, weight,
    output) + 2 backward (grad_output, grad_input), each `history` fp32 amaxes + 1 fp32 scale."""
    return (3 + 2) * (history + 1) * 4


def _layer(**extra):
    overrides = {("model", "num_layers"): 1, ("model", "hidden_size"): H,
                 ("model", "num_attention_heads"): A, ("model", "seq_length"): S,
                 ("model", "vocab_size"): 256, ("parallel", "micro_batch_size"): B,
                 ("parallel", "tensor_model_parallel_size"): T, ("run", "mode"): "meta",
                 ("cluster", "system"): "dgx-h100"}
    overrides.update({("parallel", k): v for k, v in extra.items()})
    return simulate_layer(load_scenario(None, overrides))


def _by_hand_saved(fp8: bool) -> dict:
    """K22's saved tensors of one layer on one TP rank (no SP, no recompute), in bytes; under
    FP8 the four linear inputs are 1 byte per element plus one fp32 scale (per-tensor)."""
    sbh, t = S * B * H, T
    scores = A * S * S * B // t
    one = (lambda n: n + 4) if fp8 else (lambda n: 2 * n)
    return {"ln1_input": 2 * sbh, "qkv_input": one(sbh), "q": 2 * sbh // t, "k": 2 * sbh // t,
            "v": 2 * sbh // t, "softmax_output": 2 * scores, "softmax_dropout_mask": scores,
            "attention_dropout_output": 2 * scores, "proj_input": one(sbh // t),
            "attn_dropout_mask": sbh, "ln2_input": 2 * sbh, "fc1_input": one(sbh),
            "gelu_input": 8 * sbh // t, "fc2_input": one(4 * sbh // t), "mlp_dropout_mask": sbh}


@pytest.mark.parametrize("fp8", [False, True])
def test_saved_activations_by_name_match_the_hand_count(fp8):
    result = _layer(**({"fp8_format": "hybrid"} if fp8 else {}))
    assert dict(result.records[0].saved) == _by_hand_saved(fp8)
    assert result.records[0].activation_bytes == sum(_by_hand_saved(fp8).values())


def _by_hand_static(param_gather: bool, grad_bytes: int = 4, meta: int = _meta()) -> dict:
    """One layer's weights and main gradients on one TP rank (H100: FP8 weights keep data and
    transpose, 1 byte each, and one fp32 scale per direction)."""
    h, t = H, T
    linear = [h * 3 * h // t, h // t * h, h * 4 * h // t, 4 * h // t * h]  # qkv, proj, fc1, fc2
    small = 3 * h // t + h + 4 * h // t + h + 4 * h  # biases (qkv, proj, fc1, fc2), 2 LNs x 2
    params = sum(linear) + small
    copies = sum(2 * (n + 4) + meta for n in linear)
    weights = 2 * small + copies if param_gather else 2 * params + copies
    return {"weights": weights, "gradients": grad_bytes * params}


@pytest.mark.parametrize("param_gather", [False, True])
def test_weights_and_gradients_by_category_match_the_hand_count(param_gather):
    extra = {"fp8_format": "e4m3", "fp8_param_gather": param_gather}
    final = _layer(**extra).ranks[0].ledger.final_bytes()
    hand = _by_hand_static(param_gather)
    assert (final["weights"], final["gradients"]) == (hand["weights"], hand["gradients"])


@pytest.mark.parametrize("recipe, history, meta", [("delayed", 1024, _meta(1024)),
                                                   ("tensorwise", 1, 0)])
def test_delayed_scalings_amax_history_is_in_the_weights_by_hand(recipe, history, meta):
    extra = {"fp8_format": "e4m3", "fp8_recipe": recipe}
    if recipe == "delayed":
        extra["fp8_amax_history_len"] = history
    final = _layer(**extra).ranks[0].ledger.final_bytes()
    assert final["weights"] == _by_hand_static(False, meta=meta)["weights"]


def test_amax_history_without_delayed_scaling_is_refused_in_one_line():
    refused = subprocess.run([sys.executable, "-m", "simsp.cli", "layer", "--system", "dgx-h100",
                              "--fp8-format", "e4m3", "--fp8-recipe", "tensorwise",
                              "--fp8-amax-history-len", "16"], capture_output=True, text=True)
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: parallel.fp8_amax_history_len: needs fp8_format "
                                     "with fp8_recipe delayed")
    assert len(refused.stderr.strip().splitlines()) == 1


def test_bf16_main_gradients_with_the_precision_aware_optimizer_halve_the_gradients():
    final = _layer(fp8_format="hybrid", use_precision_aware_optimizer=True,
                   main_grads_dtype="bf16").ranks[0].ledger.final_bytes()
    assert final["gradients"] == _by_hand_static(False, grad_bytes=2)["gradients"]


def test_fp8_gemm_time_is_flops_at_the_fp8_ceiling_plus_one_byte_operands():
    cal = compute_for("h100-sxm-80gb", fp8=True)
    m, k, n = 4096, 12288, 4608
    by_hand = 2e-6 + 2 * m * k * n / 1402.6e12 + (m * k + k * n + 2 * m * n) / (0.9 * 3.35e12)
    assert gemm_seconds(2 * m * k * n, m * k + k * n + 2 * m * n, cal) == \
        pytest.approx(by_hand, rel=1e-12)


def _seconds(result):
    return result.forward_time_s + result.backward_time_s


def test_fp8_pays_on_a_22b_layer_not_on_a_launch_bound_tiny_one_and_is_refused_on_a100():
    assert _seconds(_layer(fp8_format="hybrid")) > _seconds(_layer())  # the casts' launches
    big = {("cluster", "system"): "dgx-h100"}
    bf16 = simulate_layer(load_scenario("scenarios/paper-22b.toml", big))
    fp8 = simulate_layer(load_scenario("scenarios/paper-22b.toml",
                                       {**big, ("parallel", "fp8_format"): "hybrid"}))
    assert 0.6 * _seconds(bf16) < _seconds(fp8) < 0.95 * _seconds(bf16)
    refused = subprocess.run([sys.executable, "-m", "simsp.cli", "layer", "--fp8-format", "e4m3"],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("error: parallel.fp8_format: a100-sxm-80gb has no FP8")


def test_state_dtypes_need_the_precision_aware_optimizer():
    with pytest.raises(Exception, match="use_precision_aware_optimizer"):
        _layer(exp_avg_dtype="fp16")


@pytest.mark.parametrize("fmt, value, rounded", [
    ("e4m3", 1.0625, 1.0), ("e4m3", 1.1875, 1.25), ("e4m3", -3.3, -3.25), ("e4m3", 500.0, 448.0),
    ("e4m3", 0.001, 2.0 ** -9), ("e4m3", 2.0 ** -11, 0.0), ("e5m2", 1.125, 1.0),
    ("e5m2", 1.375, 1.5), ("e5m2", 6.0e4, 57344.0), ("e5m2", 3 * 2.0 ** -17, 2.0 ** -15)])
def test_fp8_rounding_by_hand(fmt, value, rounded):
    """OCP FP8: E4M3 spacing 1/8 near 1, largest 448, smallest subnormal 2^-9; E5M2 spacing 1/4,
    largest 57344, smallest subnormal 2^-16; ties to even; overflow saturates."""
    from simsp.model.fp8 import round_to_fp8
    import numpy as np
    assert round_to_fp8(np.array([value]), fmt)[0] == rounded


def test_verify_under_fp8_reports_the_error_per_parameter_e5m2_gradients_worse():
    from simsp.commands.verify import fp8_report
    errors = {}
    for fmt in ("e4m3", "hybrid"):
        sc = load_scenario("scenarios/tiny.toml", {("cluster", "gpu"): "h100-sxm-80gb",
                                                   ("parallel", "fp8_format"): fmt})
        report = fp8_report(sc)
        errors[fmt] = [report["reference_errors"][n] for n in report["checked"]]
        assert "layers.0.attn.qkv.weight" in report["checked"]
        assert all(1e-4 < e < 0.5 for e in errors[fmt])  # FP8-sized, not FP64-sized, finite
    assert sum(errors["e4m3"]) < sum(errors["hybrid"])


def test_under_sp_the_linear_inputs_are_gathered_in_fp8():
    """TE's LayerNormLinear quantizes the LN output, then all-gathers it: (t - 1)/t x sbh bytes
    per rank per gather (QKV and fc1) instead of twice that, forward and backward re-gather."""
    bf16, fp8 = _layer(sequence_parallel=True), _layer(sequence_parallel=True,
                                                       fp8_format="hybrid")
    per_gather = (T - 1) * S * B * H // T  # bytes sent per rank for one FP8 all-gather
    assert bf16.ranks[0].comm_bytes[("forward", "all_gather")] == 2 * 2 * per_gather
    assert fp8.ranks[0].comm_bytes[("forward", "all_gather")] == 2 * per_gather
    assert fp8.ranks[0].comm_bytes[("backward", "all_gather_ln_output")] == 2 * per_gather


def test_swiglu_fc1_runs_its_three_gemms_in_fp8():
    """A gated fc1 (h, 2, f/t) is seen as the (h, 2f/t) GEMM operand: it is a transformer
    layer's linear weight like any other, so its forward, data-gradient and weight-gradient
    GEMMs run at the FP8 rate on 1-byte operands; the output gradient is quantized for them
    (the input is quantized by LN2's kernel: test_fusions.py)."""
    f = 256
    overrides = {("model", "num_layers"): 1, ("model", "hidden_size"): H,
                 ("model", "num_attention_heads"): A, ("model", "seq_length"): S,
                 ("model", "vocab_size"): 256, ("model", "swiglu"): True,
                 ("model", "ffn_hidden_size"): f, ("parallel", "micro_batch_size"): B,
                 ("parallel", "tensor_model_parallel_size"): T, ("run", "mode"): "meta",
                 ("cluster", "system"): "dgx-h100", ("parallel", "fp8_format"): "hybrid"}
    log = simulate_layer(load_scenario(None, overrides), log_kernels=True).ranks[0].kernel_log
    seconds = {(name, phase): s for name, phase, _, _, _, s in log}
    cal = compute_for("h100-sxm-80gb", fp8=True)
    m, k, n = S * B, H, 2 * f // T  # tokens, hidden, [gate | up] per TP rank
    for name, (a, b, c) in (("swiglu_input", (m, k, n)), ("d_mlp.fc1_input", (m, n, k)),
                            ("d_mlp.fc1_weight", (k, m, n))):
        phase = "forward" if name == "swiglu_input" else "backward"
        into_main_grad = (2 * 4 - 2) * a * c if name.endswith("_weight") else 0
        by_hand = gemm_seconds(2 * a * b * c, a * b + b * c + 2 * a * c, cal, (a, b, c),
                               extra_bytes=into_main_grad)
        assert seconds[(name, phase)] == pytest.approx(by_hand, rel=1e-12)
    assert ("d_mlp.fc1_input_fp8_cast", "backward") in seconds


def test_fp8_dot_product_attention_runs_cudnn_forward_at_its_published_fp8_figure():
    """--fp8-dot-product-attention: cuDNN's forward at 1005 TFLOP/s at the benchmarks' shape
    (FlashAttention-3 paper Fig. 7, H100), so the reference call takes the published time;
    the backward keeps the BF16 figure (516: no FP8 backward is published)."""
    from simsp.hardware.attention_kernels import (attention_rates, attention_seconds,
                                                  published_flops, reference_shape)
    fp8, bf16 = attention_rates("h100-sxm-80gb", "fused", True), attention_rates(
        "h100-sxm-80gb", "fused")
    shape = reference_shape()
    assert attention_seconds(fp8, shape, False) == pytest.approx(
        published_flops(shape, False) / 1005e12, rel=1e-9)
    assert attention_seconds(fp8, shape, True) == attention_seconds(bf16, shape, True)
    assert attention_rates("h100-sxm-80gb", "flash", True) == attention_rates(
        "h100-sxm-80gb", "flash")  # FlashAttention-2: no FP8 figure


@pytest.mark.parametrize("flags, message", [
    ([], "parallel.fp8_dot_product_attention: needs fp8_format"),
    (["--fp8-format", "hybrid"], "parallel.fp8_dot_product_attention: needs attention_backend "
                                 "fused or auto"),
])
def test_fp8_dot_product_attention_is_refused_without_fp8_or_cudnn(flags, message):
    refused = subprocess.run([sys.executable, "-m", "simsp.cli", "layer", "--gpu",
                              "h100-sxm-80gb", "--fp8-dot-product-attention", *flags],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith(f"error: {message}")


def test_swiglu_fc1_has_its_fp8_weight_copy_and_the_router_none():
    """One SwiGLU layer without biases (t 2, f 256, RMSNorm): every TE linear weight, the gated
    fc1 (h, 2, f/t) among them, has its FP8 copy (data and transpose, one fp32 scale each)
    beside the BF16 weight; a MoE router's weight (a plain torch linear) would have none."""
    f = 256
    overrides = {("model", "num_layers"): 1, ("model", "hidden_size"): H,
                 ("model", "num_attention_heads"): A, ("model", "seq_length"): S,
                 ("model", "vocab_size"): 256, ("model", "swiglu"): True,
                 ("model", "ffn_hidden_size"): f, ("model", "add_bias_linear"): False,
                 ("model", "normalization"): "RMSNorm", ("parallel", "micro_batch_size"): B,
                 ("parallel", "tensor_model_parallel_size"): T, ("run", "mode"): "meta",
                 ("cluster", "system"): "dgx-h100", ("parallel", "fp8_format"): "hybrid"}
    final = simulate_layer(load_scenario(None, overrides)).ranks[0].ledger.final_bytes()
    linear = [H * 3 * H // T, H // T * H, H * 2 * f // T, f // T * H]  # qkv, proj, fc1, fc2
    params = sum(linear) + 2 * H  # and the two RMSNorm gammas
    assert final["weights"] == 2 * params + sum(2 * (n + 4) + _meta() for n in linear)
    from simsp.model.fp8 import is_fp8_param
    assert not is_fp8_param("layers.0.mlp.router.weight", (H, 8))
    assert is_fp8_param("layers.0.mlp.fc1.weight", (H, 2, f))
    assert not is_fp8_param("layers.0.mlp.experts.fc1.weight", (8, H, 2, f))


@pytest.mark.parametrize("main_grads, width", [("fp32", 4), ("bf16", 2)])
def test_weight_gradient_gemms_accumulate_into_the_main_gradient(main_grads, width):
    """TE's weight-gradient GEMM under Megatron's gradient_accumulation_fusion adds into
    weight.main_grad (accumulate=True, out=weight.main_grad: transformer_engine/pytorch/module/
    linear.py): the (k, n) gradient is read and written at the main gradient's width instead of
    written once in BF16, (2·width − 2)·k·n more bytes at the rule's memory-bound rate
    (0.9 × 3.35 TB/s on the H100); the data-gradient GEMMs do not change."""
    extra = {"use_precision_aware_optimizer": True, "main_grads_dtype": "bf16"} \
        if main_grads == "bf16" else {}
    overrides = {("model", "num_layers"): 1, ("model", "hidden_size"): H,
                 ("model", "num_attention_heads"): A, ("model", "seq_length"): S,
                 ("model", "vocab_size"): 256, ("parallel", "micro_batch_size"): B,
                 ("parallel", "tensor_model_parallel_size"): T, ("run", "mode"): "meta",
                 ("cluster", "system"): "dgx-h100", ("parallel", "fp8_format"): "hybrid"}
    overrides.update({("parallel", k): v for k, v in extra.items()})
    log = simulate_layer(load_scenario(None, overrides), log_kernels=True).ranks[0].kernel_log
    seconds = {(name, phase): s for name, phase, _, _, _, s in log}
    cal = compute_for("h100-sxm-80gb", fp8=True)
    memory_Bps = 0.9 * 3.35e12
    tokens = S * B
    for name, (k, n) in (("d_mlp.fc1_weight", (H, 4 * H // T)), ("d_mlp.fc2_weight", (4 * H // T, H)),
                         ("d_attn.qkv_weight", (H, 3 * H // T)), ("d_attn.proj_weight", (H // T, H))):
        plain = gemm_seconds(2 * k * tokens * n, k * tokens + tokens * n + 2 * k * n, cal,
                             (k, tokens, n))
        assert seconds[(name, "backward")] - plain == pytest.approx(
            (2 * width - 2) * k * n / memory_Bps, rel=1e-9)
    m, k, n = tokens, 4 * H // T, H  # fc2's data gradient: dy (m, h) x w^T
    assert seconds[("d_mlp.fc2_input", "backward")] == pytest.approx(
        gemm_seconds(2 * m * k * n, m * n + n * k + 2 * m * k, cal, (m, n, k)), rel=1e-12)
