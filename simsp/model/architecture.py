"""One line naming a model's layer variant, as reports print it (e.g. "GQA 64/8, SwiGLU f = 28672,
RMSNorm, RoPE, untied, flash"); "GPT" for K22's layer, whose reports stay as they were."""

from simsp.model.blocks.mlp.activation import activation_of
from simsp.scenario.config import Model


def _attention(m: Model) -> str:
    if m.multi_latent_attention:
        query = "q proj" if m.q_lora_rank is None else f"r_q = {m.q_lora_rank}"
        return (f"MLA {m.num_attention_heads} {query} r_kv = {m.kv_lora_rank} "
                f"d = {m.qk_head_dim} + {m.qk_pos_emb_head_dim} rope, d_v = {m.v_head_dim}")
    a, groups = m.num_attention_heads, m.query_groups
    kind = "MHA" if groups == a else "MQA" if groups == 1 else "GQA"
    text = f"{kind} {a}" if groups == a else f"{kind} {a}/{groups}"
    return text + (f" d = {m.head_dim}" if m.kv_channels else "")


def architecture(m: Model) -> str:
    """The variant's parts in Megatron-LM's terms, or "GPT" for the K22 layer."""
    if not (m.llama_layer or m.squared_relu or not m.tied
            or m.position_embedding_type != "learned_absolute"):
        return "GPT"
    position = {"rope": f"RoPE base {m.rotary_base}" + (
        f" {m.rotary_percent:g} of d" if m.rotary_percent < 1 else ""),
        "learned_absolute": "learned positions", "none": "no positions"}
    parts = [_attention(m), f"{activation_of(m).label} f = {m.ffn}", m.normalization,
             position[m.position_embedding_type], "tied" if m.tied else "untied"]
    if m.num_experts is not None:
        moe_layers = sum(m.is_moe_layer(i) for i in range(m.num_layers))
        parts.insert(2, f"MoE {m.num_experts} experts top-{m.moe_router_topk} "
                        f"f = {m.moe_ffn} in {moe_layers} of {m.num_layers} layers")
    if not m.add_bias_linear:
        parts.append("no bias")
    if m.flash:
        parts.append("flash")
    if m.mtp_num_layers:
        parts.append(f"MTP {m.mtp_num_layers} x {m.mtp_loss_scaling_factor:g}")
    return ", ".join(parts)
