"""The gradient scaling around Megatron-LM's data-parallel reduction: by default each bucket's
gradients are multiplied by its gradient_scaling_factor, 1/(d·cp), in one element-wise kernel
on the compute stream just before the bucket's collective sums them; with
--ddp-average-in-collective the collective averages instead (ReduceOp.AVG), the dense buckets
get factor 1 (no kernel) and the expert buckets edp/(d·cp) (a kernel unless edp = d·cp).

Sources (NVIDIA/Megatron-LM d98e8a64): megatron/core/distributed/distributed_data_parallel.py
("Compute gradient scaling factors", Case 1 and Case 2), param_and_grad_buffer.py
start_grad_sync (`bucket.grad_data *= bucket.gradient_scaling_factor` when it is not 1, then
reduce_op AVG or SUM). NCCL runs ncclAvg on floating-point data as ncclDevPreMulSum with
1/nRanks (NVIDIA/nccl 5067397c src/enqueue.cc hostToDevRedOp): the multiply happens as each
input is loaded, the bytes moved and the algorithm (CollNet/NVLS support is looked up as
ncclSum, ncclGetCollNetSupport) are those of the sum, so the collective's time is unchanged.

Numeric mode: simsp's loss gradient is the global mean over B·s tokens (training/pipeline/
steps.py), which already holds the default 1/(d·cp); the default kernel is therefore priced
but multiplies nothing. Under --ddp-average-in-collective the loss gradient is the replica's
mean (d·cp times larger, as Megatron's), the expert kernel multiplies by edp/(d·cp) and the
collective pre-multiplies every input by 1/n, as NCCL does.
"""

import numpy as np


def scaling_factor(average: bool, dp_cp: int, group: int) -> float:
    """Megatron's gradient_scaling_factor of a bucket reduced over `group` ranks (d·cp for
    dense parameters, edp for expert ones): 1/(d·cp), or group/(d·cp) when the collective
    averages."""
    return group / dp_cp if average else 1.0 / dp_cp


def loss_gradient_factor(p) -> int:
    """What simsp's global-mean loss gradient is multiplied by (numeric mode): d·cp when the
    collective averages (the replica's mean, as Megatron's), else 1."""
    return p.dp * p.cp if p.ddp_average_in_collective else 1


def scale_bytes(numel: int, itemsize: int) -> int:
    """`grad_data *= factor` in place: reads and writes the bucket's gradient buffer."""
    return 2 * numel * itemsize


def scale_kernel(r, bucket, itemsize: int, average: bool, flat: np.ndarray | None):
    """The bucket's scaling kernel on the compute stream, when its factor is not 1; in numeric
    mode under the average, multiplies `flat` (numel,) by it (the default's 1/(d·cp) is in
    the loss gradient already)."""
    if bucket.scale == 1.0:
        return
    yield from r.compute("dp_grad_scale", "elementwise",
                         nbytes=scale_bytes(bucket.numel, itemsize))
    if average and flat is not None:
        flat *= bucket.scale


def pre_multiply(flat: np.ndarray | None, average: bool, group: int) -> None:
    """NCCL's average as it runs on floats: every input multiplied by 1/n, then summed."""
    if average and flat is not None:
        flat *= 1.0 / group
