"""Multi-head latent attention as plain numpy forward/backward pairs (DeepSeek-V2/V3, arXiv
2405.04434 §2.1 and 2412.19437 §2.1.1; Megatron-LM megatron/core/transformer/
multi_latent_attention.py `MLASelfAttention`; docs/mla.md).

Per token y (h,): the query latent c_q = y W_qd (r_q), normed, up-projected to a heads of
[q_nope (d_n) | q_pe (d_r)]; the KV latent [c_kv (r_kv) | k_pe (d_r)] = y W_kvd, c_kv normed and
up-projected to a heads of [k_nope (d_n) | v (d_v)]; k_pe is one RoPE key shared by every head.
RoPE as Megatron applies it to MLA (rope_utils.py `_apply_rotary_pos_emb_bshd` with
mla_rotary_interleaved): the rotated channels (all d_r unless --rotary-percent < 1) are
de-interleaved (even, then odd) and rotated by halves. The core is softmax(q kᵀ / √(d_n + d_r)) v over query/key width d_n + d_r and value
width d_v. These are the reference's functions (simsp/model/reference.py); the rank's ops reuse
the small ones.
"""

import numpy as np

from simsp.model import kernels as K


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
    return K.rope_forward(np.concatenate([deinterleave(x[..., :rot]), x[..., rot:]], axis=-1),
                          cos, sin)


def mla_rope_backward(dy, cos, sin):
    """dx of mla_rope_forward: the inverse rotation, then the rotated channels put back."""
    rot = cos.shape[-1]
    dx = K.rope_backward(dy, cos, sin)  # (b, heads, s, d_r)
    return np.concatenate([reinterleave(dx[..., :rot]), dx[..., rot:]], axis=-1)


def split_last(x, sizes):
    """x (..., Σ sizes) -> the consecutive blocks of the last axis."""
    cuts = np.cumsum(sizes)[:-1]
    return np.split(x, cuts, axis=-1)


def heads(x, a):
    """(s, b, a·w) head-major columns -> (b, a, s, w)."""
    return K.split_heads(x, a)


def mla_forward(y, P, model, cos, sin):
    """y (s, B, h) -> q (B, a, s, d_n + d_r), k (B, a, s, d_n + d_r), v (B, a, s, d_v) and the
    cache for mla_backward. P holds the layer's attention weights by suffix."""
    a, dn, dr, rkv = (model.num_attention_heads, model.qk_head_dim, model.qk_pos_emb_head_dim,
                      model.kv_lora_rank)
    c = {"y": y}
    if "attn.q_proj.weight" in P:  # no query latent (--q-lora-rank unset): y W_q
        q = heads(K.linear_forward(y, P["attn.q_proj.weight"], None), a)  # (B, a, s, dn+dr)
    else:
        c["cq"] = K.linear_forward(y, P["attn.q_down.weight"], None)  # (s, B, r_q)
        c["cqn"] = K.rmsnorm_forward(c["cq"], P["attn.q_norm.gamma"], model.norm_epsilon)
        q = heads(K.linear_forward(c["cqn"], P["attn.q_up.weight"], None), a)  # (B,a,s,dn+dr)
    q_nope, q_pe = split_last(q, (dn, dr))
    kv_all = K.linear_forward(y, P["attn.kv_down.weight"], None)  # (s, B, r_kv + d_r)
    c["ckv"], k_pe = split_last(kv_all, (rkv, dr))  # (s, B, r_kv), (s, B, d_r)
    c["ckvn"] = K.rmsnorm_forward(c["ckv"], P["attn.kv_norm.gamma"], model.norm_epsilon)
    kv = heads(K.linear_forward(c["ckvn"], P["attn.kv_up.weight"], None), a)  # (B,a,s,dn+dv)
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
    dq_up = K.merge_heads(np.concatenate([dq_nope, mla_rope_backward(dq_pe, cos, sin)], -1))
    dk_nope, dk_pe = split_last(dk, (dn, dr))
    dkv_up = K.merge_heads(np.concatenate([dk_nope, dv], axis=-1))  # (s, B, a(dn + dv))
    dk_pe = mla_rope_backward(dk_pe.sum(axis=1, keepdims=True), cos, sin)  # (B, 1, s, d_r)
    dckvn, g["attn.kv_up.weight"], _ = K.linear_backward(dkv_up, c["ckvn"],
                                                         P["attn.kv_up.weight"])
    dckv, g["attn.kv_norm.gamma"] = K.rmsnorm_backward(dckvn, c["ckv"],
                                                       P["attn.kv_norm.gamma"], eps)
    dkv_all = np.concatenate([dckv, dk_pe[:, 0].transpose(1, 0, 2)], axis=-1)  # (s,B,rkv+dr)
    dy_kv, g["attn.kv_down.weight"], _ = K.linear_backward(dkv_all, c["y"],
                                                           P["attn.kv_down.weight"])
    if "attn.q_proj.weight" in P:
        dy_q, g["attn.q_proj.weight"], _ = K.linear_backward(dq_up, c["y"],
                                                             P["attn.q_proj.weight"])
        return dy_q + dy_kv, g
    dcqn, g["attn.q_up.weight"], _ = K.linear_backward(dq_up, c["cqn"], P["attn.q_up.weight"])
    dcq, g["attn.q_norm.gamma"] = K.rmsnorm_backward(dcqn, c["cq"], P["attn.q_norm.gamma"], eps)
    dy_q, g["attn.q_down.weight"], _ = K.linear_backward(dcq, c["y"], P["attn.q_down.weight"])
    return dy_q + dy_kv, g
