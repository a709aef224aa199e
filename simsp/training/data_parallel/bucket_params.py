"""The parameters of a module or model chunk in Megatron's order, and a chunk's gradient buffer
cut into buckets walking them in reverse (megatron/core/distributed/param_and_grad_buffer.py)."""

from dataclasses import dataclass, field

import simpy

from simsp.model.params import layer_param_names
from simsp.model.tensor import FP16
from simsp.training.data_parallel import standalone_mtp_params

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
    grad_bytes: int = 4  # bytes per reduced gradient (set by DDPBuckets; apex_buckets.py)


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
