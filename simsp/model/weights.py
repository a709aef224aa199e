"""A rank's parameter shards in its ledger: fp16 weights and fp32 main gradients (K22 §4);
other main-gradient dtypes and FP8 weight copies as simsp/precision.py states."""

import numpy as np

from simsp.model.sharding import local_shape, shard, unshard
from simsp.model.fp8 import add_weight_copy, is_fp8_param
from simsp.model.moe_placement import local_expert_slice
from simsp.model.tensor import FP16


def allocate_params(r, shapes: dict, canonical: dict | None, strip: str = ""):
    """Allocate this rank's shards of `shapes` {canonical name: full shape}.

    Returns (weights, grads), dicts keyed by the name less `strip`; in numeric mode weights hold
    the rank's shard of `canonical` and grads start at zero."""
    weights, grads = {}, {}
    t, index = r.tp.size, r.tp.index
    for name, shape in shapes.items():
        local = name.removeprefix(strip)
        part = local_shape(name, shape, t)
        experts = local_expert_slice(r.moe, name, shape)  # expert parallelism: E/EP experts
        if experts is not None:
            part = (experts.stop - experts.start,) + part[1:]
        data = None
        if r.numeric:
            full = canonical[name] if experts is None else canonical[name][experts]
            data = shard(name, full, index, t).astype(r.dtype)
        weights[local] = r.alloc(part, FP16, f"weight.{name}", "weights", data)
        if r.fp8 is not None and is_fp8_param(name, part):
            add_weight_copy(r, name, weights[local])
        zeros = np.zeros(part, dtype=r.dtype) if r.numeric else None
        grads[local] = r.alloc(part, r.precision.main_grad_bytes, f"grad.{name}", "gradients",
                               zeros)
    return weights, grads


def gather_grads(per_rank_grads: list[dict], names: list[str], strip: str = "") -> dict:
    """Canonical full gradients from every TP rank's shards (numeric mode)."""
    return {name: unshard(name, [g[name.removeprefix(strip)].data for g in per_rank_grads])
            for name in names}
