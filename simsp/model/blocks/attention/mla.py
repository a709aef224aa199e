"""Multi-head latent attention (--multi-latent-attention; DeepSeek-V2/V3, arXiv 2405.04434 §2.1
and 2412.19437 §2.1.1; Megatron-LM megatron/core/transformer/multi_latent_attention.py
`MLASelfAttention`; docs/mla.md) on one tensor-parallel rank: the numpy math, the rank's ops
around it, parameter shapes and FLOPs.

Per token y (h,): the query latent c_q = y W_qd (r_q), normed, up-projected to a heads of
[q_nope (d_n) | q_pe (d_r)]; the KV latent [c_kv (r_kv) | k_pe (d_r)] = y W_kvd, c_kv normed and
up-projected to a heads of [k_nope (d_n) | v (d_v)]; k_pe is one RoPE key shared by every head.
RoPE as Megatron applies it to MLA (rope_utils.py `_apply_rotary_pos_emb_bshd` with
mla_rotary_interleaved): the rotated channels (all d_r unless --rotary-percent < 1) are
de-interleaved (even, then odd) and rotated by halves. The core (blocks/attention/core.py) is softmax(q kᵀ / √(d_n + d_r)) v over query/key
width d_n + d_r and value width d_v. Without --q-lora-rank one query projection (h, a·(d_n +
d_r)) replaces q down, its norm and q up (Megatron's linear_q_proj).

The down projections and the latents' RMSNorms are replicated on every TP rank (Megatron's
"duplicated" TELinear): they read the rank's own (s/t under SP) tokens. The up projections are
column parallel over heads, entered as any column-parallel GEMM (all-gather under SP, f
otherwise); the shared RoPE key k_pe enters the same way (Megatron's
gather_from_sequence_parallel_region), so its gradient, partial per rank (each rank's heads),
is reduce-scattered (SP) or all-reduced. Kept for backward:

| name             | shape (per rank)          | bytes               |
|------------------|---------------------------|---------------------|
| qkv_input        | (s_l, b, h)               | 2·s_l·b·h           |
| q_down_output    | (s_l, b, r_q)             | 2·s_l·b·r_q         |
| q_up_input       | (s_l, b, r_q)             | 2·s_l·b·r_q         |
| kv_down_output   | (s_l, b, r_kv)            | 2·s_l·b·r_kv        |
| kv_up_input      | (s_l, b, r_kv)            | 2·s_l·b·r_kv        |
| q, k             | (b, a/t, s, d_n + d_r)    | 4·s·b·a(d_n+d_r)/t  |
| v                | (b, a/t, s, d_v)          | 2·s·b·a·d_v/t       |
| proj_input       | (s, b, a·d_v/t)           | 2·s·b·a·d_v/t       |
plus the core's (softmax tensors unfused, the fp32 logsumexp with flash) and dropout masks.
"""

import numpy as np

from simsp.model import mappings
from simsp.model.base import ops
from simsp.model.base import kernels as K
from simsp.model.base.linear import column_parallel, column_parallel_backward
from simsp.model.blocks.attention import core
from simsp.model.blocks.attention.heads import merge_heads, split_heads
from simsp.model.blocks.attention.rope import rope_angles, rope_backward, rope_forward
from simsp.model.blocks.norm import recompute_norm, rmsnorm, rmsnorm_backward, rmsnorm_forward, \
    rmsnorm_grad
from simsp.model.tensor import FP16

INPUT = "qkv_input"  # the LN1 output, as this block keeps it


def shapes(model) -> dict[str, tuple[int, ...]]:
    """MLA's projections in Megatron-LM's module order (MLASelfAttention): q down (h, r_q), its
    RMSNorm, q up (r_q, a·(d_n + d_r)) head-major [nope | rope] per head (or, without
    --q-lora-rank, one q projection (h, a·(d_n + d_r))), kv down (h, r_kv + d_r) with the
    shared RoPE key last, its RMSNorm over r_kv, kv up (r_kv, a·(d_n + d_v)) head-major
    [k nope | v] per head, and the output projection (a·d_v, h) with its bias (with
    --add-bias-linear)."""
    h, a = model.hidden_size, model.num_attention_heads
    dn, dr, dv = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
    rq, rkv = model.q_lora_rank, model.kv_lora_rank
    out = ({"attn.q_proj.weight": (h, a * (dn + dr))} if rq is None else
           {"attn.q_down.weight": (h, rq), "attn.q_norm.gamma": (rq,),
            "attn.q_up.weight": (rq, a * (dn + dr))})
    out.update({"attn.kv_down.weight": (h, rkv + dr), "attn.kv_norm.gamma": (rkv,),
                "attn.kv_up.weight": (rkv, a * (dn + dv)), "attn.proj.weight": (a * dv, h)})
    if model.add_bias_linear:
        out["attn.proj.bias"] = (h,)
    return out


def flop_terms(model) -> tuple[float, float]:
    """(per token per layer: 6 × the projections' weights with Megatron's +1 for each LoRA
    norm, per token · sequence position per layer: the causal core), as training.py's
    transformer_flops counts """
    h, a = model.hidden_size, model.num_attention_heads
    dn, dr, dv = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
    q = (h * a * (dn + dr) if model.q_lora_rank is None  # training.py: no query latent
         else model.q_lora_rank * (h + a * (dn + dr) + 1))
    kv = model.kv_lora_rank * (h + a * (dn + dv) + 1) + h * dr
    return 6 * (q + kv + a * dv * h), 6 * (a * (dn + dr) / 2 + a * dv / 2)


def core_widths(model) -> tuple[int, int]:
    """The core's query/key and value head widths: d_n + d_r and d_v."""
    return model.qk_head_dim + model.qk_pos_emb_head_dim, model.v_head_dim


# ---------------------------------------------------------------------------------------------
# numpy: the single-device math (the reference's, simsp/model/reference.py; the rank's ops
# below reuse the small functions)


def deinterleave(x):
    """(..., d_r) -> (..., d_r): the even channels, then the odd ones."""
    return np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)  # (..., d_r)


def reinterleave(x):
    """Inverse (and transpose) of deinterleave: (..., d_r) -> (..., d_r)."""
    half = x.shape[-1] // 2
    out = np.empty_like(x)  # (..., d_r)
    out[..., 0::2], out[..., 1::2] = x[..., :half], x[..., half:]
    return out


def mla_rope_forward(x, cos, sin):
    """x (b, heads, s, d_r) -> its first rot = cos.shape[-1] channels de-interleaved then
    rotated by halves, the other d_r − rot passed through (rope_utils.py
    _apply_rotary_pos_emb_bshd cuts t[..., :rot_dim] before the de-interleave)."""
    rot = cos.shape[-1]
    return rope_forward(np.concatenate([deinterleave(x[..., :rot]), x[..., rot:]], axis=-1),
                        cos, sin)


def mla_rope_backward(dy, cos, sin):
    """dx of mla_rope_forward: the inverse rotation, then the rotated channels put back."""
    rot = cos.shape[-1]
    dx = rope_backward(dy, cos, sin)  # (b, heads, s, d_r)
    return np.concatenate([reinterleave(dx[..., :rot]), dx[..., rot:]], axis=-1)


def split_last(x, sizes):
    """x (..., Σ sizes) -> the consecutive blocks of the last axis."""
    cuts = np.cumsum(sizes)[:-1]
    return np.split(x, cuts, axis=-1)


def mla_forward(y, P, model, cos, sin):
    """y (s, B, h) -> q (B, a, s, d_n + d_r), k (B, a, s, d_n + d_r), v (B, a, s, d_v) and the
    cache for mla_backward. P holds the layer's attention weights by suffix."""
    a, dn, dr, rkv = (model.num_attention_heads, model.qk_head_dim, model.qk_pos_emb_head_dim,
                      model.kv_lora_rank)
    c = {"y": y}
    if "attn.q_proj.weight" in P:  # no query latent (--q-lora-rank unset): y W_q
        q = split_heads(K.linear_forward(y, P["attn.q_proj.weight"], None), a)  # (B, a, s, dn+dr)
    else:
        c["cq"] = K.linear_forward(y, P["attn.q_down.weight"], None)  # (s, B, r_q)
        c["cqn"] = rmsnorm_forward(c["cq"], P["attn.q_norm.gamma"], model.norm_epsilon)
        q = split_heads(K.linear_forward(c["cqn"], P["attn.q_up.weight"], None), a)  # (B,a,s,dn+dr)
    q_nope, q_pe = split_last(q, (dn, dr))
    kv_all = K.linear_forward(y, P["attn.kv_down.weight"], None)  # (s, B, r_kv + d_r)
    c["ckv"], k_pe = split_last(kv_all, (rkv, dr))  # (s, B, r_kv), (s, B, d_r)
    c["ckvn"] = rmsnorm_forward(c["ckv"], P["attn.kv_norm.gamma"], model.norm_epsilon)
    kv = split_heads(K.linear_forward(c["ckvn"], P["attn.kv_up.weight"], None), a)  # (B,a,s,dn+dv)
    k_nope, v = split_last(kv, (dn, model.v_head_dim))
    k_pe = mla_rope_forward(k_pe.transpose(1, 0, 2)[:, None], cos, sin)  # (B, 1, s, d_r)
    q = np.concatenate([q_nope, mla_rope_forward(q_pe, cos, sin)], axis=-1)
    k = np.concatenate([k_nope, np.broadcast_to(k_pe, k_nope.shape[:-1] + (dr,))], axis=-1)
    return q, k, np.ascontiguousarray(v), c


def mla_backward(dq, dk, dv, c, P, model, cos, sin):
    """Gradients of mla_forward: dq, dk (B, a, s, d_n + d_r), dv (B, a, s, d_v) -> dy (s, B, h)
    and {suffix: gradient} of the five weights and two norms."""
    dn, dr, eps = model.qk_head_dim, model.qk_pos_emb_head_dim, model.norm_epsilon
    g = {}
    dq_nope, dq_pe = split_last(dq, (dn, dr))
    dq_up = merge_heads(np.concatenate([dq_nope, mla_rope_backward(dq_pe, cos, sin)], -1))
    dk_nope, dk_pe = split_last(dk, (dn, dr))
    dkv_up = merge_heads(np.concatenate([dk_nope, dv], axis=-1))  # (s, B, a(dn + dv))
    dk_pe = mla_rope_backward(dk_pe.sum(axis=1, keepdims=True), cos, sin)  # (B, 1, s, d_r)
    dckvn, g["attn.kv_up.weight"], _ = K.linear_backward(dkv_up, c["ckvn"],
                                                         P["attn.kv_up.weight"])
    dckv, g["attn.kv_norm.gamma"] = rmsnorm_backward(dckvn, c["ckv"],
                                                       P["attn.kv_norm.gamma"], eps)
    dkv_all = np.concatenate([dckv, dk_pe[:, 0].transpose(1, 0, 2)], axis=-1)  # (s,B,rkv+dr)
    dy_kv, g["attn.kv_down.weight"], _ = K.linear_backward(dkv_all, c["y"],
                                                           P["attn.kv_down.weight"])
    if "attn.q_proj.weight" in P:
        dy_q, g["attn.q_proj.weight"], _ = K.linear_backward(dq_up, c["y"],
                                                             P["attn.q_proj.weight"])
        return dy_q + dy_kv, g
    dcqn, g["attn.q_up.weight"], _ = K.linear_backward(dq_up, c["cqn"], P["attn.q_up.weight"])
    dcq, g["attn.q_norm.gamma"] = rmsnorm_backward(dcqn, c["cq"], P["attn.q_norm.gamma"], eps)
    dy_q, g["attn.q_down.weight"], _ = K.linear_backward(dcq, c["y"], P["attn.q_down.weight"])
    return dy_q + dy_kv, g


# ---------------------------------------------------------------------------------------------
# ops on a rank


def mla_rope_angles(m, s: int):
    """cos, sin (s, rot) of the RoPE width d_r, positions 0..s−1 (every TP rank holds the whole
    sequence once the up projections' inputs are gathered)."""
    return rope_angles(s, int(m.qk_pos_emb_head_dim * m.rotary_percent), m.rotary_base)


def _split(r, x, sizes: tuple, names: tuple):
    """x (..., Σ sizes) -> one new tensor per block of the last axis (a copy kernel)."""
    parts = [r.alloc(x.shape[:-1] + (n,), FP16, name) for n, name in zip(sizes, names)]
    if r.numeric:
        for part, block in zip(parts, split_last(x.data, sizes)):
            part.data = np.ascontiguousarray(block)
    yield from r.compute(names[0], "elementwise", nbytes=2 * x.nbytes)
    return parts


def _heads_qkv(r, m, q_up, kv_up, k_pe):
    """q_up (s, b, a/t·(d_n + d_r)), kv_up (s, b, a/t·(d_n + d_v)), k_pe (s, b, d_r) ->
    q, k (b, a/t, s, d_n + d_r) with RoPE on their d_r channels, v (b, a/t, s, d_v)."""
    s, b, _ = q_up.shape
    heads, dn, dr, dv = (m.num_attention_heads // r.tp.size, m.qk_head_dim,
                         m.qk_pos_emb_head_dim, m.v_head_dim)
    q = r.alloc((b, heads, s, dn + dr), FP16, "q")
    k = r.alloc((b, heads, s, dn + dr), FP16, "k")
    v = r.alloc((b, heads, s, dv), FP16, "v")
    if r.numeric:
        cos, sin = mla_rope_angles(m, s)
        q_nope, q_pe = split_last(split_heads(q_up.data, heads), (dn, dr))
        k_nope, v_data = split_last(split_heads(kv_up.data, heads), (dn, dv))
        pe = mla_rope_forward(k_pe.data.transpose(1, 0, 2)[:, None], cos, sin)  # (b,1,s,dr)
        q.data = np.concatenate([q_nope, mla_rope_forward(q_pe, cos, sin)], axis=-1)
        k.data = np.concatenate([k_nope, np.broadcast_to(pe, k_nope.shape[:-1] + (dr,))], -1)
        v.data = np.ascontiguousarray(v_data)
    moved = q_up.nbytes + kv_up.nbytes + k_pe.nbytes + q.nbytes + k.nbytes + v.nbytes
    yield from r.compute("mla_rope_heads", "elementwise", nbytes=moved)
    return q, k, v


def _heads_qkv_backward(r, m, dq, dk, dv):
    """Gradients of _heads_qkv: -> d q_up (s, b, a/t·(d_n + d_r)), d kv_up, d k_pe (s, b, d_r)
    (this rank's heads' share of the shared key's gradient)."""
    b, heads, s, _ = dq.shape
    dn, dr = m.qk_head_dim, m.qk_pos_emb_head_dim
    dq_up = r.alloc((s, b, heads * (dn + dr)), FP16, "d_q_up_output")
    dkv_up = r.alloc((s, b, heads * (dn + dv.shape[-1])), FP16, "d_kv_up_output")
    dk_pe = r.alloc((s, b, dr), FP16, "d_k_pe")
    if r.numeric:
        cos, sin = mla_rope_angles(m, s)
        dq_nope, dq_pe = split_last(dq.data, (dn, dr))
        dk_nope, dk_pe_heads = split_last(dk.data, (dn, dr))
        dq_up.data = merge_heads(
            np.concatenate([dq_nope, mla_rope_backward(dq_pe, cos, sin)], axis=-1))
        dkv_up.data = merge_heads(np.concatenate([dk_nope, dv.data], axis=-1))
        summed = mla_rope_backward(dk_pe_heads.sum(axis=1, keepdims=True), cos, sin)
        dk_pe.data = np.ascontiguousarray(summed[:, 0].transpose(1, 0, 2))  # (s, b, d_r)
    moved = dq.nbytes + dk.nbytes + dv.nbytes + dq_up.nbytes + dkv_up.nbytes + dk_pe.nbytes
    yield from r.compute("d_mla_rope_heads", "elementwise", nbytes=moved)
    return dq_up, dkv_up, dk_pe


def _up_projection(r, x, weight, name: str):
    """Column-parallel up projection: f / g of the latent, then x W (s, b, a/t·width)."""
    return (yield from column_parallel(r, x, weight, None, f"{name}_enter", f"{name}_output"))


def forward(r, spec, w: dict, y1, residual, stash):
    """Latents -> up projections -> heads (RoPE) -> core -> output projection -> dropout ->
    + residual: the LN1 output y1 (s_l, b, h) -> the LN2 input (s_l, b, h)."""
    m = spec.model
    norm_recomputed = spec.recomputes("layernorm")
    if not norm_recomputed:
        stash.put(INPUT, y1)
    q_up, ckvn, k_pe = yield from _latents(r, m, w, y1, stash, norm_recomputed)
    kv_up = yield from _up_projection(r, ckvn, w["attn.kv_up.weight"], "kv_up")
    k_pe_full = yield from mappings.enter_forward(r, k_pe, "k_pe_enter")  # (s, b, d_r)
    q, k, v = yield from _heads_qkv(r, m, q_up, kv_up, k_pe_full)
    r.free(q_up, kv_up, k_pe, None if k_pe_full is k_pe else k_pe_full)
    proj_in = yield from core.forward(r, spec, q, k, v, stash)  # (s, b, a·d_v/t)
    return (yield from core.output_projection(r, spec, w, proj_in, residual, stash))


def _latents(r, m, w: dict, y1, stash, norm_recomputed: bool):
    """The down projections and latent norms from y1 (s_l, b, h), then the query's up
    projection: -> q_up (s, b, a/t·(d_n + d_r)), the normed KV latent (s_l, b, r_kv), k_pe
    (s_l, b, d_r)."""
    latent_q = m.q_lora_rank is not None  # else Megatron's linear_q_proj straight from y1
    if latent_q:
        cq = yield from ops.linear(r, y1, w["attn.q_down.weight"], None, "q_down_output")
    kv_all = yield from ops.linear(r, y1, w["attn.kv_down.weight"], None, "kv_down_all")
    if norm_recomputed and latent_q:
        r.free(y1)
    ckv, k_pe = yield from _split(r, kv_all, (m.kv_lora_rank, m.qk_pos_emb_head_dim),
                                  ("kv_down_output", "k_pe"))  # (s_l, b, r_kv), (s_l, b, d_r)
    r.free(kv_all)
    if latent_q:
        cqn = yield from rmsnorm(r, cq, w["attn.q_norm.gamma"], m.norm_epsilon, "q_up_input")
    ckvn = yield from rmsnorm(r, ckv, w["attn.kv_norm.gamma"], m.norm_epsilon, "kv_up_input")
    kept = (("q_down_output", cq), ("kv_down_output", ckv), ("q_up_input", cqn),
            ("kv_up_input", ckvn)) if latent_q else (("kv_down_output", ckv),
                                                     ("kv_up_input", ckvn))
    for name, tensor in kept:
        stash.put(name, tensor)
    if latent_q:
        q_up = yield from _up_projection(r, cqn, w["attn.q_up.weight"], "q_up")
    else:  # (s, b, a/t·(d_n + d_r)) from the LN1 output, column parallel
        q_up = yield from _up_projection(r, y1, w["attn.q_proj.weight"], "q_proj")
        if norm_recomputed:
            r.free(y1)
    return q_up, ckvn, k_pe


def backward(r, spec, w: dict, g: dict, saved: dict, dres):
    """dres (s_l, b, h) at the LN2 input -> the gradient at the LN1 output (s_l, b, h), every
    TP reduction included; consumes the saved tensors of forward."""
    m = spec.model
    dproj, proj_in = yield from core.output_projection_backward(r, spec, w, g, saved, dres)
    dq, dk, dv = yield from core.backward(r, spec, saved, dproj, proj_in)
    dq_up, dkv_up, dk_pe = yield from _heads_qkv_backward(r, m, dq, dk, dv)
    r.free(dq, dk, dv)
    if INPUT not in saved:  # layernorm recomputed
        saved[INPUT] = yield from recompute_norm(r, m, w, saved["ln1_input"], "ln1", INPUT)
    if m.q_lora_rank is None:
        return (yield from _backward_without_q_latent(r, m, w, g, saved, dq_up, dkv_up, dk_pe))
    return (yield from _backward_with_q_latent(r, m, w, g, saved, dq_up, dkv_up, dk_pe))


def _backward_with_q_latent(r, m, w: dict, g: dict, saved: dict, dq_up, dkv_up, dk_pe):
    """Backward below the heads through both latents: the up projections, the latent norms
    (the shared RoPE key's gradient joined to the KV latent's), the down projections -> d y1
    (s_l, b, h)."""
    dcqn = yield from column_parallel_backward(r, dq_up, saved.pop("q_up_input"), w, g,
                                               "attn.q_up", False)  # (s_l, b, r_q)
    dckvn = yield from column_parallel_backward(r, dkv_up, saved.pop("kv_up_input"), w, g,
                                                "attn.kv_up", False)  # (s_l, b, r_kv)
    dk_pe_local = yield from mappings.enter_backward(r, dk_pe, "k_pe_enter_grad")  # (s_l,b,dr)
    if dk_pe_local is not dk_pe:
        r.free(dk_pe)
    cq, ckv = saved.pop("q_down_output"), saved.pop("kv_down_output")
    dcq = yield from rmsnorm_grad(r, dcqn, cq, w["attn.q_norm.gamma"], m.norm_epsilon, g,
                                  "attn.q_norm", "d_q_down_output")
    dckv = yield from rmsnorm_grad(r, dckvn, ckv, w["attn.kv_norm.gamma"], m.norm_epsilon, g,
                                   "attn.kv_norm", "d_kv_down_latent")
    r.free(dcqn, dckvn, cq, ckv)
    dkv_all = yield from _join_kv_grads(r, dckv, dk_pe_local)  # (s_l, b, r_kv + d_r)
    y1 = saved.pop(INPUT)
    dy1 = yield from _down_backward(r, dcq, y1, w, g, "attn.q_down")
    dy_kv = yield from _down_backward(r, dkv_all, y1, w, g, "attn.kv_down")
    r.free(y1)
    yield from ops.accumulate(r, dy1, dy_kv, "d_qkv_input")
    r.free(dy_kv)
    return dy1


def _join_kv_grads(r, dckv, dk_pe_local):
    """[d c_kv | d k_pe] (s_l, b, r_kv + d_r): the gradient at the KV down projection's
    output; frees its two parts."""
    dkv_all = yield from ops.elementwise(
        r, dckv.shape[:-1] + (dckv.shape[-1] + dk_pe_local.shape[-1],), "d_kv_down_output",
        lambda: np.concatenate([dckv.data, dk_pe_local.data], axis=-1),
        2 * (dckv.nbytes + dk_pe_local.nbytes))  # (s_l, b, r_kv + d_r)
    r.free(dckv, dk_pe_local)
    return dkv_all


def _kv_down_input_grad(r, dckvn, dk_pe, saved: dict, w: dict, g: dict, m):
    """The KV path's backward below its up projection: the latent norm, the shared RoPE key's
    gradient joined, the down projection -> its share of d y1 (s_l, b, h)."""
    dk_pe_local = yield from mappings.enter_backward(r, dk_pe, "k_pe_enter_grad")  # (s_l,b,dr)
    if dk_pe_local is not dk_pe:
        r.free(dk_pe)
    ckv = saved.pop("kv_down_output")
    dckv = yield from rmsnorm_grad(r, dckvn, ckv, w["attn.kv_norm.gamma"], m.norm_epsilon, g,
                                   "attn.kv_norm", "d_kv_down_latent")
    r.free(dckvn, ckv)
    dkv_all = yield from _join_kv_grads(r, dckv, dk_pe_local)  # (s_l, b, r_kv + d_r)
    return (yield from _down_backward(r, dkv_all, saved[INPUT], w, g, "attn.kv_down"))


def _backward_without_q_latent(r, m, w: dict, g: dict, saved: dict, dq_up, dkv_up, dk_pe):
    """Backward below the heads when the query comes straight from y1 (Megatron's
    linear_q_proj, --q-lora-rank unset): the KV path, then the column-parallel q projection
    (which frees y1) -> d y1 (s_l, b, h)."""
    dckvn = yield from column_parallel_backward(r, dkv_up, saved.pop("kv_up_input"), w, g,
                                                "attn.kv_up", False)  # (s_l, b, r_kv)
    dy_kv = yield from _kv_down_input_grad(r, dckvn, dk_pe, saved, w, g, m)
    dy1 = yield from column_parallel_backward(r, dq_up, saved.pop(INPUT), w, g,
                                              "attn.q_proj", False)  # (s_l, b, h)
    yield from ops.accumulate(r, dy1, dy_kv, "d_qkv_input")
    r.free(dy_kv)
    return dy1


def _down_backward(r, dy, x, w: dict, g: dict, prefix: str):
    """A replicated down projection's backward on the rank's own tokens: dx (s_l, b, h); its
    weight gradient (partial over the sequence under SP) accumulates in g."""
    dx = yield from ops.linear_grad_input(r, dy, w[f"{prefix}.weight"], f"d_{prefix}_input")
    yield from ops.linear_grad_weight(r, dy, x, g, f"{prefix}.weight", None, f"d_{prefix}_weight")
    r.free(dy)
    return dx
