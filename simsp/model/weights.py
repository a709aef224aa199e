"""A rank's parameter shards in its ledger: fp16 weights and fp32 main gradients (K22 §4);
other main-gradient dtypes and FP8 weight copies as simsp/scenario/precision.py states."""

import numpy as np

from simsp.model.sharding import local_shape, shard, unshard
from simsp.model.fp8 import add_weight_copy, is_fp8_param
from simsp.model.tensor import FP16


def allocate_params(r, shapes: dict, canonical: dict | None, strip: str = ""):
    """Allocate this rank's shards of `shapes` {canonical name: full shape}.

    Returns (weights, grads), dicts keyed by the name less `strip`; in numeric mode weights hold
    the rank's shard of `canonical` and grads start at zero."""
    weights, grads = {}, {}
    t, index = r.tp.size, r.tp.index
    for name, shape in shapes.items():
        local = name.removeprefix(strip)
        experts = r.moe is not None and r.moe.holds(name)  # E/EP experts, f/ETP each
        part = r.moe.shard_shape(name, shape) if experts else local_shape(name, shape, t)
        data = None
        if r.numeric:
            data = (r.moe.shard(name, canonical[name]) if experts
                    else shard(name, canonical[name], index, t)).astype(r.dtype)
        weights[local] = r.alloc(part, FP16, f"weight.{name}", "weights", data)
        if r.fp8 is not None and is_fp8_param(name, part):
            add_weight_copy(r, name, weights[local])
        zeros = np.zeros(part, dtype=r.dtype) if r.numeric else None
        grads[local] = r.alloc(part, r.precision.grad_bytes(local), f"grad.{name}", "gradients",
                               zeros)
    return weights, grads


def gather_grads(per_rank_grads: list[dict], names: list[str], strip: str = "") -> dict:
    """Canonical full gradients from every TP rank's shards (numeric mode)."""
    return {name: unshard(name, [g[name.removeprefix(strip)].data for g in per_rank_grads])
            for name in names}
