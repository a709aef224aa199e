"""Checks of the CUDA-graph flags: the combinations Megatron-LM refuses
(megatron/training/arguments.py validate_args, megatron/core/transformer/transformer_config.py
__post_init__, cuda_graph_config.py; NVIDIA/Megatron-LM d98e8a64; docs/launch.md)."""

from simsp.scenario.checks.rule import check
from simsp.scenario.config import Model, Parallel
from simsp.scenario.cuda_graphs import (DEPRECATED_SCOPES, GRAPH_MODULES, graph_impl,
                                        graph_modules, scope_words)

SCOPE = "parallel.cuda_graph_modules"


def cuda_graphs(m: Model, p: Parallel) -> None:
    """The flags' own combinations, then the per-layer modules against the model and layout."""
    for name in ("enable_cuda_graph", "external_cuda_graph"):
        check(not getattr(p, name) or p.cuda_graph_impl == "none", f"parallel.{name}",
              f"do not use --{name.replace('_', '-')} with --cuda-graph-impl (Megatron)")
    check(not (p.enable_cuda_graph and p.external_cuda_graph), "parallel.external_cuda_graph",
          "--enable-cuda-graph and --external-cuda-graph cannot be enabled at the same time")
    check(p.cuda_graph_scope is None or p.cuda_graph_modules is None, SCOPE,
          "--cuda-graph-scope and --cuda-graph-modules cannot be used together")
    _scope_words(p)
    impl = graph_impl(p)
    if impl == "none":
        return
    check(impl == "full_iteration" or not p.cpu_offloading, "parallel.cpu_offloading",
          "CUDA graphs not supported with CPU offloading (cuda_graph_impl full_iteration only)")
    check(p.recompute_granularity != "full" or impl == "full_iteration",
          "parallel.recompute_granularity", "full recompute is only supported with "
          "cuda_graph_impl full_iteration")
    check(impl != "full_iteration" or not graph_modules(p), SCOPE,
          "must be empty when cuda_graph_impl is full_iteration")
    if impl in ("local", "transformer_engine"):
        _per_layer(m, p, impl)


def _scope_words(p: Parallel) -> None:
    """Every word a CudaGraphModule name or a deprecated scope; "full" alone; the deprecated
    "full_iteration" not with transformer_engine (cuda_graph_config.py)."""
    words = scope_words(p)
    for word in words:
        check(word in GRAPH_MODULES + DEPRECATED_SCOPES, SCOPE,
              f"{word!r} is not one of {', '.join(GRAPH_MODULES + DEPRECATED_SCOPES)}")
        check(words.count(word) == 1, SCOPE, f"{word!r} is named twice")
    check("full" not in words or words == ("full",), SCOPE,
          "full scope cannot be used with other scopes")
    check("full_iteration" not in words or p.cuda_graph_impl in ("none", "local"), SCOPE,
          f"'full_iteration' cannot be combined with cuda_graph_impl {p.cuda_graph_impl}")


def _per_layer(m: Model, p: Parallel, impl: str) -> None:
    """transformer_config.py: moe and moe_router exclusive; moe_preprocess needs moe_router
    (local adds it); moe needs a MoE model with drop-and-pad; mlp needs a dense layer."""
    modules = graph_modules(p)
    check(not {"moe", "moe_router"} <= set(modules), SCOPE,
          "must not contain both moe and moe_router")
    check(impl == "local" or "moe_preprocess" not in modules or "moe_router" in modules, SCOPE,
          "moe_preprocess cuda graph is only supported with moe_router cuda graph")
    if m.num_experts is None or m.num_experts <= 1:
        check("moe" not in modules and "moe_router" not in modules, SCOPE,
              "moe cuda graph is only supported for MoE")
        return
    dense = any(not m.is_moe_layer(i) for i in range(m.num_layers))
    check(dense or "mlp" not in modules, SCOPE,
          "mlp cuda graph is only supported for dense layers, but not found in the model")
    drop_pad = m.moe_expert_capacity_factor is not None and m.moe_pad_expert_input_to_capacity
    check(drop_pad or "moe" not in modules, SCOPE,
          "moe cuda graph is only supported with drop-padding MoE")
