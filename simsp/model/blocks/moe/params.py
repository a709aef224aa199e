"""Total and active parameter counts of a mixture-of-experts transformer (docs/moe.md).

Active = what one token's forward touches: attention, the router, the top-k routed experts and
the shared experts of every MoE layer, the dense MLPs, the norms, the embedding and the untied
output layer. Experts are bias-free SwiGLU MLPs (fc1 h -> 2f, fc2 f -> h: 3hf each), as
Megatron-LM's experts.py with --swiglu --disable-bias-linear; multi-head latent attention counts
the down/up projections of DeepSeek-V3 (arXiv 2412.19437 §2.1.1; Megatron-LM
megatron/core/transformer/multi_latent_attention.py).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class MoeArch:
    """A published MoE architecture in Megatron-LM's flag terms."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int  # head dim
    num_experts: int  # --num-experts (routed)
    topk: int  # --moe-router-topk
    moe_ffn_hidden_size: int  # --moe-ffn-hidden-size
    vocab_size: int
    shared_expert_intermediate_size: int = 0  # --moe-shared-expert-intermediate-size
    ffn_hidden_size: int = 0  # dense layers' FFN
    dense_layers: int = 0  # layers whose --moe-layer-freq entry is 0
    q_lora_rank: int = 0  # MLA's query latent (0: none, or grouped-query attention)
    kv_lora_rank: int = 0
    qk_pos_emb_head_dim: int = 0
    v_head_dim: int = 0


def attention_params(m: MoeArch) -> int:
    """One layer's attention weights (no bias): GQA's q, k, v, o, or MLA's projections."""
    h, a, d = m.hidden_size, m.num_attention_heads, m.kv_channels
    if not m.kv_lora_rank:
        return h * a * d + 2 * h * m.num_query_groups * d + a * d * h
    qk = d + m.qk_pos_emb_head_dim  # per-head query/key width: "nope" + decoupled RoPE part
    q = (h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * a * qk  # down, norm, up
         if m.q_lora_rank else h * a * qk)  # or one projection (no query latent)
    kv = (h * (m.kv_lora_rank + m.qk_pos_emb_head_dim) + m.kv_lora_rank
          + m.kv_lora_rank * a * (d + m.v_head_dim))  # down (+ shared RoPE key), norm, up
    return q + kv + a * m.v_head_dim * h


def parameter_counts(m: MoeArch) -> tuple[int, int]:
    """(total, active) parameters, embedding and untied output layer included."""
    h = m.hidden_size
    expert = 3 * h * m.moe_ffn_hidden_size
    shared = 3 * h * m.shared_expert_intermediate_size
    common = attention_params(m) + 2 * h  # + the two norms
    moe_layers = m.num_layers - m.dense_layers
    router = h * m.num_experts
    dense = m.dense_layers * (common + 3 * h * m.ffn_hidden_size)
    outside = 2 * m.vocab_size * h + h  # embedding, output layer, final norm
    total = dense + moe_layers * (common + router + shared + m.num_experts * expert) + outside
    active = dense + moe_layers * (common + router + shared + m.topk * expert) + outside
    return total, active
