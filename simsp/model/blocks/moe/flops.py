"""Model FLOPs of one global batch of a MoE transformer as Megatron-LM counts them
(megatron/training/training.py num_floating_point_operations, the transformer branch, BSHD):
3 (forward, dgrad, wgrad) × 2 (FMA) × every GEMM a token meets (the top-k routed experts, the
shared experts, the dense MLPs, the attention projections, the logits; the router, norms and
embedding lookup are not counted), plus the causal core attention on B·s² (docs/moe.md).
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


# ---------------------------------------------------------------------------------------------
# The simulated model's FLOPs (config.Model), as the same Megatron-LM function counts them


def _layer_kinds(m) -> tuple[int, int]:
    """(dense MLP layers, MoE layers) of model m (--moe-layer-freq), the multi-token
    prediction depths' layers included (each built as the last layer)."""
    moe = sum(m.is_moe_layer(i) for i in range(m.num_layers))
    dense = m.num_layers - moe
    depths = getattr(m, "mtp_num_layers", None) or 0
    if m.is_moe_layer(m.num_layers - 1):
        return dense, moe + depths
    return dense + depths, moe


def _attention_terms(m) -> tuple[float, float]:
    """(per token per layer: 6 × the attention projections, per token · position per layer:
    the causal core) as training.py's transformer_flops: GQA/MHA, or MLA with its LoRA norms."""
    h, a = m.hidden_size, m.num_attention_heads
    if m.multi_latent_attention:
        dn, dr, dv = m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim
        q = (h * a * (dn + dr) if m.q_lora_rank is None  # training.py: no query latent
             else m.q_lora_rank * (h + a * (dn + dr) + 1))
        kv = m.kv_lora_rank * (h + a * (dn + dv) + 1) + h * dr
        return 6 * (q + kv + a * dv * h), 6 * (a * (dn + dr) / 2 + a * dv / 2)
    d, groups = m.head_dim, m.query_groups
    return 6 * (h * (a * d + 2 * groups * d) + a * d * h), 6 * a * d


def megatron_flops(m, global_batch: int, padded_vocab: int) -> float:
    """Model FLOPs of one iteration of `global_batch` sequences, Megatron-LM's
    num_floating_point_operations (megatron/training/training.py, transformer_flops, BSHD):
    6·h·(f·F·dense + (f_moe·k + f_shared)·F·MoE layers) + attention + 6·h·v per token, F = 3
    with SwiGLU else 2, plus B·s²·core. The router, norms and embedding lookup are not counted.
    Multi-token prediction's D depths count as D more layers of the last layer's kind, plus
    6·D·(3h + 2h²) (their norms and projection) and D more logits."""
    s, h = m.seq_length, m.hidden_size
    depths = getattr(m, "mtp_num_layers", None) or 0
    dense, moe = _layer_kinds(m)
    layers = m.num_layers + depths
    ffn_factor = 3 if m.swiglu else 2
    shared = getattr(m, "moe_shared_expert_intermediate_size", None) or 0
    routed = m.moe_ffn * m.moe_router_topk if moe else 0
    mlp = 6 * h * ffn_factor * (m.ffn * dense + (routed + shared) * moe)
    projections, core = _attention_terms(m)
    per_token = (mlp + projections * layers + 6 * depths * (3 * h + 2 * h * h)
                 + 6 * h * padded_vocab * (1 + depths))
    return global_batch * s * per_token + global_batch * s * s * core * layers


def recomputed_flops(m, global_batch: int, modules: frozenset, recomputed_layers: int) -> float:
    """FLOPs computed again beyond the model's (hardware FLOPs = model + these): FlashAttention's
    backward recomputes QKᵀ (2Bs²·a·(d_n + d_r) per layer); selective core_attn re-runs the
    core's forward (QKᵀ and ·V); selective mlp re-runs the dense MLPs; full recompute re-runs the
    forward of `recomputed_layers` layers, each at the model's per-layer average (exact when
    every layer is recomputed, Megatron's uniform method). The MTP depths' layers count as
    layers throughout (they run the same attention, MLP and recompute)."""
    B, s, a, L = global_batch, m.seq_length, m.num_attention_heads, m.num_layers
    depths = getattr(m, "mtp_num_layers", None) or 0
    qk = m.qk_head_dim + m.qk_pos_emb_head_dim if m.multi_latent_attention else m.head_dim
    v_width = m.v_head_dim if m.multi_latent_attention else m.head_dim
    extra = 2 * B * s * s * a * qk * (L + depths) if m.flash else 0
    if "core_attn" in modules:
        extra += 2 * B * s * s * a * (qk + v_width) * (L + depths)
    if "mlp" in modules:
        dense, _ = _layer_kinds(m)
        extra += (3 if m.swiglu else 2) * 2 * B * s * m.hidden_size * m.ffn * dense
    if recomputed_layers and depths:  # full recompute of every layer: the MTP layers' too
        h = m.hidden_size
        forward = (megatron_flops(m, B, 0) - 6 * B * s * depths * (3 * h + 2 * h * h)) / 3
        again = recomputed_layers + (depths if recomputed_layers == L else 0)
        extra += forward * again / (L + depths)
    elif recomputed_layers:
        layers_forward = (megatron_flops(m, B, 0) / 3) * recomputed_layers / L
        extra += layers_forward
    return extra
