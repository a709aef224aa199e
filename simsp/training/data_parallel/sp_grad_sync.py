"""Gradient reductions after backward: SP-partial replicated parameters over the TP group."""

from simsp.model import mappings
from simsp.model.sharding import needs_sp_grad_sync


def sync_sequence_parallel_grads(r, grads: dict, prefix: str = ""):
    """All-reduce (TP group) the fp32 grads that SP leaves partial: LN params, row-parallel biases.

    Megatron-LM finalize_model_grads does the same (K22 §4.2.2: LN acts on a sequence shard)."""
    if not r.tp.sequence_parallel:
        return
    for local, grad in grads.items():
        if needs_sp_grad_sync(prefix + local):
            yield from mappings.all_reduce(r, grad, f"sp_grad {prefix}{local}",
                                           label="all_reduce_sp_grads")
