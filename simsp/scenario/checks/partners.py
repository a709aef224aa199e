"""Fields that only mean something beside another: given (a value other than its default)
without that partner, a field would be silently ignored, so it is refused in one line naming
both (Megatron-LM ignores most of them; docs/inputs-outputs.md, "Flags that need another")."""

import dataclasses

from simsp.scenario.checks.rule import check
from simsp.scenario.config import Model, Parallel

MOE_FIELDS = ("moe_router_topk", "moe_ffn_hidden_size", "moe_router_score_function",
              "moe_router_load_balancing_type", "moe_aux_loss_coeff", "moe_layer_freq",
              "moe_expert_capacity_factor", "moe_shared_expert_intermediate_size",
              "moe_routing_imbalance")
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
ROPE_FIELDS = ("rotary_base", "rotary_percent")
# model field -> (what it needs, whether the model has it)
MODEL_PARTNERS = {
    **{name: ("num_experts (a MoE model)", lambda m: m.num_experts is not None)
       for name in MOE_FIELDS},
    **{name: ("multi_latent_attention", lambda m: m.multi_latent_attention) for name in MLA_FIELDS},
    **{name: ("position_embedding_type rope", lambda m: m.position_embedding_type == "rope"
              or m.multi_latent_attention) for name in ROPE_FIELDS},
    "mtp_loss_scaling_factor": ("mtp_num_layers", lambda m: m.mtp_num_layers is not None),
}
# parallel field -> (what it needs, whether the layout has it)
PARALLEL_PARTNERS = {
    "moe_token_dispatcher_type": ("num_experts (a MoE model)", lambda m, p: m.num_experts
                                  is not None),
    "moe_grouped_gemm": ("num_experts (a MoE model)", lambda m, p: m.num_experts is not None),
    "moe_enable_deepep": ("num_experts (a MoE model)", lambda m, p: m.num_experts is not None),
    "fp8_recipe": ("fp8_format", lambda m, p: p.fp8_format is not None),
    **{name: ("fp8_format with fp8_recipe delayed", lambda m, p: p.fp8_format is not None
              and p.fp8_recipe == "delayed")
       for name in ("fp8_amax_history_len", "fp8_amax_compute_algo")},
}


def _given(obj, name: str) -> bool:
    """Whether the field holds a value other than its default (the table's)."""
    default = {f.name: f.default for f in dataclasses.fields(obj)}[name]
    return getattr(obj, name) != default


def partners(m: Model, p: Parallel) -> None:
    """Every field given without its partner is refused, naming both."""
    for name, (needs, has) in MODEL_PARTNERS.items():
        check(not _given(m, name) or has(m), f"model.{name}",
              f"needs {needs}: without it {name} would be ignored")
    for name, (needs, has) in PARALLEL_PARTNERS.items():
        check(not _given(p, name) or has(m, p), f"parallel.{name}",
              f"needs {needs}: without it {name} would be ignored")
