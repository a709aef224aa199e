"""Checks of activation recomputation: Megatron-LM's --recompute-method, --recompute-num-layers
and --recompute-modules (transformer_block.py, transformer_config.py; docs/llama.md,
docs/moe.md)."""

from simsp.scenario.checks.rule import check, positive
from simsp.scenario.config import Model, Parallel
from simsp.scenario.pipeline_split import model_chunks, virtual_stage_layer_counts

RECOMPUTE_MODULES = ("core_attn", "mlp", "layernorm")  # Megatron's names for a dense layer
MOE_RECOMPUTE_MODULES = ("moe", "moe_act", "shared_experts")  # and for a MoE layer


def recompute_method(m: Model, p: Parallel) -> None:
    """Megatron's --recompute-method/--recompute-num-layers: full granularity only; uniform
    groups must tile each model chunk's layers, block cannot exceed them (transformer_block.py)."""
    method, n = p.recompute_method, p.recompute_num_layers
    positive("parallel", p, ("recompute_num_layers",))
    if p.recompute_granularity != "full":
        for name in ("recompute_method", "recompute_num_layers"):
            check(getattr(p, name) is None, f"parallel.{name}",
                  f"only applies to recompute_granularity full, not {p.recompute_granularity}")
        return
    n = n or 1
    chunk_sizes = (virtual_stage_layer_counts(m, p) if p.uneven_pipeline else
                   (p.num_layers_per_virtual_pipeline_stage
                    or m.num_layers // p.pp // model_chunks(m, p),))
    for per_chunk in sorted(set(chunk_sizes) - {0}):  # a layout's empty stages recompute nothing
        if method == "block":
            check(n <= per_chunk, "parallel.recompute_num_layers",
                  f"block recomputes {n} layers but each model chunk has {per_chunk}")
        else:
            check(per_chunk % n == 0, "parallel.recompute_num_layers",
                  f"uniform groups of {n} do not divide the {per_chunk} layers of each model "
                  "chunk")


def recompute_modules(p: Parallel, moe: bool = False) -> None:
    """--recompute-modules, checked (and used) under selective granularity only, as Megatron's
    transformer_config.py does: its module names of the dense layer, and of a MoE layer in a
    MoE model (moe, moe_act, shared_experts; docs/moe.md); an empty list recomputes nothing."""
    if p.recompute_modules is None or p.recompute_granularity != "selective":
        return
    known = RECOMPUTE_MODULES + (MOE_RECOMPUTE_MODULES if moe else ())
    names = p.recompute_modules.split()
    for name in names:
        check(name in known, "parallel.recompute_modules",
              f"{name!r} is not one of {', '.join(known)}")
        check(names.count(name) == 1, "parallel.recompute_modules", f"{name!r} is named twice")
