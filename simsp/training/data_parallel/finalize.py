"""After the last backward: gradient reductions across DP, TP (SP) and pipeline (tied embedding).

Megatron-LM finalize_model_grads order: DP reduction of the gradient buckets (finish_grad_sync:
all-reduce, or reduce-scatter with the distributed optimizer;
training/data_parallel/grad_buckets.py), SP-partial LN/bias gradients over TP, and the tied
word-embedding gradient between the first and last pipeline stages (N21 §2.2, K22 §4.3).
"""

import numpy as np

from simsp.model import mappings
from simsp.model.tensor import Tensor
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


def tied_embedding_reduce(r, world, plan, grads: dict):
    """All-reduce the word-embedding gradient over Megatron's embedding group: the first and
    last pipeline stages (tied output layer, or multi-token prediction's lookups:
    finalize_model_grads.py); under standalone MTP the first stage, the MTP stage and, when
    tied, the last (pretrain_gpt.py get_embedding_ranks with get_mtp_ranks).

    Each rank's arrival goes to world.tied_embedding_arrivals; waiting for the other stages to
    arrive (the pipeline drain) is pipeline wait; the rest is pipeline transfer."""
    stages = _embedding_stages(world.scenario.model, plan)
    if plan.pp not in stages or len(stages) == 1:
        return  # one rank holds every copy (p 1, the V), or no copy is shared
    group = tuple(world.grid.rank_of(plan.tp, plan.dp, stage, plan.cp) for stage in stages)
    arrivals = world.tied_embedding_arrivals.setdefault(group, {})
    arrivals[r.rank] = start = r.env.now
    grad = grads["embedding.word"]
    yield from mappings.tensor_collective(r, "all_reduce", grad, grad.shape, grad.shape,
                                          "tied_embedding", label="all_reduce_embedding",
                                          group=group, track="pp_comm", blocking=False)
    last_arrival = max(arrivals.values())
    r.count_exposed("pp_wait", last_arrival - start)
    r.count_exposed("pp_transfer", r.env.now - last_arrival)


def _embedding_stages(m, plan) -> tuple:
    """The pipeline stages of the embedding group, in order (none without a shared copy)."""
    if not (m.tied or m.mtp_num_layers):
        return ()
    if plan.mtp_stage is None:
        return (0, plan.head_stage) if plan.head_stage != 0 else (0,)
    stages = {0, plan.stage_of(plan.mtp_stage)} | ({plan.head_stage} if m.tied else set())
    return tuple(sorted(stages))


def mirror_reduce(r, world, plan, grads: dict):
    """DualPipe: each model stage lives on two ranks (stage r on rank r as chunk 0 and on rank
    p-1-r as chunk 1), each copy's gradient summing only its own direction's micro-batches; the
    two copies' gradients are summed so both hold the full gradient, as deepseek-ai/DualPipe
    examples/example_dualpipe.py does after `step()` (`p0.grad += p1all[pp_size - 1 - rank]`).
    Modelled as one all-reduce of the rank's whole gradient buffer, names in sorted order (the
    mirror holds the same names), over the pair (rank, mirror) of the same tp, dp and cp: the
    bytes the example's exchange needs, without its all-gather over every pipeline rank."""
    if plan.mirror_stage is None:
        return
    names = sorted(grads)
    mirror = world.grid.rank_of(plan.tp, plan.dp, plan.mirror_stage, plan.cp)
    group = tuple(sorted((r.rank, mirror)))
    first = grads[names[0]]
    data = None if first.data is None else np.concatenate(
        [grads[n].data.reshape(-1) for n in names])  # (numel,)
    flat = Tensor((sum(grads[n].numel for n in names),), first.itemsize, data)
    start = r.env.now
    yield from mappings.tensor_collective(r, "all_reduce", flat, flat.shape, flat.shape,
                                          "dualpipe_mirror", label="all_reduce_mirror",
                                          group=group, track="pp_comm", blocking=False)
    r.count_exposed("pp_transfer", r.env.now - start)
    if flat.data is not None:
        offset = 0
        for n in names:
            grads[n].data = flat.data[offset:offset + grads[n].numel].reshape(grads[n].shape)
            offset += grads[n].numel


def finalize_grads(r, world, plan, state):
    """Every post-backward gradient reduction of the rank's state (training/pipeline/steps.py
    RankState), in Megatron-LM's order."""
    if state.fsdp is not None:  # sharded data parallelism (training/data_parallel/fsdp.py)
        yield from state.fsdp.finalize(r, world, plan)
        return
    yield from state.ddp_buckets.finish(r)
    yield from sync_sequence_parallel_grads(r, state.grads)
    yield from tied_embedding_reduce(r, world, plan, state.grads)
    yield from mirror_reduce(r, world, plan, state.grads)
