"""One pre-LN transformer layer on one tensor-parallel rank: hand-written forward and backward.

Column-parallel QKV and h->4h, row-parallel output projection and 4h->h (Megatron-LM, N21 §2.3);
heads split across ranks; with SP the LN/dropout regions hold an s/t slice of the sequence
(K22 §4.2.2). Tensors kept for backward carry the names of docs/MODEL.md#activation-memory:

| name                       | shape (per rank)      | bytes          |
|----------------------------|-----------------------|----------------|
| ln1_input                  | (s_l, b, h)           | 2sbh  (/t SP)  |
| qkv_input                  | (s_l, b, h)           | 2sbh  (/t SP)  |
| q, k                       | (b, a/t, s, d) each   | 4sbh/t         |
| softmax_output             | (b, a/t, s, s)        | 2as²b/t        |
| softmax_dropout_mask       | (b, a/t, s, s)        | as²b/t         |
| attention_dropout_output   | (b, a/t, s, s)        | 2as²b/t        |
| v                          | (b, a/t, s, d)        | 2sbh/t         |
| proj_input                 | (s, b, h/t)           | 2sbh/t         |
| attn_dropout_mask          | (s_l, b, h)           | sbh   (/t SP)  |
| ln2_input                  | (s_l, b, h)           | 2sbh  (/t SP)  |
| fc1_input                  | (s_l, b, h)           | 2sbh  (/t SP)  |
| gelu_input, fc2_input      | (s, b, f/t) each      | 16sbh/t        |
| mlp_dropout_mask           | (s_l, b, h)           | sbh   (/t SP)  |
s_l = s/t under SP, else s. Selective recompute drops the three (b, a/t, s, s) tensors and
recomputes them in backward; full recompute keeps only `layer_input` and re-runs this forward.
"""

from dataclasses import dataclass
import math

import numpy as np

from simsp.config import Model
from simsp.model import mappings, ops
from simsp.model.dropout_sites import site_id
from simsp.model.tensor import FP16


@dataclass(frozen=True)
class LayerSpec:
    """What one layer instance needs beyond its weights."""

    model: Model
    layer: int  # global layer index: names dropout sites
    recompute: str  # none | selective | full
    sample_offset: int = 0  # global index of this micro-batch's first sample


class Stash:
    """Tensors kept for backward: saved as activations, or (keep=False) freed after forward."""

    def __init__(self, r, keep: bool):
        self.r, self.keep, self.tensors = r, keep, {}

    def put(self, name: str, tensor):
        if tensor is None:
            return
        if self.keep:
            self.r.save(tensor, name)
        self.tensors[name] = tensor

    def release(self):
        """Free every stashed tensor (full recompute: only the layer input outlives forward)."""
        self.r.free(*self.tensors.values())
        self.tensors = {}


def _seq_start(r, s_local: int) -> int:
    return r.tp.index * s_local if r.tp.sequence_parallel else 0


def _hidden_mask(r, spec: LayerSpec, site: str, x):
    """Keep-mask of a hidden dropout over global (seq, sample, hidden) coordinates."""
    p = spec.model.hidden_dropout
    if p == 0:
        return None
    starts = (_seq_start(r, x.shape[0]), spec.sample_offset, 0)
    return ops.dropout_mask(r, p, site_id(spec.layer, site), starts, x.shape, f"{site}_mask")


def split_qkv(r, qkv, heads: int, head_dim: int):
    """(s, b, 3h/t) head-major fused QKV -> q, k, v each (b, a/t, s, d)."""
    s, b, _ = qkv.shape
    parts = []
    for j, name in enumerate(("q", "k", "v")):
        t = r.alloc((b, heads, s, head_dim), FP16, name)
        if r.numeric:
            t.data = np.ascontiguousarray(
                qkv.data.reshape(s, b, heads, 3, head_dim)[:, :, :, j, :].transpose(1, 2, 0, 3))
        parts.append(t)
    yield from r.compute("split_qkv", "elementwise", nbytes=2 * qkv.nbytes)
    return parts


def merge_qkv_grads(r, dq, dk, dv):
    """dq, dk, dv (b, a/t, s, d) -> d(qkv) (s, b, 3h/t) in the head-major fused layout."""
    b, heads, s, d = dq.shape
    out = r.alloc((s, b, 3 * heads * d), FP16, "d_qkv")
    if r.numeric:
        stacked = np.stack([dq.data, dk.data, dv.data], axis=3)  # (b, a/t, s, 3, d)
        out.data = stacked.transpose(2, 0, 1, 3, 4).reshape(s, b, 3 * heads * d)
    yield from r.compute("merge_qkv_grads", "elementwise", nbytes=2 * out.nbytes)
    return out


def attention_core(r, spec: LayerSpec, q, k, v):
    """softmax(QKᵀ/√d) -> dropout -> ·V. Returns probs, mask, dropped, context (b, a/t, s, ·)."""
    b, heads, s, d = q.shape
    scores = yield from ops.batched_matmul(r, q, k, "attention_scores", transpose_b=True,
                                           scale=1.0 / math.sqrt(d))  # (b, a/t, s, s)
    probs = yield from ops.causal_softmax(r, scores, "softmax_output")
    r.free(scores)
    p = spec.model.attention_dropout
    mask = None
    if p > 0:
        starts = (spec.sample_offset, r.tp.index * heads, 0, 0)
        mask = ops.dropout_mask(r, p, site_id(spec.layer, "attention"), starts, probs.shape,
                                "softmax_dropout_mask")
    dropped = yield from ops.dropout(r, probs, mask, p, "attention_dropout_output")
    context = yield from ops.batched_matmul(r, dropped, v, "context")  # (b, a/t, s, d)
    return probs, mask, dropped, context


def _stash_core(stash: Stash, probs, mask, dropped):
    stash.put("softmax_output", probs)
    stash.put("softmax_dropout_mask", mask)
    if dropped is not probs:
        stash.put("attention_dropout_output", dropped)


def _free_core(r, probs, mask, dropped):
    r.free(probs, mask, None if dropped is probs else dropped)


def _row_parallel_out(r, spec, x, weight, bias, name: str, residual, out_name: str):
    """x @ W (partial sums) -> f̄/ḡ -> residual + dropout(· + bias). Returns output, mask."""
    partial = yield from ops.linear(r, x, weight, None, f"{name}_output")  # (s, b, h)
    reduced = yield from mappings.exit_forward(r, partial, f"{name}_exit")  # (s_l, b, h)
    if reduced is not partial:
        r.free(partial)
    mask = _hidden_mask(r, spec, f"{name}_out", reduced)
    out = yield from ops.bias_dropout_add(r, reduced, bias, mask, spec.model.hidden_dropout,
                                          residual, out_name)  # (s_l, b, h)
    r.free(reduced)
    return out, mask


def layer_forward(r, spec: LayerSpec, w: dict, x, keep: bool = True):
    """x (s_l, b, h) -> (s_l, b, h). Returns (output, stash of tensors kept for backward)."""
    m = spec.model
    heads, d = m.num_attention_heads // r.tp.size, m.head_dim
    stash = Stash(r, keep)
    if keep:
        stash.put("ln1_input", x)
    y1 = yield from ops.layernorm(r, x, w["ln1.gamma"], w["ln1.beta"], "ln1_output")
    stash.put("qkv_input", y1)
    y1_full = yield from mappings.enter_forward(r, y1, "qkv_enter")  # (s, b, h)
    qkv = yield from ops.linear(r, y1_full, w["attn.qkv.weight"], w["attn.qkv.bias"], "qkv")
    if y1_full is not y1:
        r.free(y1_full)
    q, k, v = yield from split_qkv(r, qkv, heads, d)  # (b, a/t, s, d) each
    r.free(qkv)
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        stash.put(name, tensor)
    probs, mask, dropped, context = yield from attention_core(r, spec, q, k, v)
    if spec.recompute == "selective":
        _free_core(r, probs, mask, dropped)
    else:
        _stash_core(stash, probs, mask, dropped)
    s, b = context.shape[2], context.shape[0]
    proj_in = yield from ops.reshape_copy(r, context, (s, b, heads * d), (2, 0, 1, 3),
                                          "proj_input")  # (s, b, h/t)
    r.free(context)
    stash.put("proj_input", proj_in)
    residual, attn_mask = yield from _row_parallel_out(
        r, spec, proj_in, w["attn.proj.weight"], w["attn.proj.bias"], "attn", x, "ln2_input")
    stash.put("attn_dropout_mask", attn_mask)
    stash.put("ln2_input", residual)
    out = yield from _mlp_forward(r, spec, w, residual, stash)
    if not keep:
        stash.release()
    return out, stash.tensors


def _mlp_forward(r, spec, w, residual, stash: Stash):
    """LN2 -> h->4h -> GeLU -> 4h->h -> dropout -> + residual."""
    y2 = yield from ops.layernorm(r, residual, w["ln2.gamma"], w["ln2.beta"], "fc1_input")
    stash.put("fc1_input", y2)
    y2_full = yield from mappings.enter_forward(r, y2, "fc1_enter")  # (s, b, h)
    h1 = yield from ops.linear(r, y2_full, w["mlp.fc1.weight"], w["mlp.fc1.bias"],
                               "gelu_input")  # (s, b, f/t)
    if y2_full is not y2:
        r.free(y2_full)
    stash.put("gelu_input", h1)
    g = yield from ops.gelu(r, h1, "fc2_input")  # (s, b, f/t)
    stash.put("fc2_input", g)
    out, mlp_mask = yield from _row_parallel_out(r, spec, g, w["mlp.fc2.weight"],
                                                 w["mlp.fc2.bias"], "mlp", residual,
                                                 "layer_output")
    stash.put("mlp_dropout_mask", mlp_mask)
    return out
