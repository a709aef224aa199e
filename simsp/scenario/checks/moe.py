"""Checks of mixture of experts: the MoE model fields and the expert layout (Megatron-LM
arguments.py, parallel_state.py; docs/moe.md)."""

from simsp.errors import UserError
from simsp.scenario.checks.rule import check
from simsp.scenario.config import Model, Parallel
from simsp.scenario.moe_pattern import moe_layer_pattern


def moe_layer_freq(m: Model) -> None:
    """An int >= 1 (its range is the table's), or a pattern of num_layers 0/1 entries (Megatron
    arguments.py)."""
    freq = m.moe_layer_freq
    if not isinstance(freq, str):
        return
    try:
        pattern = moe_layer_pattern(freq)
    except ValueError as exc:
        raise UserError("model.moe_layer_freq", f"{freq!r}: {exc}") from None
    check(len(pattern) == m.num_layers, "model.moe_layer_freq",
          f"{freq!r} gives {len(pattern)} layers, not num_layers={m.num_layers}")


def moe_model(m: Model) -> None:
    """Megatron-LM's checks on the MoE fields (arguments.py), and what simsp's MoE layer has."""
    if m.num_experts is None:
        return
    moe_layer_freq(m)
    check(m.moe_router_topk <= m.num_experts, "model.moe_router_topk",
          f"{m.moe_router_topk} exceeds num_experts={m.num_experts}")
    cf = m.moe_expert_capacity_factor
    check(cf is None or cf > 0, "model.moe_expert_capacity_factor", f"must be positive, got {cf}")
    check(cf is not None or not m.moe_pad_expert_input_to_capacity,
          "model.moe_pad_expert_input_to_capacity", "needs moe_expert_capacity_factor")
    check(not m.add_bias_linear, "model.num_experts",
          "simsp's experts have no biases: add --disable-bias-linear")


def expert_parallel(m: Model, p: Parallel) -> None:
    """Megatron-LM's checks on the expert layout (arguments.py, parallel_state.py
    initialize_model_parallel: tp·cp·dp = etp·ep·edp) and what simsp's MoE layer has."""
    if m.num_experts is None:
        check(p.ep == 1 and p.expert_tensor_parallel_size is None,
              "parallel.expert_model_parallel_size", "needs num_experts (a MoE model)")
        return
    t, ep, etp = p.tp, p.ep, p.etp
    check(m.num_experts % ep == 0, "parallel.expert_model_parallel_size",
          f"num_experts={m.num_experts} is not divisible by {ep}")
    dense = f"tensor*data parallel = {t}*{p.dp}" if p.cp == 1 else \
        f"tensor*context*data parallel = {t}*{p.cp}*{p.dp}"
    check((t * p.cp * p.dp) % (etp * ep) == 0, "parallel.expert_model_parallel_size",
          f"{dense} is not divisible by expert tensor*expert "
          f"parallel = {etp}*{ep} (Megatron: the expert grid tiles each stage's ranks)")
    check(m.moe_ffn % etp == 0, "parallel.expert_tensor_parallel_size",
          f"moe_ffn_hidden_size={m.moe_ffn} is not divisible by {etp}")
    check(t == 1 or p.sequence_parallel, "parallel.sequence_parallel",
          "MoE with tensor parallelism needs sequence parallelism (Megatron arguments.py)")
    shared = m.moe_shared_expert_intermediate_size
    check(not shared or shared % t == 0, "model.moe_shared_expert_intermediate_size",
          f"{shared} is not divisible by tensor_model_parallel_size={t}")
    flex_dispatcher(m, p)
    modules = p.recompute_module_set or frozenset()
    check(p.recompute_granularity != "selective" or not modules & {"mlp", "layernorm"},
          "parallel.recompute_modules", "MoE layers: recomputing mlp or layernorm is not "
          "built yet (core_attn is)")


def expert_comm_overlap(m: Model, p: Parallel) -> None:
    """Megatron-Core's checks on --overlap-moe-expert-parallel-comm and --delay-wgrad-compute
    (NVIDIA/Megatron-LM megatron/core/transformer/transformer_config.py __post_init__, commit
    d98e8a6), in its order."""
    check(not p.delay_wgrad_compute or p.overlap_moe_expert_parallel_comm,
          "parallel.delay_wgrad_compute", "needs overlap_moe_expert_parallel_comm (Megatron)")
    if not p.overlap_moe_expert_parallel_comm:
        return
    name = "parallel.overlap_moe_expert_parallel_comm"
    check(p.pp == 1 or p.schedule_name == "interleaved", name,
          "needs virtual pipeline stages (the interleaved schedule) when "
          f"pipeline_model_parallel_size={p.pp} > 1 (Megatron)")
    check(p.schedule_name not in ("zb-h1", "zb-h2", "zbv", "dualpipev", "dualpipe"), name,
          f"runs Megatron's combined 1F1B (1F1B at PP 1, interleaved above), not the "
          f"{p.schedule_name} schedule")
    check(p.ep > 1, name, "needs expert_model_parallel_size > 1 (Megatron)")
    check(p.moe_token_dispatcher_type in ("alltoall", "flex"), name,
          f"needs moe_token_dispatcher_type alltoall or flex, not "
          f"{p.moe_token_dispatcher_type} (Megatron)")
    check(p.recompute_granularity != "full", name, "refuses recompute_granularity full (Megatron)")
    check(p.recompute_method is None and p.recompute_num_layers is None, name,
          "refuses recompute_method and recompute_num_layers (Megatron)")
    check("moe" not in p.recompute_module_set, name,
          "refuses moe in recompute_modules (Megatron)")
    check(m.mtp_num_layers in (None, 0, 1), name,
          f"supports at most one MTP layer, not mtp_num_layers={m.mtp_num_layers} (Megatron)")


def flex_dispatcher(m: Model, p: Parallel) -> None:
    """Megatron-LM's flex dispatcher checks (megatron/core/transformer/moe/token_dispatcher.py
    MoEFlexTokenDispatcher, transformer_config.py __post_init__): DeepEP enabled, TP·EP > 1,
    no padding to capacity; and what simsp's DeepEP path has (ETP 1: docs/deepep.md)."""
    flex = p.moe_token_dispatcher_type == "flex"
    check(flex or not p.moe_enable_deepep, "parallel.moe_enable_deepep",
          "needs moe_token_dispatcher_type flex (Megatron transformer_config.py)")
    if not flex:
        return
    check(p.moe_enable_deepep, "parallel.moe_token_dispatcher_type",
          "flex needs --moe-enable-deepep (the DeepEP backend; HybridEP is not modelled)")
    check(p.tp * p.ep > 1, "parallel.moe_token_dispatcher_type", "flex needs TP*EP > 1")
    check(not m.moe_pad_expert_input_to_capacity, "model.moe_pad_expert_input_to_capacity",
          "not supported by the flex dispatcher")
    check(p.etp == 1, "parallel.expert_tensor_parallel_size",
          "the flex dispatcher is modelled with expert tensor parallelism 1 only")
