"""A rank's parameter shards in its ledger: fp16 weights and fp32 main gradients (K22 §4)."""

import numpy as np

from simsp.model.sharding import local_shape, shard, unshard
from simsp.model.tensor import FP16, FP32


def allocate_params(r, shapes: dict, canonical: dict | None, strip: str = ""):
    """Allocate this rank's shards of `shapes` {canonical name: full shape}.

    Returns (weights, grads), dicts keyed by the name less `strip`; in numeric mode weights hold
    the rank's shard of `canonical` and grads start at zero."""
    weights, grads = {}, {}
    t, index = r.tp.size, r.tp.index
    for name, shape in shapes.items():
        local = name.removeprefix(strip)
        part = local_shape(name, shape, t)
        data = shard(name, canonical[name], index, t).astype(r.dtype) if r.numeric else None
        weights[local] = r.alloc(part, FP16, f"weight.{name}", "weights", data)
        zeros = np.zeros(part, dtype=r.dtype) if r.numeric else None
        grads[local] = r.alloc(part, FP32, f"grad.{name}", "gradients", zeros)
    return weights, grads


def gather_grads(per_rank_grads: list[dict], names: list[str], strip: str = "") -> dict:
    """Canonical full gradients from every TP rank's shards (numeric mode)."""
    return {name: unshard(name, [g[name.removeprefix(strip)].data for g in per_rank_grads])
            for name in names}
