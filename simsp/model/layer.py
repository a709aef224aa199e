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

Llama-class variants (docs/llama.md has their tensors and closed forms): RMSNorm keeps the same
inputs as LayerNorm; RoPE rotates q and k in place of a position table (nothing more kept);
group-query attention splits the fused QKV into a/t query and G/t KV heads, and the unfused core
expands K and V to the query heads (Megatron DotProductAttention's repeat_interleave) so it keeps
K22's q, k, v; FlashAttention keeps q, k, v unexpanded, its output (which is `proj_input`) and
the fp32 logsumexp `softmax_lse` (b, a/t, s), no s × s tensor; SwiGLU keeps `swiglu_input`
(s, b, 2f/t) and `fc2_input` (s, b, f/t).
"""

from dataclasses import dataclass
import math

import numpy as np

from simsp.scenario.config import Model
from simsp.model import kernels, mappings, ops
from simsp.model.context_split import rank_rows, rope_tables
from simsp.model.dropout_sites import site_id
from simsp.model.tensor import FP16, Tensor


@dataclass(frozen=True)
class LayerSpec:
    """What one layer instance needs beyond its weights."""

    model: Model
    layer: int  # global layer index: names dropout sites
    recompute: str  # none | selective | full
    sample_offset: int = 0  # global index of this micro-batch's first sample
    modules: frozenset = frozenset(("core_attn",))  # selective: Megatron's --recompute-modules
    aux_scale: float = 1.0  # MoE aux loss gradient: b/B (1/micro-batches, DP-averaged)

    @property
    def moe(self) -> bool:
        """Whether this layer's MLP is a mixture of experts (simsp/model/blocks/moe/layer.py)."""
        return self.model.num_experts is not None and self.model.is_moe_layer(self.layer)

    def recomputes(self, module: str) -> bool:
        """Whether selective recompute rebuilds `module` (core_attn, mlp, layernorm) in backward."""
        return self.recompute == "selective" and module in self.modules


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


def _hidden_mask(r, spec: LayerSpec, site: str, x):
    """Keep-mask of a hidden dropout over global (seq, sample, hidden) coordinates."""
    p = spec.model.hidden_dropout
    if p == 0:
        return None
    starts = (rank_rows(r, x.shape[0]), spec.sample_offset, 0)
    return ops.dropout_mask(r, p, site_id(spec.layer, site), starts, x.shape, f"{site}_mask")


def split_qkv(r, qkv, heads: int, head_dim: int, groups: int | None = None,
              names: tuple = ("q", "k", "v")):
    """(s, b, (a + 2G)d/t) group-major fused QKV -> q (b, a/t, s, d), k, v (b, G/t, s, d)."""
    s, b, _ = qkv.shape
    groups = groups or heads
    parts = []
    for j, name in enumerate(names):
        t = r.alloc((b, heads if j == 0 else groups, s, head_dim), FP16, name)
        if r.numeric:
            t.data = np.ascontiguousarray(kernels.split_qkv(qkv.data, heads, groups)[j])
        parts.append(t)
    yield from r.compute("split_qkv", "elementwise", nbytes=2 * qkv.nbytes)
    return parts


def merge_qkv_grads(r, dq, dk, dv):
    """dq (b, a/t, s, d), dk, dv (b, G/t, s, d) -> d(qkv) (s, b, (a + 2G)d/t), group-major."""
    b, heads, s, d = dq.shape
    out = r.alloc((s, b, (heads + 2 * dk.shape[1]) * d), FP16, "d_qkv")
    if r.numeric:
        out.data = kernels.merge_qkv_grads(dq.data, dk.data, dv.data)
    yield from r.compute("merge_qkv_grads", "elementwise", nbytes=2 * out.nbytes)
    return out


def norm(r, m: Model, x, w: dict, prefix: str, name: str):
    """LayerNorm or RMSNorm (--normalization) of x (s_l, b, h) with the weights under prefix."""
    if m.normalization == "RMSNorm":
        return (yield from ops.rmsnorm(r, x, w[f"{prefix}.gamma"], m.norm_epsilon, name))
    return (yield from ops.layernorm(r, x, w[f"{prefix}.gamma"], w[f"{prefix}.beta"],
                                     m.norm_epsilon, name))


def rope_angles(m: Model, s: int, cp=None):
    """cos, sin (s, rot) of positions 0..s−1: attention sees the whole sequence on every TP
    rank (SP gathers it first), so every rank applies the same angles; with context
    parallelism (`cp`, a rank's CpAttention) those of its chunks' global positions
    (model/context_split.py rope_tables)."""
    rot = int(m.head_dim * m.rotary_percent)
    if cp is not None:
        return rope_tables(cp.positions, rot, m.rotary_base)
    return kernels.rope_angles(s, rot, m.rotary_base)


def attention_keep(r, spec: LayerSpec, b: int, heads: int):
    """The flash tiles' dropout keep-mask drawer (global coordinates: each tile is a slice of
    the unfused path's mask), or None without dropout or data."""
    p = spec.model.attention_dropout
    if p == 0 or not r.numeric:
        return None
    site, start = site_id(spec.layer, "attention"), r.tp.index * heads
    return lambda i0, i1, j0, j1: kernels.keep_mask(
        p, r.seed, site, (spec.sample_offset, start, i0, j0), (b, heads, i1 - i0, j1 - j0))

def cp_attention_keep(r, spec: LayerSpec, b: int, heads: int):
    """The context-parallel attention's dropout keep-mask drawer, at global positions:
    (q_pos (nq,), k_pos (nk,), first head, heads) -> (b, heads, nq, nk), the coordinates of
    attention_keep's tiles (so every layout drops the same probabilities); None without
    dropout or data."""
    p = spec.model.attention_dropout
    if p == 0 or not r.numeric:
        return None
    site, start = site_id(spec.layer, "attention"), r.tp.index * heads
    return lambda q_pos, k_pos, first, count: kernels.keep_mask(
        p, r.seed, site, (spec.sample_offset, start + first, q_pos, k_pos),
        (b, count, len(q_pos), len(k_pos)))


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
    y1 = yield from norm(r, m, x, w, "ln1", "ln1_output")
    norm_recomputed = spec.recomputes("layernorm")
    if not norm_recomputed:
        stash.put("qkv_input", y1)
    if m.multi_latent_attention:  # simsp/model/blocks/attention/mla.py (import cycle: imported here)
        from simsp.model.blocks.attention.mla import mla_attention_forward
        proj_in = yield from mla_attention_forward(r, spec, w, y1, stash, norm_recomputed)
    else:
        y1_full = yield from mappings.enter_forward(r, y1, "qkv_enter")  # (s, b, h)
        qkv = yield from ops.linear(r, y1_full, w["attn.qkv.weight"], w.get("attn.qkv.bias"),
                                    "qkv")
        if y1_full is not y1:
            r.free(y1_full)
        if norm_recomputed:
            r.free(y1)
        if m.llama_layer:
            proj_in = yield from _llama_attention(r, spec, qkv, heads, d, stash)  # (s,b,a·d/t)
        else:
            proj_in = yield from _gpt_attention(r, spec, qkv, heads, d, stash)  # (s, b, h/t)
    stash.put("proj_input", proj_in)
    residual, attn_mask = yield from _row_parallel_out(
        r, spec, proj_in, w["attn.proj.weight"], w.get("attn.proj.bias"), "attn", x, "ln2_input")
    stash.put("attn_dropout_mask", attn_mask)
    stash.put("ln2_input", residual)
    if spec.moe:
        from simsp.model.blocks.moe.layer import moe_mlp_forward  # MoE models only (import cycle)
        out = yield from moe_mlp_forward(r, spec, w, residual, stash)
    else:
        out = yield from _mlp_forward(r, spec, w, residual, stash)
    if not keep:
        stash.release()
    return out, stash.tensors


def _gpt_attention(r, spec, qkv, heads: int, d: int, stash: Stash):
    """K22's attention: split heads, softmax(QKᵀ/√d) -> dropout -> ·V, merge heads."""
    q, k, v = yield from split_qkv(r, qkv, heads, d)  # (b, a/t, s, d) each
    r.free(qkv)
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        stash.put(name, tensor)
    return (yield from _unfused_core(r, spec, q, k, v, stash))


def _keep_softmax_stats(r, spec, lse, stash) -> None:
    """Flash's per-row softmax statistics (fp32): kept for backward, or freed where core_attn
    recompute re-runs the flash forward."""
    if spec.recomputes("core_attn"):
        r.free(lse)
    else:
        stash.put("softmax_lse", lse)


def _unfused_core(r, spec, q, k, v, stash: Stash):
    """The core as separate kernels keeping the s × s tensors; -> proj_input (s, b, a·d/t)."""
    probs, mask, dropped, context = yield from attention_core(r, spec, q, k, v)
    if spec.recomputes("core_attn"):
        _free_core(r, probs, mask, dropped)
    else:
        _stash_core(stash, probs, mask, dropped)
    b, heads, s, d = context.shape
    proj_in = yield from ops.reshape_copy(r, context, (s, b, heads * d), (2, 0, 1, 3),
                                          "proj_input")  # (s, b, a·d/t)
    r.free(context)
    return proj_in


def attention_core_kept(r, spec, q, k, v, stash: Stash):
    """The flash or unfused core on q, k (b, a/t, s, d), v (b, a/t, s, d_v), already stashed:
    -> proj_input (s, b, a·d_v/t), keeping what the core's backward needs."""
    if not spec.model.flash:
        return (yield from _unfused_core(r, spec, q, k, v, stash))
    keep = attention_keep(r, spec, q.shape[0], q.shape[1])
    out, lse = yield from ops.flash_attention(r, q, k, v, keep, spec.model.attention_dropout,
                                              "proj_input", "softmax_lse")
    _keep_softmax_stats(r, spec, lse, stash)
    return out


def kv_names(m: Model) -> tuple[str, str]:
    """Names of K and V as split: "k_groups"/"v_groups" when the unfused core expands them."""
    expand = m.query_groups != m.num_attention_heads and not m.flash
    return ("k_groups", "v_groups") if expand else ("k", "v")


def _llama_attention(r, spec, qkv, heads: int, d: int, stash: Stash):
    """GQA split, RoPE on q and k, then the flash or the unfused core; -> proj_input."""
    m = spec.model
    groups = m.query_groups // r.tp.size
    k_name, v_name = kv_names(m)
    rope = m.position_embedding_type == "rope"
    names = ("q_unrotated", f"{k_name}_unrotated", v_name) if rope else ("q", k_name, v_name)
    q, k, v = yield from split_qkv(r, qkv, heads, d, groups, names)  # q (b,a/t,s,d), k, v G/t
    r.free(qkv)
    if rope:
        cos, sin = rope_angles(m, q.shape[2], r.cp) if r.numeric else (None, None)
        q_rot = yield from ops.rope(r, q, cos, sin, "q")
        k_rot = yield from ops.rope(r, k, cos, sin, k_name)
        r.free(q, k)
        q, k = q_rot, k_rot
    if m.flash:
        for name, tensor in (("q", q), ("k", k), ("v", v)):
            stash.put(name, tensor)
        if r.cp is not None:  # context parallelism: the ring (or all-to-all) over CP ranks
            keep = cp_attention_keep(r, spec, q.shape[0], heads)
            out, lse = yield from r.cp.forward(r, q, k, v, "proj_input", "softmax_lse", keep,
                                               m.attention_dropout)
            kept = r.cp.saved(r, k, v)  # the ring's K/V block, a2a's head-split output or None
            if spec.recomputes("core_attn"):
                r.free(kept)  # the recompute runs the exchanges again
            else:
                stash.put(r.cp.saved_name, kept)
        else:
            keep = attention_keep(r, spec, q.shape[0], heads)
            out, lse = yield from ops.flash_attention(r, q, k, v, keep, m.attention_dropout,
                                                      "proj_input", "softmax_lse")
        _keep_softmax_stats(r, spec, lse, stash)
        return out
    if groups != heads:
        k_full = yield from ops.expand_kv(r, k, heads // groups, "k")  # (b, a/t, s, d)
        v_full = yield from ops.expand_kv(r, v, heads // groups, "v")
        r.free(k, v)
        k, v = k_full, v_full
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        stash.put(name, tensor)
    return (yield from _unfused_core(r, spec, q, k, v, stash))


def fc1_views(m: Model, table: dict) -> dict:
    """SwiGLU's (h, 2, f/t) fc1 weight (and (2, f/t) bias) seen as the (h, 2f/t) GEMM operand
    [gate | up] (ledger-less views of the same arrays); GeLU's table as it is."""
    if not m.swiglu:
        return table
    views = dict(table)
    for name in ("mlp.fc1.weight", "mlp.fc1.bias"):
        if name in table:
            t = table[name]
            shape = t.shape[:-2] + (2 * t.shape[-1],)
            views[name] = Tensor(shape, t.itemsize,
                                 None if t.data is None else t.data.reshape(shape))
    return views


def _mlp_forward(r, spec, w, residual, stash: Stash):
    """LN2 -> h->f (GeLU) or h->2f (SwiGLU) -> activation -> f->h -> dropout -> + residual."""
    m = spec.model
    y2 = yield from norm(r, m, residual, w, "ln2", "fc1_input")
    norm_recomputed, mlp_recomputed = spec.recomputes("layernorm"), spec.recomputes("mlp")
    if not norm_recomputed:
        stash.put("fc1_input", y2)
    y2_full = yield from mappings.enter_forward(r, y2, "fc1_enter")  # (s, b, h)
    fc1 = fc1_views(m, w)
    h1 = yield from ops.linear(r, y2_full, fc1["mlp.fc1.weight"], fc1.get("mlp.fc1.bias"),
                               act_input_name(m))  # (s, b, f/t), SwiGLU (s, b, 2f/t)
    if y2_full is not y2:
        r.free(y2_full)
    if norm_recomputed:
        r.free(y2)
    if not mlp_recomputed:
        stash.put(act_input_name(m), h1)
    g = yield from (ops.swiglu if m.swiglu else ops.gelu)(r, h1, "fc2_input")  # (s, b, f/t)
    if mlp_recomputed:
        r.free(h1)
    else:
        stash.put("fc2_input", g)
    out, mlp_mask = yield from _row_parallel_out(r, spec, g, w["mlp.fc2.weight"],
                                                 w.get("mlp.fc2.bias"), "mlp", residual,
                                                 "layer_output")
    if mlp_recomputed:
        r.free(g)
    stash.put("mlp_dropout_mask", mlp_mask)
    return out


def act_input_name(m: Model) -> str:
    return "swiglu_input" if m.swiglu else "gelu_input"


def mlp_inner(r, m: Model, w: dict, y2):
    """fc1 input (s_l, b, h) -> the activation's input and output: f̄/g, h->f (2f) GEMM, GeLU
    or SwiGLU. Returns (activation input, fc2 input)."""
    y2_full = yield from mappings.enter_forward(r, y2, "fc1_enter")  # (s, b, h)
    fc1 = fc1_views(m, w)
    h1 = yield from ops.linear(r, y2_full, fc1["mlp.fc1.weight"], fc1.get("mlp.fc1.bias"),
                               act_input_name(m))  # (s, b, f/t), SwiGLU (s, b, 2f/t)
    if y2_full is not y2:
        r.free(y2_full)
    g = yield from (ops.swiglu if m.swiglu else ops.gelu)(r, h1, "fc2_input")  # (s, b, f/t)
    return h1, g
