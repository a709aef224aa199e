"""DDP's parameter all-gathers, bucket by bucket.

With the distributed optimizer the updated parameters are all-gathered per bucket after the
step; with --overlap-param-gather Megatron issues the first bucket's all-gather after the step and
each forward pre-hook waits for its bucket and issues the next one of the same model chunk
(param_and_grad_buffer.py finish_param_sync, next_param_gather_bucket_group; a chunk's first
bucket is issued by its first pre-hook). Interleaved, with --align-param-gather (Megatron-LM's
default there), the schedule issues whole chunks instead: chunks 0 and 1 at the start, chunk c+1
at the forward whose virtual micro-batch id plus the stage's pipeline rank is the first
micro-batch of chunk c (megatron/core/pipeline_parallel/schedules.py param_sync_func), and the
pre-hooks only wait. One simulated iteration stands for the steady state: the all-gather issued
at the end of the previous iteration is issued at time 0 here, and nothing is issued at the end
(it belongs to the next iteration).
"""

import simpy

from simsp.model.tensor import Tensor
from simsp.training.data_parallel.bucket_params import Bucket, module_params


class BucketGathers:
    """Issuing and waiting for the buckets' parameter all-gathers (mixed into grad_buckets.py
    DDPBuckets, whose __init__ holds the state)."""

    def _gather(self, r, bucket: Bucket) -> simpy.Process:
        """All-gather one bucket's updated parameters over DP (in place in Megatron): 2-byte
        BF16, or 1-byte FP8 data in an FP8 parameter buffer (--fp8-param-gather)."""
        shard = Tensor((bucket.numel // len(bucket.group),), bucket.param_bytes, None)
        return self._launch(r, "all_gather", shard, "all_gather_dp", "dp_params", bucket.group)

    def gather_params(self, r):
        """After the step, distributed optimizer: all-gather every bucket (unless overlapped)."""
        if not self.buckets or not self.distributed or self.overlap_gather:
            return
        start = r.env.now
        for bucket in self._forward_order():
            yield self._gather(r, bucket)
        self._waited(r, "all_gather", r.env.now - start)

    def start_param_gather(self, r) -> None:
        """--overlap-param-gather: the previous step's first all-gather, issued at time 0;
        aligned, chunks 0 and 1 (schedules.py: "Synchronize params for first two model
        chunks")."""
        if self.align_gather:
            for chunk in (0, 1):
                self.gather_chunk(r, chunk)
        elif self.pending_gathers and self.pending_gathers[0].chunk == 0:
            bucket = self.pending_gathers[0]
            bucket.gather = self._gather(r, bucket)

    def first_chunk_dense(self) -> set:
        """The parameters of model chunk 0's dense buffers: what Megatron's first chained
        optimizer steps (megatron/core/optimizer/__init__.py: [model_chunks[0]], then the other
        chunks, then every chunk's expert parameters)."""
        return {n for b in self.buckets if b.chunk == 0 and b.group == self.group
                for n in b.names}

    def gather_first_chunk(self, r) -> list:
        """--overlap-param-gather-with-optimizer-step: chunk 0's start_param_sync(force_dispatch)
        right after chunk 0's own step (megatron/core/optimizer/optimizer.py ChainedOptimizer.
        _step): every bucket of chunk 0, dense and expert, in forward order; their processes."""
        return [self._gather(r, b) for b in self._forward_order() if b.chunk == 0]

    def wait_first_chunk(self, r, gathers: list):
        """The iteration ends once chunk 0's all-gathers are done: the part that outlasts the
        step is what the next iteration's first forward (stage 0, chunk 0) waits for."""
        start = r.env.now
        yield simpy.AllOf(r.env, gathers)
        self._waited(r, "all_gather", r.env.now - start)

    def gather_chunk(self, r, chunk: int) -> None:
        """DDP.start_param_sync of one model chunk: issue its buckets' all-gathers, in the
        order its forward uses them."""
        for bucket in self.pending_gathers:
            if bucket.chunk == chunk and bucket.gather is None:
                bucket.gather = self._gather(r, bucket)

    def chunk_ahead_triggers(self, forwards: list) -> dict:
        """{forward index: chunk to gather before it} of the aligned interleaved schedule.

        forwards: the stage's forward steps' chunks in order (its virtual micro-batches).
        Megatron's forward_step_helper_preprocess: with j = index + pipeline rank, when j is
        the first micro-batch of chunk c, chunk c+1 is gathered if 1 < c+1 < v."""
        if not self.align_gather:
            return {}
        first = {}
        for j, chunk in enumerate(forwards):
            first.setdefault(chunk, j)
        triggers = {}
        for chunk, j in first.items():
            if 1 < chunk + 1 < self.plan.v and j - self.plan.pp >= 0:
                triggers[j - self.plan.pp] = chunk + 1
        return triggers

    def params_needed(self, r, chunk: int, modules: list | tuple):
        """Forward pre-hook: wait for the all-gathers up to these params', issue the next (an
        empty tuple when no all-gather is pending: nothing to wait for, no generator)."""
        if not self.pending_gathers:
            return ()
        return self._wait_gathers(r, chunk, modules)

    def _wait_gathers(self, r, chunk: int, modules: list | tuple):
        names = {n for m in modules for n in module_params(self.plan, m, self.grads)}
        while any(b.chunk == chunk and names & set(b.names) for b in self.pending_gathers):
            bucket = self.pending_gathers.pop(0)
            if bucket.gather is None:  # finish_param_sync issues a bucket not yet issued
                bucket.gather = self._gather(r, bucket)
            start = r.env.now
            yield bucket.gather
            self._waited(r, "all_gather", r.env.now - start)
            nxt = self.pending_gathers[0] if self.pending_gathers else None
            if nxt is not None and nxt.chunk == bucket.chunk and not self.align_gather:
                nxt.gather = self._gather(r, nxt)  # next_param_gather_bucket_group
