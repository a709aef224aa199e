"""Data-parallel gradient buckets as Megatron-LM's DDP builds and reduces them.

Sources: megatron/core/distributed/param_and_grad_buffer.py and distributed_data_parallel.py,
distributed_optimizer.py (docs/MODEL.md#runtime-mechanisms). Each model chunk's gradients live
in one contiguous
buffer (fp32 with --accumulate-allreduce-grads-in-fp32, else 2 bytes; 2 under
--grad-reduce-in-bf16, scenario/precision.py) walked in reverse parameter
order and cut into buckets of at least max(40M, 1M·d) parameters; without
--overlap-grad-reduce the bucket size is unlimited (one bucket per chunk), and so it is on every
pipeline stage but the first and for every model chunk but the first (distributed_data_parallel.py
"Turn off bucketing if we are on a pipeline stage that is not the first"; training.py
disable_bucketing for chunks after the first). The buckets' reductions are bucket_reductions.py,
their parameter all-gathers bucket_gathers.py, the parameters and the cutting bucket_params.py;
with --bucket-cap-mb the buckets are Apex DistributedFusedAdam's as NeMo lays them out
(apex_buckets.py), launched and gathered by the same code.
"""

import math

import simpy

from simsp.engine.streams import Stream
from simsp.engine.trace import Trace
from simsp.model.fp8 import FP8_BYTES as FP8, is_fp8_param
from simsp.model.mappings import _bytes_sent
from simsp.model.tensor import FP16, Tensor
from simsp.scenario.config import bucket_size
from simsp.scenario.precision import grad_reduce_bytes
from simsp.training.data_parallel.apex_buckets import apex_buckets
from simsp.training.data_parallel.bucket_gathers import BucketGathers
from simsp.training.data_parallel.bucket_params import Bucket, build_buckets, chunk_params
from simsp.training.data_parallel.bucket_reductions import BucketReductions
from simsp.training.data_parallel.grad_scaling import scaling_factor


class DDPBuckets(BucketReductions, BucketGathers):
    """One rank's DP buckets, the stream they reduce on, and the pending all-gathers."""

    def __init__(self, r, p, grid, plan, grads: dict):
        """Rank r's buckets of `grads` under the parallel settings p, over its DP group on
        the rank grid."""
        self.group = grid.dp_cp_group(r.rank)  # CP ranks reduce with DP (Megatron)
        self.grads, self.plan = grads, plan
        self.distributed = p.distributed_optimizer
        self.fp8_params = p.fp8_param_gather and p.fp8_format is not None
        self.itemsize = grad_reduce_bytes(p)
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
        if p.bucket_cap_mb is not None:  # Apex DistributedFusedAdam as NeMo lays it out
            buckets = apex_buckets(p, self.plan, self.grads, self.itemsize, len(group))
            for bucket in buckets:
                bucket.group = group
            return buckets
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
                    bucket.param_bytes, bucket.grad_bytes = itemsize, self.itemsize
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

    def quiet(self, mb: int) -> bool:
        """Whether micro-batch `mb`'s layers neither wait for an all-gather nor launch a
        reduction (they may then be replayed back to back: training/pipeline/layer_chain.py)."""
        return not self.pending_gathers and not self._launches_in(mb)


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
