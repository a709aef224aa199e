"""Checks of the model alone: its shape, the Llama-class layer, multi-latent attention and
multi-token prediction (Megatron-LM arguments.py, transformer_config.py; docs/llama.md,
docs/mla.md, docs/mtp.md). MoE's model checks are in checks/moe.py."""

from simsp.scenario.checks.moe import moe_model
from simsp.scenario.checks.rule import check, positive
from simsp.scenario.config import Model


def validate_model(m: Model) -> None:
    """Shape checks of the model alone."""
    positive("model", m, ("make_vocab_size_divisible_by",))
    check(m.kv_channels is not None or m.hidden_size % m.num_attention_heads == 0,
          "model.hidden_size",
          f"{m.hidden_size} is not divisible by num_attention_heads={m.num_attention_heads}")
    llama_model(m)
    moe_model(m)
    mla_model(m)
    mtp_model(m)
    for name in ("hidden_dropout", "attention_dropout"):
        p = getattr(m, name)
        check(0.0 <= p < 1.0, f"model.{name}", f"must be in [0, 1), got {p}")


def llama_model(m: Model) -> None:
    """Megatron-LM's checks on the Llama-class fields (arguments.py, transformer_config.py)."""
    check(m.num_query_groups is None or m.group_query_attention, "model.num_query_groups",
          "needs group_query_attention (--group-query-attention)")
    check(m.num_attention_heads % m.query_groups == 0, "model.num_query_groups",
          f"{m.query_groups} does not divide num_attention_heads={m.num_attention_heads}")
    check(m.norm_epsilon > 0, "model.norm_epsilon", f"must be positive, got {m.norm_epsilon}")
    check(not (m.squared_relu and m.swiglu), "model.squared_relu",
          "one MLP activation: squared ReLU or SwiGLU, not both (Megatron-LM asserts the same)")
    check(not (m.squared_relu and m.num_experts is not None), "model.squared_relu",
          "built for the dense MLP only: the experts apply GeLU or SwiGLU (docs/llama.md)")
    check(0 < m.rotary_percent <= 1, "model.rotary_percent",
          f"must be in (0, 1], got {m.rotary_percent}")
    rope_width = m.qk_pos_emb_head_dim if m.multi_latent_attention else m.head_dim
    rotary = int(rope_width * m.rotary_percent)
    check(m.position_embedding_type != "rope" or (rotary > 0 and rotary % 2 == 0),
          "model.rotary_percent", f"rotates {rotary} of the {rope_width} head channels: "
          "needs an even, positive number")


def mtp_model(m: Model) -> None:
    """Multi-token prediction as simsp builds it (docs/mtp.md): positions from RoPE or none (a
    learned table would be rolled as the tokens)."""
    check(m.mtp_num_layers is None or m.position_embedding_type != "learned_absolute",
          "model.mtp_num_layers", "simsp's multi-token prediction needs "
          "--position-embedding-type rope or none")
    check(m.mtp_num_layers is None or m.mtp_num_layers < m.seq_length - 1, "model.mtp_num_layers",
          f"{m.mtp_num_layers} depths leave no position to predict at seq_length={m.seq_length} "
          f"(depth k predicts token t + k + 1 at s - k - 1 positions: at most seq_length - 2)")


def mla_model(m: Model) -> None:
    """Megatron-LM's checks on multi-latent attention (training.py asserts no GQA), and what
    simsp's MLA has (docs/mla.md): RMSNorm latents, RoPE."""
    if not m.multi_latent_attention:
        return
    check(not m.group_query_attention, "model.group_query_attention",
          "conflicts with multi_latent_attention (Megatron asserts it)")
    check(m.rmsnorm, "model.normalization", "multi-latent attention's latents are RMSNorm'd "
          "in simsp (DeepSeek's): use RMSNorm")
    check(m.position_embedding_type == "rope", "model.position_embedding_type",
          "multi-latent attention needs rope (its decoupled RoPE key)")
