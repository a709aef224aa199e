"""MoE layers in the simulated model: `verify` (every gradient vs the single-device reference
and finite differences) on tiny numeric MoE scenarios, the bytes a MoE layer keeps (meta mode,
balanced routing) against a closed form written out here, and bad input."""

import math

import pytest

from simsp.commands.verify import verify_report
from simsp.scenario.loading import load_scenario
from simsp.errors import UserError
from simsp.training.driver.layer_sim import simulate_layer

BASE = {("model", "num_layers"): 2, ("model", "hidden_size"): 16,
        ("model", "num_attention_heads"): 2, ("model", "seq_length"): 8,
        ("model", "vocab_size"): 64, ("model", "ffn_hidden_size"): 24,
        ("model", "hidden_dropout"): 0.0, ("model", "attention_dropout"): 0.0,
        ("model", "add_bias_linear"): False, ("model", "num_experts"): 4,
        ("model", "moe_router_topk"): 2, ("model", "moe_aux_loss_coeff"): 0.01,
        ("parallel", "micro_batch_size"): 2, ("parallel", "global_batch_size"): 4}


def scenario(**extra):
    overrides = dict(BASE)
    for key, value in extra.items():
        section = "parallel" if key in ("pipeline_model_parallel_size", "data_parallel_size",
                                        "global_batch_size", "recompute_granularity",
                                        "tensor_model_parallel_size", "micro_batch_size") \
            else "run" if key == "mode" else "model"
        overrides[(section, key)] = value
    return load_scenario(None, overrides)


@pytest.mark.parametrize("extra", [
    # top-2 softmax, aux loss, capacity dropping, PP = 2 and DP = 2 (two micro-batches each)
    dict(pipeline_model_parallel_size=2, data_parallel_size=2, global_batch_size=8,
         moe_expert_capacity_factor=0.5),
    # top-1 sigmoid padded to capacity, SwiGLU + RMSNorm experts, every other layer MoE,
    # full recompute
    dict(moe_router_topk=1, moe_router_score_function="sigmoid",
         moe_expert_capacity_factor=0.75, moe_pad_expert_input_to_capacity=True, swiglu=True,
         normalization="RMSNorm", moe_layer_freq=2, recompute_granularity="full"),
])
def test_verify_passes_on_tiny_moe_scenarios(extra):
    report = verify_report(scenario(**extra))
    assert report["passed"]
    assert report["max_rel_err_vs_reference"] < 1e-13
    assert "layers.0.mlp.router.weight" in report["checked"]


@pytest.mark.parametrize("capacity, pad", [(None, False), (0.5, False), (1.5, True)])
def test_meta_moe_layer_keeps_the_closed_form_bytes(capacity, pad):
    s, b, h, a, E, k, f = 64, 2, 32, 4, 8, 2, 48
    sc = scenario(mode="meta", seq_length=s, micro_batch_size=b, hidden_size=h,
                  num_attention_heads=a, num_experts=E, moe_router_topk=k,
                  moe_ffn_hidden_size=f, moe_expert_capacity_factor=capacity,
                  moe_pad_expert_input_to_capacity=pad, hidden_dropout=0.1,
                  attention_dropout=0.1)
    T = s * b
    C = math.ceil(T * k / E * capacity) if capacity else None
    N = E * C if pad else T * k if capacity is None else E * min(T * k // E, C)
    attention = 15 * s * b * h + 5 * a * s * s * b  # K22: ln1_input .. ln2_input, dropout on
    moe = 2 * T * h + 4 * T * E + T * E + 2 * N * h + 2 * N * f + 2 * N * f + 2 * N * h + T * h
    # moe_input, fp32 logits, routing map, permuted tokens, GeLU input and output, expert
    # output, the MLP dropout mask
    result = simulate_layer(sc)
    assert [rec.activation_bytes for rec in result.records] == [attention + moe]


@pytest.mark.parametrize("extra, field", [
    (dict(tensor_model_parallel_size=2), "parallel.sequence_parallel"),  # Megatron needs SP
    (dict(add_bias_linear=True), "model.num_experts"),
    (dict(moe_pad_expert_input_to_capacity=True), "model.moe_pad_expert_input_to_capacity"),
    (dict(moe_router_topk=5), "model.moe_router_topk"),
    (dict(moe_router_score_function="sinkhorn"), "model.moe_router_score_function"),
])
def test_bad_moe_input_names_its_field(extra, field):
    with pytest.raises(UserError) as caught:
        scenario(**extra)
    assert str(caught.value).startswith(field)
