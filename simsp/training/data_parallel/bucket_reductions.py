"""DDP's gradient reductions, bucket by bucket.

With the overlap, a bucket's all-reduce (reduce-scatter with the distributed optimizer) is
launched on the DP communication stream as soon as the last micro-batch's backward has produced
all its gradients; `finish` waits for every bucket (finish_grad_sync). With --align-grad-reduce
(Megatron-LM's default) the schedule launches whole chunks instead (grad_sync_func, schedules.py):
interleaved, chunk c after the backward whose virtual micro-batch index minus the pipeline rank is
chunk c's last; not interleaved, only the first stage launches buckets during its last backward;
the rest launch at the end ("Launch any remaining grad reductions"). Readiness is tracked per
layer (a layer's gradients count as produced when its backward ends), per head and per embedding.
"""

import numpy as np
import simpy

from simsp.model.tensor import Tensor
from simsp.training.data_parallel.bucket_params import Bucket, module_params
from simsp.training.data_parallel.grad_scaling import pre_multiply, scale_kernel


class BucketReductions:
    """Launching and waiting for the buckets' reductions (mixed into grad_buckets.py DDPBuckets,
    whose __init__ holds the state)."""

    def grads_ready(self, r, plan, chunk: int, mb: int, modules: list):
        """A module's backward ended: in the last micro-batch, launch every completed bucket
        (a generator: each launch runs its scaling kernel first; an empty tuple when this
        micro-batch launches nothing)."""
        if not self._launches_in(mb):
            return ()
        return self._launch_ready(r, plan, chunk, modules)

    def _launch_ready(self, r, plan, chunk: int, modules: list):
        for module in modules:
            done = set(module_params(plan, module, self.grads, producing=True))
            for bucket in self.buckets:
                if bucket.chunk == chunk and bucket.reduce is None:
                    bucket.ready |= done & set(bucket.names)
                    if len(bucket.ready) == len(bucket.names):
                        yield from self._launch_reduce(r, bucket)

    def _launch_reduce(self, r, bucket: Bucket):
        """start_grad_sync of one bucket: its scaling kernel on the compute stream, then its
        all-reduce (reduce-scatter) on the DP stream, summing or averaging."""
        kind = "reduce_scatter" if self.distributed else "all_reduce"
        flat = self._flat(bucket)
        yield from scale_kernel(r, bucket, bucket.grad_bytes, self.average, flat.data)
        pre_multiply(flat.data, self.average, len(bucket.group))
        bucket.reduce = self._launch(r, kind, flat, f"{kind}_dp", "dp_grads", bucket.group)
        if r.numeric and not self.distributed:
            bucket.reduce.callbacks.append(lambda event: self._unflat(bucket, event.value))

    def _flat(self, bucket: Bucket) -> Tensor:
        """The bucket's slice of the contiguous gradient buffer: a ledger-less view."""
        data = None
        if self.grads[bucket.names[0]].data is not None:
            data = np.concatenate([self.grads[n].data.reshape(-1)
                                   for n in bucket.names])  # (numel,)
        return Tensor((bucket.numel,), bucket.grad_bytes, data)

    def _unflat(self, bucket: Bucket, flat: np.ndarray) -> None:
        offset = 0
        for n in bucket.names:
            size = self.grads[n].numel
            self.grads[n].data = flat[offset:offset + size].reshape(self.grads[n].shape)
            offset += size

    def finish(self, r):
        """finish_grad_sync: launch what is not launched yet, wait for every bucket."""
        if not self.buckets:
            return
        for bucket in self.buckets:
            if bucket.reduce is None:
                yield from self._launch_reduce(r, bucket)
        start = r.env.now
        yield simpy.AllOf(r.env, [b.reduce for b in self.buckets])
        self._waited(r, "reduce", r.env.now - start)

    def _launches_in(self, mb: int) -> bool:
        """Whether micro-batch mb's backward launches bucket reductions (--overlap-grad-reduce:
        the last micro-batch; aligned, only on the first stage of a non-interleaved pipeline,
        schedules.py grad_sync_first_stage)."""
        if self.align_reduce and (self.plan.v > 1 or self.plan.pp > 0):
            return False
        return self.overlap and mb == self.last_micro_batch

    def reduce_chunk(self, r, chunk: int):
        """DDP.start_grad_sync of one model chunk: launch its buckets not yet launched."""
        for bucket in self.buckets:
            if bucket.chunk == chunk and bucket.reduce is None:
                yield from self._launch_reduce(r, bucket)

    def chunk_reduce_triggers(self, backwards: list) -> dict:
        """{backward index: chunk whose reductions launch after it}, aligned and interleaved.

        backwards: the stage's backward steps' chunks in order. Megatron's
        backward_step_helper_postprocess: with j = index − pipeline rank, when j is the last
        micro-batch of chunk c, chunk c's reductions launch; the rest at the end
        (finish)."""
        if not (self.align_reduce and self.plan.v > 1):
            return {}
        last = {chunk: j for j, chunk in enumerate(backwards)}
        return {j + self.plan.pp: chunk for chunk, j in last.items()
                if j + self.plan.pp < len(backwards)}
