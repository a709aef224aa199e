"""Data-parallel gradient buckets as Megatron-LM's DDP builds and reduces them.

Sources: megatron/core/distributed/param_and_grad_buffer.py and distributed_data_parallel.py,
distributed_optimizer.py (docs/MODEL.md#runtime-mechanisms). Each model chunk's gradients live
in one contiguous
buffer (fp32 with --accumulate-allreduce-grads-in-fp32, else 2 bytes) walked in reverse parameter
order and cut into buckets of at least max(40M, 1M·d) parameters; without
--overlap-grad-reduce the bucket size is unlimited (one bucket per chunk), and so it is on every
pipeline stage but the first and for every model chunk but the first (distributed_data_parallel.py
"Turn off bucketing if we are on a pipeline stage that is not the first"; training.py
disable_bucketing for chunks after the first). With the overlap, a
bucket's all-reduce (reduce-scatter with the distributed optimizer) is launched on the DP
communication stream as soon as the last micro-batch's backward has produced all its gradients;
`finish` waits for every bucket (finish_grad_sync). With --align-grad-reduce (Megatron-LM's
default) the schedule launches whole chunks instead (grad_sync_func, schedules.py): interleaved,
chunk c after the backward whose virtual micro-batch index minus the pipeline rank is chunk c's
last; not interleaved, only the first stage launches buckets during its last backward; the
rest launch at the end ("Launch any remaining grad reductions"). Readiness is tracked per layer (a layer's
gradients count as produced when its backward ends), per head and per embedding.
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

from dataclasses import dataclass, field
import math

import numpy as np
import simpy

from simsp.scenario.config import bucket_size
from simsp.engine.streams import Stream
from simsp.engine.trace import Trace
from simsp.model.fp8 import FP8_BYTES as FP8, is_fp8_param
from simsp.model.mappings import _bytes_sent
from simsp.model.params import layer_param_names
from simsp.model.tensor import FP16, FP32, Tensor
from simsp.training.data_parallel import standalone_mtp_params
from simsp.training.data_parallel.grad_scaling import pre_multiply, scale_kernel, scaling_factor

EMBEDDING = ("embedding.word", "embedding.position")
HEAD = ("final_ln.gamma", "final_ln.beta", "output.weight")  # output.weight: untied only


@dataclass
class Bucket:
    """Parameters in buffer (reverse forward) order, the padded element count, progress."""

    chunk: int
    names: tuple[str, ...]
    numel: int
    ready: set = field(default_factory=set)
    reduce: simpy.Process | None = None
    gather: simpy.Process | None = None
    group: tuple = ()  # the ranks reducing it: DP, or EDP for expert weights (set by DDPBuckets)
    param_bytes: int = FP16  # bytes per gathered parameter: 1 in an FP8 parameter buffer
    scale: float = 1.0  # gradient_scaling_factor (training/data_parallel/grad_scaling.py)


def build_buckets(params: list[tuple[str, int]], size: int | None, pad_to: int = 1,
                  shared: str | None = None, chunk: int = 0) -> list[Bucket]:
    """Cut (name, numel) params, given in forward order, into buckets walking them in reverse.

    A bucket closes once it holds >= `size` elements; `shared` (the pipeline's tied embedding
    copy, distributed optimizer) gets a bucket of its own; ends are padded to `pad_to`."""
    buckets, current = [], []

    def close():
        numel = sum(n for _, n in current)
        buckets.append(Bucket(chunk, tuple(name for name, _ in current),
                              -(-numel // pad_to) * pad_to))
        current.clear()

    for name, numel in reversed(params):
        if name == shared and current:
            close()
        current.append((name, numel))
        if name == shared or (size is not None and sum(n for _, n in current) >= size):
            close()
    if current:
        close()
    return buckets


def module_params(plan, module, grads: dict, producing: bool = False) -> list[str]:
    """Parameter names of a module ("embedding", "head" or a layer index) on this rank.

    `producing`: only those whose gradient is complete after this module's backward (the tied
    word embedding on a one-stage pipeline is finished by the embedding's backward)."""
    if plan.mtp_stage is not None:  # standalone MTP: each module where Megatron builds it
        return [n for n in standalone_mtp_params.module_names(module, grads) if n in grads]
    if module == "embedding":
        names = list(EMBEDDING)
    elif module == "head":
        names = _head_names(grads)
        if _shares_word_table(grads) and not (producing and plan.holds_embedding):
            names.append("embedding.word")
    else:
        names = layer_param_names(module)
    return [n for n in names if n in grads]


def chunk_params(plan, chunk: int, grads: dict) -> list[str]:
    """The chunk's parameters in Megatron's module order (shared word embedding copy last)."""
    if plan.mtp_stage is not None:
        return standalone_mtp_params.chunk_params(plan, chunk, grads)
    names = list(EMBEDDING) if plan.is_first(chunk) else []
    for i in plan.layers(chunk):
        names += layer_param_names(i)
    if plan.is_last(chunk):
        names += _head_names(grads)
        if not plan.holds_embedding and _shares_word_table(grads):  # V: rank 0 holds both
            names.append("embedding.word")
    return [n for n in names if n in grads]


def _head_names(grads: dict) -> list[str]:
    """The head's parameters in Megatron's module order: the final norm, the multi-token
    prediction depths (training/mtp.py), the untied output layer."""
    return list(HEAD[:2]) + [n for n in grads if n.startswith("mtp.")] + list(HEAD[2:])


def _shares_word_table(grads: dict) -> bool:
    """The last stage's copy of the word embedding: the tied output layer's, or the one
    multi-token prediction embeds with."""
    return "output.weight" not in grads or "mtp.0.eh_proj.weight" in grads


class DDPBuckets:
    """One rank's DP buckets, the stream they reduce on, and the pending all-gathers."""

    def __init__(self, r, p, grid, plan, grads: dict):
        """Rank r's buckets of `grads` under the parallel settings p, over its DP group on
        the rank grid."""
        self.group = grid.dp_cp_group(r.rank)  # CP ranks reduce with DP (Megatron)
        self.grads, self.plan = grads, plan
        self.distributed = p.distributed_optimizer
        self.fp8_params = p.fp8_param_gather and p.fp8_format is not None
        self.itemsize = FP32 if p.accumulate_allreduce_grads_in_fp32 else FP16
        self.last_micro_batch = p.num_micro_batches - 1
        self.stream = Stream(r.env, r.rank, "dp_comm", Trace())
        self.buckets = self._buckets(p, self.group)
        if r.moe is not None:  # expert weights: their own buffers, reduced over EDP
            self.buckets = expert_buckets(self, p, r.moe.edp_group)
        self.average = p.ddp_average_in_collective  # ReduceOp.AVG, no dense scale kernel
        for bucket in self.buckets:
            bucket.scale = scaling_factor(self.average, len(self.group), len(bucket.group))
        self.overlap = p.overlap_grad_reduce and bool(self.buckets)
        # --align-grad-reduce: the schedule launches whole chunks (grad_sync_func)
        self.align_reduce = self.overlap and p.align_grad_reduce
        self.overlap_gather = p.overlap_param_gather and bool(self.buckets)
        # --overlap-param-gather-with-optimizer-step: chunk 0 gathered by the step before
        self.gather_with_step = self.overlap_gather and p.overlap_param_gather_with_optimizer_step
        self.pending_gathers = [b for b in self._forward_order() if not (
            self.gather_with_step and b.chunk == 0)] if self.overlap_gather else []
        # --align-param-gather: whole chunks issued by the interleaved schedule
        self.align_gather = self.overlap_gather and p.align_param_gather and plan.v > 1
        # seconds the DP collectives ran and the program waited on them, by kind
        self.ran_s = {"all_gather": 0.0, "reduce": 0.0}
        self.waited_s = {"all_gather": 0.0, "reduce": 0.0}

    def _buckets(self, p, group: tuple, keep=lambda name: True) -> list[Bucket]:
        """Every chunk's buckets of the parameters `keep` accepts, reduced over `group` (none
        for a group of one), chunks in order, each chunk's in buffer (reverse) order."""
        if len(group) == 1:
            return []
        size = bucket_size(len(group), p.overlap_grad_reduce, p.ddp_bucket_size)
        pad = math.lcm(len(group), 128) if self.distributed else 1
        shared = "embedding.word" if self.distributed and not self.plan.holds_embedding else None
        buckets = []
        for chunk in range(self.plan.v):
            names = [n for n in chunk_params(self.plan, chunk, self.grads) if keep(n)]
            bucketed = chunk == 0 and self.plan.pp == 0 and \
                not p.overlap_param_gather_with_optimizer_step  # training.py: every chunk whole
            for itemsize, members in self._dtype_buffers(names):
                params = [(n, self.grads[n].numel) for n in members]
                built = build_buckets(params, size if bucketed else None, pad, shared, chunk)
                for bucket in built:
                    bucket.param_bytes = itemsize
                buckets += built
        for bucket in buckets:
            bucket.group = group
        return buckets

    def _dtype_buffers(self, names: list[str]) -> list[tuple[int, list[str]]]:
        """A chunk's parameters split as Megatron splits them into one buffer per parameter
        dtype (distributed_data_parallel.py _allocate_buffers_for_parameters: an FP8 parameter,
        --fp8-param-gather, is stored as torch.uint8 and gets a buffer of its own), in the
        order their first parameter appears: [(gathered bytes per element, names)]."""
        if not self.fp8_params:
            return [(FP16, names)]
        buffers = {}
        for n in names:
            itemsize = FP8 if is_fp8_param(n, self.grads[n].shape) else FP16
            buffers.setdefault(itemsize, []).append(n)
        return list(buffers.items())

    def _forward_order(self) -> list[Bucket]:
        """All-gather order: chunks in order, each chunk's buckets as its forward uses them."""
        return [b for c in range(self.plan.v) for b in reversed(self.buckets) if b.chunk == c]

    # ------------------------------------------------------------------ gradient reduction
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
        yield from scale_kernel(r, bucket, self.itemsize, self.average, flat.data)
        pre_multiply(flat.data, self.average, len(bucket.group))
        bucket.reduce = self._launch(r, kind, flat, f"{kind}_dp", "dp_grads", bucket.group)
        if r.numeric and not self.distributed:
            bucket.reduce.callbacks.append(lambda event: self._unflat(bucket, event.value))

    def _launch(self, r, kind: str, flat: Tensor, label: str, tag: str,
                group: tuple) -> simpy.Process:
        """Issue one DP collective on the DP stream, in place in Megatron's contiguous buffer
        (nothing allocated); bytes are counted now, so no layer step records them."""
        full_bytes = flat.nbytes * (len(group) if kind == "all_gather" else 1)
        r.count_comm(label, _bytes_sent(kind, len(group), full_bytes))
        return self.stream.launch(label, self._collective(r, kind, flat, full_bytes, tag,
                                                          group))

    def _collective(self, r, kind: str, flat: Tensor, full_bytes: int, tag: str, group: tuple):
        """The ring itself, with a span on the DP track; returns the flat result (numeric)."""
        start = r.env.now
        buffer = None if flat.data is None else flat.data  # (numel,)
        result = yield from getattr(r.tp.comm, kind)(group, r.rank, buffer, full_bytes,
                                                     tag, elem_bytes=flat.itemsize)
        if r.trace is not None:
            r.trace.add_span(r.rank, "dp_comm", f"{kind} {tag}", start, r.env.now,
                             {"bytes": full_bytes})
        self.ran_s[_overlap_kind(kind)] += r.env.now - start
        return result

    def _flat(self, bucket: Bucket) -> Tensor:
        """The bucket's slice of the contiguous gradient buffer: a ledger-less view."""
        data = None
        if self.grads[bucket.names[0]].data is not None:
            data = np.concatenate([self.grads[n].data.reshape(-1)
                                   for n in bucket.names])  # (numel,)
        return Tensor((bucket.numel,), self.itemsize, data)

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

    def _waited(self, r, kind: str, seconds: float) -> None:
        """The program waited `seconds` on DP collectives of one kind: exposed dp_comm."""
        self.waited_s[kind] += seconds
        r.count_exposed("dp_comm", seconds)

    def overlap_report(self) -> dict:
        """What the DP collectives hid and left exposed: per kind (parameter all-gather,
        gradient reduction), seconds run, seconds waited on (exposed) and the rest (hidden)."""
        return {kind: {"comm_s": self.ran_s[kind], "exposed_s": self.waited_s[kind],
                       "hidden_s": max(self.ran_s[kind] - self.waited_s[kind], 0.0)}
                for kind in self.ran_s}

    # ------------------------------------------------------------------ parameter all-gather
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

    def quiet(self, mb: int) -> bool:
        """Whether micro-batch `mb`'s layers neither wait for an all-gather nor launch a
        reduction (they may then be replayed back to back: training/pipeline/layer_chain.py)."""
        return not self.pending_gathers and not self._launches_in(mb)

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


def _overlap_kind(kind: str) -> str:
    """The overlap report's kind of a DP collective: all_gather, or reduce (the gradients'
    all-reduce or reduce-scatter)."""
    return "all_gather" if kind == "all_gather" else "reduce"


def expert_buckets(ddp: DDPBuckets, p, edp_group: tuple) -> list[Bucket]:
    """Megatron DDP's expert_parallel_buffers: the dense parameters' buckets over DP, the
    experts' over the expert-data-parallel group (megatron/core/distributed/
    distributed_data_parallel.py), each set built as the dense one is. (The MoE code is
    imported only by a model with experts.)"""
    from simsp.model.blocks.moe.placement import is_expert_param
    dense = ddp._buckets(p, ddp.group, lambda name: not is_expert_param(name))
    return dense + ddp._buckets(p, edp_group, is_expert_param)
