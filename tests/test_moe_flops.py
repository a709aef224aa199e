"""Megatron's MoE FLOPs against 6 × the GEMM weights one token meets (active parameters less
the embedding, norms and router) plus the causal core attention, worked independently."""

import pytest

from simsp.model.blocks.moe.flops import moe_model_flops
from simsp.model.blocks.moe.params import parameter_counts
from test_moe_params import DEEPSEEK_V3, MIXTRAL, QWEN3


@pytest.mark.parametrize("arch", [MIXTRAL, QWEN3])
def test_gqa_flops_are_six_times_active_gemm_weights_plus_core(arch):
    B, s = 4, 4096
    h, L, v = arch.hidden_size, arch.num_layers, arch.vocab_size
    _, active = parameter_counts(arch)
    moe_layers = L - arch.dense_layers
    gemm_weights = active - v * h - h - 2 * h * L - h * arch.num_experts * moe_layers
    core = 6 * B * s * s * arch.num_attention_heads * arch.kv_channels * L  # causal: half of 2 GEMMs x2
    assert moe_model_flops(arch, B, s, v) == pytest.approx(6 * B * s * gemm_weights + core,
                                                           rel=1e-12)


def test_mla_flops_count_lora_norms_as_megatron_does():
    B, s, m = 1, 4096, DEEPSEEK_V3
    h, L, v = m.hidden_size, m.num_layers, m.vocab_size
    _, active = parameter_counts(m)
    gemm_weights = active - v * h - h - 2 * h * L - h * m.num_experts * (L - m.dense_layers)
    # parameter_counts has the two LoRA norms (r_q + r_kv weights); Megatron's count adds 1 per
    # LoRA rank row instead, the same number
    core = 6 * B * s * s * m.num_attention_heads * (m.kv_channels + m.qk_pos_emb_head_dim
                                                    + m.v_head_dim) / 2 * L
    assert moe_model_flops(m, B, s, v) == pytest.approx(6 * B * s * gemm_weights + core, rel=1e-12)
