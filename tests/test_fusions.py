"""Megatron-LM's kernel fusions (simsp/model/base/fusions.py, docs/fusions.md): the bytes each
fused and unfused kernel moves, counted by hand for a small layer, and the numbers unchanged."""

import numpy as np
import pytest

from simsp.hardware.constants import compute_for
from simsp.hardware.costmodel import kernel_time
from simsp.scenario.loading import load_scenario
from simsp.training.driver.iteration import simulate_iteration
from simsp.training.driver.layer_sim import simulate_layer

S, B, H, A = 64, 2, 128, 4  # sequence, micro-batch, hidden, heads (head dim 32); TP 1
GPT = {"num_layers": 1, "hidden_size": H, "num_attention_heads": A, "seq_length": S,
       "vocab_size": 256}
LLAMA = {**GPT, "swiglu": True, "ffn_hidden_size": 256, "normalization": "RMSNorm",
         "position_embedding_type": "rope", "add_bias_linear": False}


def _kernels(model: dict, mode: str = "meta", **parallel) -> dict:
    """{(kernel name, phase): bytes} of rank 0's kernels for one layer on an H100."""
    overrides = {("model", k): v for k, v in model.items()}
    overrides.update({("parallel", "micro_batch_size"): B, ("run", "mode"): mode,
                      ("cluster", "system"): "dgx-h100", ("parallel", "data_parallel_size"): 1,
                      ("parallel", "tensor_model_parallel_size"): 1})
    overrides.update({("parallel", k): v for k, v in parallel.items()})
    log = simulate_layer(load_scenario(None, overrides), log_kernels=True).ranks[0].kernel_log
    return {(name, phase): nbytes for name, phase, kind, _, nbytes, _ in log
            if kind == "elementwise"}


def _op(kernels: dict, name: str, phase: str) -> list:
    """The bytes of op `name`'s kernels in launch order: name, name_1, name_2, ..."""
    out, index = [], 0
    while (key := (name if index == 0 else f"{name}_{index}", phase)) in kernels:
        out.append(kernels[key])
        index += 1
    return out


def test_bias_gelu_fused_is_one_pass_unfused_adds_the_bias_kernel():
    x = S * B * 4 * H * 2  # fc1's output (s, b, 4h) in BF16
    fused, unfused = _kernels(GPT), _kernels({**GPT, "bias_gelu_fusion": False})
    assert _op(fused, "fc2_input", "forward") == [2 * x]  # read x (+ bias), write gelu(x)
    assert _op(unfused, "fc2_input", "forward") == [2 * x, 2 * x]  # x + bias; F.gelu
    assert _op(fused, "d_gelu_input", "backward") == [3 * x]  # read dy, x; write dx
    assert _op(unfused, "d_gelu_input", "backward") == [3 * x]  # F.gelu's backward alike


def test_without_a_bias_megatron_turns_the_gelu_fusion_off_and_it_costs_the_same():
    no_bias = {**GPT, "add_bias_linear": False}
    x = S * B * 4 * H * 2
    assert _op(_kernels(no_bias), "fc2_input", "forward") == [2 * x]  # F.gelu alone


def test_swiglu_fused_one_kernel_unfused_silu_mul_and_autograd_kernels():
    x = S * B * 2 * 256 * 2  # fc1's output [gate | up] (s, b, 2f) in BF16; the halves x/2
    fused, unfused = _kernels(LLAMA), _kernels({**LLAMA, "bias_swiglu_fusion": False})
    assert _op(fused, "fc2_input", "forward") == [x + x // 2]  # read 2f, write f
    assert _op(unfused, "fc2_input", "forward") == [x, x + x // 2]  # silu(gate); · up
    assert _op(fused, "d_swiglu_input", "backward") == [x // 2 + 2 * x]  # dy, x -> dx
    # d up = dy·silu, d silu = dy·up, silu's backward: 3 halves each; the chunk's cat: 2x
    assert _op(unfused, "d_swiglu_input", "backward") == [3 * x // 2] * 3 + [2 * x]


def test_masked_softmax_fused_one_kernel_unfused_mask_then_softmax():
    p = B * A * S * S * 2  # the scores (b, a, s, s) in BF16
    fused, unfused = _kernels(GPT), _kernels({**GPT, "masked_softmax_fusion": False})
    assert _op(fused, "softmax_output", "forward") == [2 * p]
    assert _op(unfused, "softmax_output", "forward") == [2 * p, 2 * p]
    assert _op(fused, "d_attention_scores", "backward") == [3 * p]
    assert _op(unfused, "d_attention_scores", "backward") == [3 * p, 2 * p]


@pytest.mark.parametrize("percent", [1.0, 0.5])
def test_rope_fused_one_pass_unfused_pytorch_kernels(percent):
    q = B * A * S * (H // A) * 2  # q (b, a, s, d) in BF16
    xr = int(q * percent)  # the rotated channels' bytes
    model = {**LLAMA, "rotary_percent": percent}
    fused, unfused = _kernels(model), _kernels({**model, "apply_rope_fusion": False})
    assert _op(fused, "q", "forward") == [2 * q]
    # -x2, rotate's cat, t·cos, rot·sin, their sum, the cat with the pass-through part
    assert _op(unfused, "q", "forward") == [xr, 2 * xr, 2 * xr, 2 * xr, 3 * xr, 2 * q]
    assert _op(fused, "d_q_unrotated", "backward") == [2 * q]
    assert _op(unfused, "d_q_unrotated", "backward") == [2 * xr, 2 * xr, xr, 2 * xr, 3 * xr]


def test_under_fp8_the_norm_writes_the_fp8_input_of_qkv_and_fc1_no_cast_of_their_own():
    e = S * B * H  # elements of the norm's input and output
    kernels = _kernels(LLAMA, fp8_format="hybrid")
    # TE LayerNormLinear: reads 2e, writes data and transpose (Hopper) with one fp32 scale each
    assert kernels[("ln1_output", "forward")] == 2 * e + 2 * (e + 4)
    assert kernels[("fc1_input", "forward")] == 2 * e + 2 * (e + 4)
    assert ("qkv_fp8_cast", "forward") not in kernels
    assert ("swiglu_input_fp8_cast", "forward") not in kernels
    assert kernels[("attn_output_fp8_cast", "forward")] == 2 * e + 2 * (e + 4)  # proj: its own


def test_fusions_change_no_number():
    off = {"bias_gelu_fusion": False, "masked_softmax_fusion": False}
    overrides = {("parallel", "micro_batch_size"): B, ("run", "mode"): "numeric",
                 ("parallel", "tensor_model_parallel_size"): 1}
    fused = simulate_layer(load_scenario(None, {**overrides, **{
        ("model", k): v for k, v in GPT.items()}}))
    unfused = simulate_layer(load_scenario(None, {**overrides, **{
        ("model", k): v for k, v in {**GPT, **off}.items()}}))
    assert np.array_equal(fused.records[0].out, unfused.records[0].out)
    assert np.array_equal(fused.records[0].dx, unfused.records[0].dx)


def _loss_spans(fused: bool) -> dict:
    """{kernel name: seconds} of the loss's kernels on the last stage of a TP 1 run."""
    overrides = {("run", "mode"): "meta", ("cluster", "system"): "dgx-h100",
                 ("model", "cross_entropy_loss_fusion"): fused}
    overrides.update({("model", k): v for k, v in GPT.items()})
    world = simulate_iteration(load_scenario(None, overrides)).inputs.world
    spans = world.trace.spans_of(0, "compute")
    return {s.name: s.end_s - s.start_s for s in spans
            if s.name.startswith(("loss_stats", "d_logits"))}


def test_cross_entropy_fused_and_unfused_kernels_on_fp32_logits():
    cal = compute_for("h100-sxm-80gb")
    e = S * 1 * 256 * 4  # fp32 logits (s, b = 1, v) of one micro-batch
    seconds = [kernel_time("elementwise", 0, n, cal=cal) for n in (e, 2 * e, e // 2 * 3)]
    one, two, cast = seconds
    # fused: exp(x - max) in place, the row sum, the division; unfused: the max, the
    # subtraction, exp, the sum, the division; backward both: the scaling, the 16-bit cast
    assert _loss_spans(True) == pytest.approx(
        {"loss_stats": two, "loss_stats_1": one, "loss_stats_2": two,
         "d_logits": two, "d_logits_1": cast}, rel=1e-12)
    assert _loss_spans(False) == pytest.approx(
        {"loss_stats": one, "loss_stats_1": two, "loss_stats_2": two, "loss_stats_3": one,
         "loss_stats_4": two, "d_logits": two, "d_logits_1": cast}, rel=1e-12)
