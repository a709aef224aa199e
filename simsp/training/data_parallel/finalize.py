"""After the last backward: gradient reductions across DP, TP (SP) and pipeline (tied embedding).

Megatron-LM finalize_model_grads order: DP reduction of the gradient buckets (finish_grad_sync:
all-reduce, or reduce-scatter with the distributed optimizer; training/data_parallel/grad_buckets.py),
SP-partial LN/bias gradients over TP, and the tied word-embedding gradient between the first and
last pipeline stages (N21 §2.2, K22 §4.3).
"""

from simsp.training.data_parallel.sp_grad_sync import sync_sequence_parallel_grads
from simsp.model.mappings import tensor_collective


def data_parallel_reduce(r, run, plan, grads: dict):
    """Sum gradients over the DP group: wait for (or launch, then wait for) every bucket."""
    yield from run.states[r.rank].ddp_buckets.finish(r, run)


def data_parallel_gather_params(r, run, weights: dict):
    """Distributed optimizer: all-gather the updated fp16 parameters over DP, bucket by bucket."""
    yield from run.states[r.rank].ddp_buckets.gather_params(r, run)


def tied_embedding_reduce(r, run, plan, grads: dict):
    """All-reduce the word-embedding gradient between the first and last pipeline stages
    (tied output layer, or multi-token prediction's lookups: finalize_model_grads.py).

    Waiting for the other stage to arrive (the pipeline drain) is pipeline wait; the rest is
    pipeline transfer."""
    m = run.sc.model
    if plan.p == 1 or not (plan.holds_embedding or plan.holds_head) or not (
            m.tied or m.mtp_num_layers):
        return  # untied without multi-token prediction: nothing is shared
    group = (run.rank_of(plan.tp, plan.dp, 0, plan.cp),
             run.rank_of(plan.tp, plan.dp, plan.p - 1, plan.cp))
    arrivals = run.tied_embedding_arrivals.setdefault(group, {})
    arrivals[r.rank] = start = r.env.now
    grad = grads["embedding.word"]
    yield from tensor_collective(r, "all_reduce", grad, grad.shape, grad.shape, "tied_embedding",
                                 label="all_reduce_embedding", group=group, track="pp_comm",
                                 blocking=False)
    last_arrival = max(arrivals.values())
    r.count_exposed("pp_wait", last_arrival - start)
    r.count_exposed("pp_transfer", r.env.now - last_arrival)


def finalize_grads(r, run, plan, grads: dict):
    """Every post-backward gradient reduction, in Megatron-LM's order."""
    fsdp = run.states[r.rank].fsdp
    if fsdp is not None:  # sharded data parallelism (training/data_parallel/fsdp.py)
        yield from fsdp.finalize(r, run, plan)
        return
    yield from data_parallel_reduce(r, run, plan, grads)
    yield from sync_sequence_parallel_grads(r, grads)
    yield from tied_embedding_reduce(r, run, plan, grads)
