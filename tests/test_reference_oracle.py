"""Every simulated block against the independent reference (simsp/model/reference/, which
shares no kernel with the simulated model): one layer on a TP group (`simsp layer`'s
simulate_layer), output, input gradient and every weight gradient within float64 rounding.
A wrong simulated kernel (RoPE, norm, activation, K/V groups, router, experts) fails here."""

import pytest

from simsp.scenario.loading import load_scenario
from simsp.training.driver.layer_sim import simulate_layer

LLAMA = {("model", "swiglu"): True, ("model", "normalization"): "RMSNorm",
         ("model", "position_embedding_type"): "rope", ("model", "add_bias_linear"): False}
GQA = {**LLAMA, ("model", "group_query_attention"): True, ("model", "num_query_groups"): 2}
MQA = {**LLAMA, ("model", "group_query_attention"): True, ("model", "num_query_groups"): 1,
       ("parallel", "tensor_model_parallel_size"): 1, ("parallel", "sequence_parallel"): False}
FLASH = {("model", "attention_backend"): "flash"}
MOE = {("model", "num_experts"): 4, ("model", "moe_router_topk"): 2,
       ("model", "moe_aux_loss_coeff"): 0.01, ("model", "add_bias_linear"): False}
SHARED = {("model", "moe_shared_expert_intermediate_size"): 32}

CASES = {  # name: (scenario, overrides); tiny: TP 2 + SP, dropout 0.1 on both sites
    "gpt": ("tiny", {}),
    "gpt_layernorm_epsilon": ("tiny", {("model", "norm_epsilon"): 0.3}),
    "gpt_swiglu_with_biases": ("tiny", {("model", "swiglu"): True}),
    "llama_mha": ("tiny", LLAMA),
    "llama_rmsnorm_epsilon": ("tiny", {**LLAMA, ("model", "norm_epsilon"): 0.2}),
    "gqa": ("tiny", GQA),
    "gqa_flash_rotary_half": ("tiny", {**GQA, **FLASH, ("model", "rotary_percent"): 0.5}),
    "mqa_unfused": ("tiny", MQA),
    "mqa_flash_two_tiles": ("tiny", {**MQA, **FLASH, ("model", "seq_length"): 40}),
    "mla": ("mla-tiny", {}),
    "mla_without_query_latent": ("mla-tiny", {("model", "q_lora_rank"): None}),
    "mla_flash_rotary_half": ("mla-tiny", {**FLASH, ("model", "rotary_percent"): 0.5}),
    "moe_softmax_top2_aux": ("tiny", MOE),
    "moe_sigmoid_top2": ("tiny", {**MOE, ("model", "moe_router_score_function"): "sigmoid"}),
    "moe_sigmoid_top1": ("tiny", {**MOE, ("model", "moe_router_topk"): 1,
                                  ("model", "moe_router_score_function"): "sigmoid"}),
    "moe_capacity_dropping": ("tiny", {**MOE, ("model", "moe_expert_capacity_factor"): 0.5}),
    "moe_capacity_padded": ("tiny", {**MOE, ("model", "moe_expert_capacity_factor"): 0.5,
                                     ("model", "moe_pad_expert_input_to_capacity"): True}),
    "moe_swiglu_shared": ("tiny", {**MOE, **LLAMA, **SHARED}),
    "moe_gelu_shared": ("tiny", {**MOE, **SHARED}),
    "mla_moe_sigmoid_shared": ("mla-tiny", {**MOE, ("model", "moe_router_score_function"):
                                            "sigmoid", **SHARED}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_simulated_layer_matches_the_independent_reference(name):
    scenario, overrides = CASES[name]
    result = simulate_layer(load_scenario(f"scenarios/{scenario}.toml", overrides))
    assert result.max_rel_err < 1e-12
