"""After the last backward: gradient reductions across TP (SP), pipeline (tied embedding) and DP.

Megatron-LM finalize_model_grads order: DP reduction of the gradient buffer (all-reduce, or
reduce-scatter with the distributed optimizer), SP-partial LN/bias gradients over TP, and the
tied word-embedding gradient between the first and last pipeline stages (N21 §2.2, K22 §4.3).
"""

import numpy as np

from simsp.model.grad_sync import sync_sequence_parallel_grads
from simsp.model.mappings import run_collective
from simsp.model.tensor import FP16, FP32, Tensor


def _flat(grads: dict, names: list[str]) -> Tensor:
    """The contiguous fp32 gradient buffer (Megatron keeps grads in one): a ledger-less view."""
    numel = sum(grads[n].numel for n in names)
    data = None
    if grads[names[0]].data is not None:
        data = np.concatenate([grads[n].data.reshape(-1) for n in names])  # (numel,)
    return Tensor((numel,), FP32, data)


def _unflat(grads: dict, names: list[str], flat: np.ndarray) -> None:
    offset = 0
    for n in names:
        size = grads[n].numel
        grads[n].data = flat[offset:offset + size].reshape(grads[n].shape)
        offset += size


def data_parallel_reduce(r, run, plan, grads: dict):
    """Sum gradients over the DP group: one all-reduce (or reduce-scatter) of the grad buffer."""
    group = run.world.grid.dp_group(r.rank)
    if len(group) == 1:
        return
    names = sorted(grads)
    flat = _flat(grads, names)
    if run.sc.parallel.distributed_optimizer:  # each rank keeps the sum of its 1/d shard
        shard = (-(-flat.numel // len(group)),)
        out = yield from run_collective(r, "reduce_scatter", flat, flat.shape, shard,
                                        "dp_grads", label="reduce_scatter_dp", group=group,
                                        track="dp_comm")
        r.free(out)  # in place in Megatron's contiguous grad buffer
        return
    out = yield from run_collective(r, "all_reduce", flat, flat.shape, flat.shape, "dp_grads",
                                    label="all_reduce_dp", group=group, track="dp_comm")
    if r.numeric:
        _unflat(grads, names, out.data.reshape(-1))


def data_parallel_gather_params(r, run, weights: dict):
    """Distributed optimizer: all-gather the updated fp16 parameters over DP."""
    group = run.world.grid.dp_group(r.rank)
    if len(group) == 1 or not run.sc.parallel.distributed_optimizer:
        return
    flat = Tensor((sum(w.numel for w in weights.values()),), FP16, None)
    out = yield from run_collective(r, "all_gather", flat, flat.shape, flat.shape, "dp_params",
                                    label="all_gather_dp", group=group, track="dp_comm")
    r.free(out)  # gathered in place into Megatron's parameter buffer: no extra memory remains


def tied_embedding_reduce(r, run, plan, grads: dict):
    """All-reduce the word-embedding gradient between the first and last pipeline stages."""
    if plan.p == 1 or not (plan.holds_embedding or plan.holds_head):
        return
    group = (run.rank_of(plan.tp, plan.dp, 0), run.rank_of(plan.tp, plan.dp, plan.p - 1))
    grad = grads["embedding.word"]
    yield from run_collective(r, "all_reduce", grad, grad.shape, grad.shape, "tied_embedding",
                              label="all_reduce_embedding", group=group, track="pp_comm")


def finalize_grads(r, run, plan, grads: dict):
    """Every post-backward gradient reduction, in Megatron-LM's order."""
    yield from data_parallel_reduce(r, run, plan, grads)
    yield from sync_sequence_parallel_grads(r, grads)
    yield from tied_embedding_reduce(r, run, plan, grads)
