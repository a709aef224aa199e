"""Multi-head attention and its grouped-query (GQA) and multi-query (MQA) variants on one
tensor-parallel rank (Megatron-LM megatron/core/transformer/attention.py SelfAttention; N21
§2.3): the fused QKV projection column parallel (heads split across ranks), RoPE on q and k
(--position-embedding-type rope), the attention core (blocks/attention/core.py: unfused, flash,
or context parallel) and the output projection with its dropout and residual. It reads the LN1
output (`qkv_input`) and returns the LN2 input.

G = a query groups (MHA, K22's GPT layer), 1 < G < a (GQA, --group-query-attention
--num-query-groups G) or G = 1 (MQA): the fused QKV holds a query heads and G key and value
heads, group-major (blocks/attention/heads.py). Kept for backward, besides the core's table
(docs/MODEL.md#activation-memory; docs/llama.md):

| name                       | shape (per rank)      | bytes          |
|----------------------------|-----------------------|----------------|
| qkv_input                  | (s_l, b, h)           | 2sbh  (/t SP)  |
s_l = s/t under SP, else s; selective recompute of `layernorm` drops it (rebuilt from
ln1_input). The unfused core expands K and V to the query heads (Megatron
DotProductAttention's repeat_interleave) so it keeps K22's q, k, v; flash keeps them unexpanded.

Parameters: attn.qkv (h, (a + 2G)d) and its bias, attn.proj (a·d, h) and its bias (biases
unless --disable-bias-linear). FLOPs as Megatron-LM's num_floating_point_operations counts
them (megatron/training/training.py transformer_flops).
"""

from simsp.model.base.linear import column_parallel, column_parallel_backward
from simsp.model.blocks.attention import core, rope
from simsp.model.blocks.attention.heads import kv_expand, kv_names, kv_reduce, qkv_merge_grads, \
    qkv_split
from simsp.model.blocks.norm import recompute_norm

INPUT = "qkv_input"  # the LN1 output, as this block keeps it
LAYERNORM_LINEAR = True  # LN1 and QKV are one TE LayerNormLinear (norm + FP8 cast fused)


def shapes(model) -> dict[str, tuple[int, ...]]:
    """attn.qkv (h, (a + 2G)d) with its bias ((a + 2G)d,), attn.proj (a·d, h) with its bias
    (h,); the biases only with --add-bias-linear."""
    h, a, d = model.hidden_size, model.num_attention_heads, model.head_dim
    qkv = (a + 2 * model.query_groups) * d  # (a + 2G)d
    out = {"attn.qkv.weight": (h, qkv), "attn.qkv.bias": (qkv,),
           "attn.proj.weight": (a * d, h), "attn.proj.bias": (h,)}
    return out if model.add_bias_linear else {k: v for k, v in out.items()
                                              if not k.endswith(".bias")}


def flop_terms(model) -> tuple[float, float]:
    """(per token per layer: 6 × the projections' weights, per token · sequence position per
    layer: the causal core), as training.py's transformer_flops counts GQA/MHA."""
    h, a = model.hidden_size, model.num_attention_heads
    d, groups = model.head_dim, model.query_groups
    return 6 * (h * (a * d + 2 * groups * d) + a * d * h), 6 * a * d


def core_widths(model) -> tuple[int, int]:
    """The core's query/key and value head widths: d and d."""
    return model.head_dim, model.head_dim


def forward(r, spec, w: dict, y1, residual, stash):
    """QKV -> heads (RoPE) -> core -> output projection -> dropout -> + residual: the LN1
    output y1 (s_l, b, h) -> the LN2 input (s_l, b, h)."""
    norm_recomputed = spec.recomputes("layernorm")
    if not norm_recomputed:
        stash.put(INPUT, y1)
    qkv = yield from column_parallel(r, y1, w["attn.qkv.weight"], w.get("attn.qkv.bias"),
                                     "qkv_enter", "qkv", True)  # (s, b, (a + 2G)d/t)
    if norm_recomputed:
        r.free(y1)
    q, k, v = yield from _heads(r, spec, qkv)
    proj_in = yield from core.forward(r, spec, q, k, v, stash)  # (s, b, a·d/t)
    return (yield from core.output_projection(r, spec, w, proj_in, residual, stash))


def _heads(r, spec, qkv):
    """The fused QKV (s, b, (a + 2G)d/t) -> q (b, a/t, s, d), k, v (b, G/t, s, d), RoPE on q
    and k; K and V expanded to the a/t query heads for the unfused core."""
    m = spec.model
    heads, d, groups = m.num_attention_heads // r.tp.size, m.head_dim, m.query_groups // r.tp.size
    k_name, v_name = kv_names(m)
    rotary = m.position_embedding_type == "rope"
    names = ("q_unrotated", f"{k_name}_unrotated", v_name) if rotary else ("q", k_name, v_name)
    q, k, v = yield from qkv_split(r, qkv, heads, d, groups, names)  # q (b,a/t,s,d), k, v G/t
    r.free(qkv)
    if rotary:
        cos, sin = rope.angles(m, q.shape[2], r.cp) if r.numeric else (None, None)
        q_rot = yield from rope.rope(r, q, cos, sin, "q", m)
        k_rot = yield from rope.rope(r, k, cos, sin, k_name, m)
        r.free(q, k)
        q, k = q_rot, k_rot
    if groups != heads and not m.flash:
        k_full = yield from kv_expand(r, k, heads // groups, "k")  # (b, a/t, s, d)
        v_full = yield from kv_expand(r, v, heads // groups, "v")
        r.free(k, v)
        k, v = k_full, v_full
    return q, k, v


def backward(r, spec, w: dict, g: dict, saved: dict, dres):
    """dres (s_l, b, h) at the LN2 input -> the gradient at the LN1 output (s_l, b, h)."""
    m = spec.model
    dproj, proj_in = yield from core.output_projection_backward(r, spec, w, g, saved, dres)
    dq, dk, dv = yield from core.backward(r, spec, saved, dproj, proj_in)
    dqkv = yield from _heads_backward(r, spec, dq, dk, dv)  # (s, b, (a + 2G)d/t)
    if INPUT not in saved:  # layernorm recomputed
        saved[INPUT] = yield from recompute_norm(r, m, w, saved["ln1_input"], "ln1", INPUT)
    return (yield from column_parallel_backward(r, dqkv, saved.pop(INPUT), w, g, "attn.qkv",
                                                "attn.qkv.bias" in g, normed=True))


def _heads_backward(r, spec, dq, dk, dv):
    """dq (b, a/t, s, d), dk, dv (at the core's K/V heads) -> d(qkv) (s, b, (a + 2G)d/t):
    the expanded K/V heads summed per group, the inverse RoPE, the heads merged."""
    m = spec.model
    heads, groups = m.num_attention_heads // r.tp.size, m.query_groups // r.tp.size
    if groups != heads and not m.flash:
        k_name, v_name = kv_names(m)
        dk_g = yield from kv_reduce(r, dk, heads // groups, f"d_{k_name}")
        dv_g = yield from kv_reduce(r, dv, heads // groups, f"d_{v_name}")
        r.free(dk, dv)
        dk, dv = dk_g, dv_g
    if m.position_embedding_type == "rope":
        cos, sin = rope.angles(m, dq.shape[2], r.cp) if r.numeric else (None, None)
        dq_in = yield from rope.rope(r, dq, cos, sin, "d_q_unrotated", m, inverse=True)
        dk_in = yield from rope.rope(r, dk, cos, sin, "d_k_unrotated", m, inverse=True)
        r.free(dq, dk)
        dq, dk = dq_in, dk_in
    dqkv = yield from qkv_merge_grads(r, dq, dk, dv)  # (s, b, (a + 2G)d/t)
    r.free(dq, dk, dv)
    return dqkv
