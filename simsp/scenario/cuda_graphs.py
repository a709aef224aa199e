"""What a scenario's CUDA-graph flags capture, as Megatron-LM resolves them (docs/launch.md):
--enable-cuda-graph is --cuda-graph-impl local, --external-cuda-graph transformer_engine; --cuda-graph-scope is the older spelling of
--cuda-graph-modules; "full" (or nothing) captures the whole layer; the deprecated scope value
"full_iteration" is --cuda-graph-impl full_iteration (megatron/training/arguments.py
validate_args, megatron/core/transformer/cuda_graph_config.py, NVIDIA/Megatron-LM d98e8a64).
"""

# Megatron-LM megatron/core/transformer/enums.py CudaGraphModule
GRAPH_MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
# accepted for compatibility (cuda_graph_config.py): whole layer, whole iteration, inference only
DEPRECATED_SCOPES = ("full", "full_iteration", "full_iteration_inference")


def scope_words(p) -> tuple[str, ...]:
    """The words of --cuda-graph-modules, else of --cuda-graph-scope (none: the whole layer)."""
    text = p.cuda_graph_modules if p.cuda_graph_modules is not None else p.cuda_graph_scope
    return tuple((text or "").split())


def graph_impl(p) -> str:
    """The capture implementation Megatron runs: none, local, transformer_engine, full_iteration."""
    if p.enable_cuda_graph:
        return "local"
    if p.external_cuda_graph:
        return "transformer_engine"
    if "full_iteration" in scope_words(p):
        return "full_iteration"
    return p.cuda_graph_impl


def graph_modules(p) -> tuple[str, ...]:
    """The per-layer capture modules (CudaGraphModule names); () captures the whole layer."""
    return tuple(word for word in scope_words(p) if word not in DEPRECATED_SCOPES)
