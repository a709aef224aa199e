"""Gradient buckets a data-parallel group of each pipeline stage reduces, counted before the
run from the scenario alone, as training/data_parallel/grad_buckets.py DDPBuckets (and Apex's
apex_buckets.py) build them on its ranks: the work estimate's data-parallel flows
(shortcuts/work_counts.py estimated_counts)."""

import math

from simsp.model.params import param_shapes
from simsp.model.sharding import local_shape
from simsp.scenario.config import bucket_size
from simsp.scenario.pipeline_layout import standalone_mtp_stage
from simsp.scenario.pipeline_split import model_chunks, virtual_stage_layer_counts
from simsp.scenario.precision import grad_reduce_bytes
from simsp.scenario.work import buckets_of, layer_tensors
from simsp.training.data_parallel.apex_buckets import (ALIGNMENT_BYTES, bucket_elements,
                                                        buckets_filled)


def stage_layers(sc) -> list[int]:
    """Transformer layers per pipeline stage, its model chunks' together (Megatron's split:
    scenario/pipeline_split.py), shape (p,)."""
    p = sc.parallel
    layers = [0] * p.pp
    for virtual, count in enumerate(virtual_stage_layer_counts(sc.model, p)):
        layers[virtual % p.pp] += count
    return layers


def stage_buckets(sc, stage: int) -> int:
    """Gradient buckets a data-parallel group of pipeline stage `stage` reduces, as
    training/data_parallel/grad_buckets.py DDPBuckets builds them after Megatron-LM
    megatron/core/distributed/distributed_data_parallel.py (bucket_size None on pipeline ranks
    > 0 and for model chunks after the first): the first stage's first chunk cut at the bucket
    size (its layers and the embedding, scenario/work.py bucket_count), every other chunk one
    bucket; with the distributed optimizer the last stage's copy of the word embedding one
    more (tied to the output layer, or the multi-token prediction depths' embedding: plan.py
    stage_param_names); under standalone MTP the MTP stage's copy instead
    (docs/pipeline-layout.md)."""
    p, m = sc.parallel, sc.model
    if p.bucket_cap_mb is not None:
        return _apex_stage_buckets(sc, stage)
    chunks = model_chunks(m, p)
    buckets = _first_chunk_buckets(sc, chunks) + chunks - 1 if stage == 0 else chunks
    mtp = standalone_mtp_stage(p.pipeline_model_parallel_layout)
    if mtp is not None:  # the MTP chunk's copy of the table; the loss chunk holds its copy alone
        return buckets + (p.distributed_optimizer and stage == mtp % p.pp)
    word_copy = m.tied or bool(m.mtp_num_layers)  # the head's, or the MTP depths' embedding
    return buckets + (p.distributed_optimizer and word_copy and p.pp > 1 and stage == p.pp - 1)


SP_LAYER_TENSORS = (3, 7, 8, 9, 10, 11)  # layer_tensors' row-parallel biases and norms


def _apex_stage_buckets(sc, stage: int) -> int:
    """Apex's buckets on a rank of stage `stage` (training/data_parallel/apex_buckets.py): each
    layer's tensors filled alone, but the sequence-parallel ones; the first layer's with them,
    the final norm and an untied output layer; the embeddings (fp32 gradients) apart."""
    p, m = sc.parallel, sc.model
    grad_bytes = grad_reduce_bytes(p)
    size = bucket_elements(p.bucket_cap_mb, grad_bytes, p.dp * p.cp)
    alignment = ALIGNMENT_BYTES // grad_bytes
    tensors = layer_tensors(sc)  # shape (12,)
    partial = SP_LAYER_TENSORS if p.sequence_parallel else ()
    own = [n for i, n in enumerate(tensors) if i not in partial]
    layers = stage_layers(sc)[stage]
    table = m.vocab_size * m.hidden_size // p.tp
    fp32, rest = [], (own if layers else []) + [tensors[i] for i in partial] * layers
    if stage == 0:
        fp32.append(table)
        if m.position_embedding_type == "learned_absolute":
            fp32.append(m.seq_length * m.hidden_size)
    if stage == p.pp - 1:
        rest += [m.hidden_size] * 2
        if not m.tied:
            rest.append(table)
        elif p.pp > 1:
            fp32.append(table)
    return (max(layers - 1, 0) * buckets_filled(own, size, alignment)
            + buckets_filled(fp32, size, alignment) + buckets_filled(rest, size, alignment))


def _first_chunk_buckets(sc, chunks: int) -> int:
    """Buckets of the first stage's first chunk: its parameters (model/params.py param_shapes,
    a TP rank's shard each: model/sharding.py local_shape; the experts' apart, reduced over
    their own group) in module order, the embedding tables first, the head last where the chunk
    is also the last (one stage, one chunk: bucket_params.py chunk_params), walked in reverse
    (build_buckets) and cut at the bucket size."""
    p, m = sc.parallel, sc.model
    layers = virtual_stage_layer_counts(m, p)[0]
    last = p.pp == 1 and chunks == 1
    shapes = param_shapes(m)
    kept = [name for name in shapes if not _expert(m, name) and (
        name.startswith("embedding.") or _layer_of(name) < layers
        or (last and not name.startswith("layers.")))]
    tensors = [math.prod(local_shape(n, shapes[n], p.tp)) for n in kept]  # shape (kept,)
    size = bucket_size(p.dp, p.overlap_grad_reduce, p.ddp_bucket_size)
    if p.overlap_param_gather_with_optimizer_step:  # Megatron's training.py: every chunk whole
        size = None
    return buckets_of(tensors[::-1], size)


def _expert(m, name: str) -> bool:
    """Whether a parameter is an expert weight (model/blocks/moe/placement.py is_expert_param,
    imported only for a model with experts)."""
    if m.num_experts is None:
        return False
    from simsp.model.blocks.moe.placement import is_expert_param
    return is_expert_param(name)


def _layer_of(name: str) -> int:
    """The layer index of a `layers.{i}.` parameter, else a number past every layer."""
    return int(name.split(".")[1]) if name.startswith("layers.") else 1 << 62
