"""Model FLOPs of one global batch of a published MoE transformer (blocks/moe/params.py
MoeArch: benchmarks/moe_published.py) as Megatron-LM counts them
(megatron/training/training.py num_floating_point_operations, the transformer branch, BSHD):
3 (forward, dgrad, wgrad) × 2 (FMA) × every GEMM a token meets (the top-k routed experts, the
shared experts, the dense MLPs, the attention projections, the logits; the router, norms and
embedding lookup are not counted), plus the causal core attention on B·s² (docs/moe.md). The
simulated model's own count, from its blocks, is simsp/model/flops.py.
"""

from simsp.model.blocks.moe.params import MoeArch


def attention_token_flops(m: MoeArch) -> float:
    """Per token per layer: 6 × the attention projections' weights (GQA q, k, v, o, or MLA's
    q down/up, kv down/up, shared RoPE key and o, with Megatron's +1 for each LoRA norm)."""
    h, a, d = m.hidden_size, m.num_attention_heads, m.kv_channels
    if not m.kv_lora_rank:
        return 6 * (h * (a * d + 2 * m.num_query_groups * d) + a * d * h)
    q = (m.q_lora_rank * (h + a * (d + m.qk_pos_emb_head_dim) + 1) if m.q_lora_rank
         else h * a * (d + m.qk_pos_emb_head_dim))  # training.py: no query latent
    kv = m.kv_lora_rank * (h + a * (d + m.v_head_dim) + 1) + h * m.qk_pos_emb_head_dim
    return 6 * (q + kv + a * m.v_head_dim * h)


def attention_core_flops(m: MoeArch) -> float:
    """Per (token · sequence position) per layer: QKᵀ and ·V halved by the causal mask."""
    a, d = m.num_attention_heads, m.kv_channels
    if not m.kv_lora_rank:
        return 6 * a * d
    return 6 * (a * (d + m.qk_pos_emb_head_dim) / 2 + a * m.v_head_dim / 2)


def moe_model_flops(m: MoeArch, batch: int, seq: int, padded_vocab: int,
                    swiglu: bool = True) -> float:
    """FLOPs of one iteration of `batch` sequences of `seq` tokens."""
    h, tokens = m.hidden_size, batch * seq
    ffn_factor = 3 if swiglu else 2
    moe_layers = m.num_layers - m.dense_layers
    mlp = h * ffn_factor * (m.ffn_hidden_size * m.dense_layers
                            + (m.moe_ffn_hidden_size * m.topk
                               + m.shared_expert_intermediate_size) * moe_layers)
    per_token = 6 * mlp + attention_token_flops(m) * m.num_layers + 6 * h * padded_vocab
    return tokens * per_token + batch * seq * seq * attention_core_flops(m) * m.num_layers
