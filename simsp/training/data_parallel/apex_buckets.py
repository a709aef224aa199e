"""Apex DistributedFusedAdam's gradient and parameter buckets as NeMo lays them out
(--bucket-cap-mb, NeMo's optim.bucket_cap_mb; docs/MODEL.md).

Sources: NVIDIA/apex apex/contrib/optimizers/distributed_fused_adam.py at 810ffae3 (the APEX_TAG
of NVIDIA/NeMo r2.0.0rc1 Dockerfile.ci). __init__ "Determine bucket sizes": a bucket holds
bucket_cap_mb MiB of the optimizer's grad_sync_dtype, its shard int(elements / d) rounded down
to 128 bytes' worth of elements (`alignment = 128 // dtype_size`), the bucket shard x d;
init_params_bucket closes every earlier bucket and fills new ones, each fragment's start rounded
up to the alignment (_init_param_state); a bucket's gradients are reduce-scattered and its
parameters all-gathered whole, its empty tail included (_start_bucket_grad_sync,
_start_bucket_param_sync). NVIDIA/NeMo r2.0.0rc1 nemo/collections/nlp/models/language_modeling/
megatron_gpt_model.py configure_optimizers: one init_params_bucket per transformer layer, model
chunks in order, then reversed; the first layer's also takes every parameter in no layer
(embeddings, final norm, output layer) and those whose overlapped sync is disabled (the
sequence-parallel norms and biases); the word and position embeddings keep fp32 gradients
(`_with_fp32_optimizer`, with_fp32_embedding_grads default True), which nemo/core/optim/
distributed_adam.py init_params_bucket fills first into buckets of their own with grad_sync_dtype
fp32 (the same element count, the default shard size), then the rest. Every bucket of a layer's
call depends on all its parameters (the "trivial" fragments), so it is ready with the layer.
"""

from simsp.model.params import layer_param_names
from simsp.model.sharding import needs_sp_grad_sync
from simsp.model.tensor import FP32
from simsp.scenario.precision import APEX_FP32_GRAD_PARAMS
from simsp.training.data_parallel.bucket_params import Bucket

MIB = 1024 * 1024
ALIGNMENT_BYTES = 128  # `self.alignment = 128 // dtype_size`
FP32_GRAD_PARAMS = APEX_FP32_GRAD_PARAMS  # NeMo with_fp32_embedding_grads (scenario/precision.py)


def bucket_elements(cap_mb: float, grad_bytes: int, d: int) -> int:
    """Elements of every bucket: the shard of cap_mb MiB over d ranks, rounded down to the
    alignment (at least one alignment), times d."""
    alignment = ALIGNMENT_BYTES // grad_bytes
    shard = int(MIB * cap_mb / grad_bytes / d) // alignment * alignment
    return max(shard, alignment) * d


def buckets_filled(numels: list[int], size: int, alignment: int) -> int:
    """Buckets of `size` elements that parameters of `numels` fill in order, each fragment
    starting at a multiple of `alignment`, a new bucket when the current one has no room."""
    if not numels:
        return 0
    count, filled = 1, 0
    for left in numels:
        while left > 0:
            start = -(-filled // alignment) * alignment
            if start >= size:
                count, filled = count + 1, 0
                continue
            taken = min(left, size - start)
            left, filled = left - taken, start + taken
    return count


def layer_groups(plan, grads: dict, sequence_parallel: bool) -> list[tuple[int, list[str]]]:
    """(chunk, names) of each init_params_bucket call, in call order: the layers in reverse,
    the first layer of the first chunk last with every parameter no layer group took."""
    def own(name: str) -> bool:
        return name in grads and not (sequence_parallel and needs_sp_grad_sync(name))
    groups = [(chunk, [n for n in layer_param_names(i) if own(n)])
              for chunk in range(plan.v) for i in plan.layers(chunk)]
    groups.reverse()
    if not groups:
        return [(0, list(grads))]
    taken = {n for _, names in groups for n in names}
    groups[-1][1].extend(n for n in grads if n not in taken)
    return groups


def apex_buckets(p, plan, grads: dict, grad_bytes: int, d: int) -> list[Bucket]:
    """Every bucket of the rank in Apex's bucket order, each with its call's parameters (its
    readiness), its full element count and its gradients' bytes per element."""
    size = bucket_elements(p.bucket_cap_mb, grad_bytes, d)
    alignment = ALIGNMENT_BYTES // grad_bytes  # the optimizer's, for every bucket
    buckets = []
    for chunk, names in layer_groups(plan, grads, p.sequence_parallel):
        fp32 = [n for n in names if n in FP32_GRAD_PARAMS]
        rest = [n for n in names if n not in FP32_GRAD_PARAMS]
        for members, nbytes in ((fp32, FP32), (rest, grad_bytes)):
            count = buckets_filled([grads[n].numel for n in members], size, alignment)
            for _ in range(count):
                bucket = Bucket(chunk, tuple(names), size)
                bucket.grad_bytes = nbytes
                buckets.append(bucket)
    return buckets

