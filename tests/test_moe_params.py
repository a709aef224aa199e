"""Total and active parameter counts of the published MoE architectures against their model
cards (Mixtral 8x7B 46.7B / 12.9B; Qwen3-30B-A3B 30.5B / 3.3B; DeepSeek-V3 671B / 37B)."""

from simsp.model.blocks.moe.params import MoeArch, parameter_counts

MIXTRAL = MoeArch(32, 4096, 32, 8, 128, 8, 2, 14336, 32000)
QWEN3 = MoeArch(48, 2048, 32, 4, 128, 128, 8, 768, 151936)
DEEPSEEK_V3 = MoeArch(61, 7168, 128, 128, 128, 256, 8, 2048, 129280,
                      shared_expert_intermediate_size=2048, ffn_hidden_size=18432,
                      dense_layers=3, q_lora_rank=1536, kv_lora_rank=512,
                      qk_pos_emb_head_dim=64, v_head_dim=128)


def test_totals_match_published_to_their_rounding():
    for arch, published, unit in ((MIXTRAL, 46.7, 0.05), (QWEN3, 30.5, 0.05),
                                  (DEEPSEEK_V3, 671, 0.5)):
        total, _ = parameter_counts(arch)
        assert abs(total / 1e9 - published) <= unit


def test_active_counts():
    assert abs(parameter_counts(MIXTRAL)[1] / 1e9 - 12.9) <= 0.05
    # Qwen3's card counts 29.9B non-embedding parameters: total minus both vocab matrices
    total, active = parameter_counts(QWEN3)
    assert abs((total - 2 * 151936 * 2048) / 1e9 - 29.9) <= 0.05
    # the cards' "3.3B" and "37B" activated are truncated: 3.35B and 37.55B here
    assert 3.3 <= active / 1e9 < 3.4
    assert 37 <= parameter_counts(DEEPSEEK_V3)[1] / 1e9 < 38
