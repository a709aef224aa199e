"""Multi-head latent attention on one tensor-parallel rank: ledger entries, FLOPs, time and TP
communication around the numpy math of mla_kernels.py (Megatron-LM
megatron/core/transformer/multi_latent_attention.py `MLASelfAttention`; docs/mla.md).

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

from simsp.model import kernels, mappings, ops
from simsp.model.blocks.attention import mla_kernels as MLA
from simsp.model.layer import attention_core_kept
from simsp.model.layer_backward import column_parallel_backward, core_grads, recompute_norm
from simsp.model.tensor import FP16


def mla_rope_angles(m, s: int):
    """cos, sin (s, rot) of the RoPE width d_r, positions 0..s−1 (every TP rank holds the whole
    sequence once the up projections' inputs are gathered)."""
    return kernels.rope_angles(s, int(m.qk_pos_emb_head_dim * m.rotary_percent), m.rotary_base)


def _split(r, x, sizes: tuple, names: tuple):
    """x (..., Σ sizes) -> one new tensor per block of the last axis (a copy kernel)."""
    parts = [r.alloc(x.shape[:-1] + (n,), FP16, name) for n, name in zip(sizes, names)]
    if r.numeric:
        for part, block in zip(parts, MLA.split_last(x.data, sizes)):
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
        q_nope, q_pe = MLA.split_last(MLA.heads(q_up.data, heads), (dn, dr))
        k_nope, v_data = MLA.split_last(MLA.heads(kv_up.data, heads), (dn, dv))
        pe = MLA.mla_rope_forward(k_pe.data.transpose(1, 0, 2)[:, None], cos, sin)  # (b,1,s,dr)
        q.data = np.concatenate([q_nope, MLA.mla_rope_forward(q_pe, cos, sin)], axis=-1)
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
        dq_nope, dq_pe = MLA.split_last(dq.data, (dn, dr))
        dk_nope, dk_pe_heads = MLA.split_last(dk.data, (dn, dr))
        dq_up.data = kernels.merge_heads(
            np.concatenate([dq_nope, MLA.mla_rope_backward(dq_pe, cos, sin)], axis=-1))
        dkv_up.data = kernels.merge_heads(np.concatenate([dk_nope, dv.data], axis=-1))
        summed = MLA.mla_rope_backward(dk_pe_heads.sum(axis=1, keepdims=True), cos, sin)
        dk_pe.data = np.ascontiguousarray(summed[:, 0].transpose(1, 0, 2))  # (s, b, d_r)
    moved = dq.nbytes + dk.nbytes + dv.nbytes + dq_up.nbytes + dkv_up.nbytes + dk_pe.nbytes
    yield from r.compute("d_mla_rope_heads", "elementwise", nbytes=moved)
    return dq_up, dkv_up, dk_pe


def _up_projection(r, x, weight, name: str):
    """Column-parallel up projection: f / g of the latent, then x W (s, b, a/t·width)."""
    x_full = yield from mappings.enter_forward(r, x, f"{name}_enter")  # (s, b, r)
    y = yield from ops.linear(r, x_full, weight, None, f"{name}_output")
    if x_full is not x:
        r.free(x_full)
    return y


def mla_attention_forward(r, spec, w: dict, y1, stash, norm_recomputed: bool):
    """The attention block from the LN1 output y1 (s_l, b, h) to proj_input (s, b, a·d_v/t)."""
    m = spec.model
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
        cqn = yield from ops.rmsnorm(r, cq, w["attn.q_norm.gamma"], m.norm_epsilon,
                                     "q_up_input")
    ckvn = yield from ops.rmsnorm(r, ckv, w["attn.kv_norm.gamma"], m.norm_epsilon,
                                  "kv_up_input")
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
    kv_up = yield from _up_projection(r, ckvn, w["attn.kv_up.weight"], "kv_up")
    k_pe_full = yield from mappings.enter_forward(r, k_pe, "k_pe_enter")  # (s, b, d_r)
    q, k, v = yield from _heads_qkv(r, m, q_up, kv_up, k_pe_full)
    r.free(q_up, kv_up, k_pe, None if k_pe_full is k_pe else k_pe_full)
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        stash.put(name, tensor)
    return (yield from attention_core_kept(r, spec, q, k, v, stash))


def mla_attention_backward(r, spec, w: dict, g: dict, saved: dict, dproj, proj_in):
    """d proj_input (s, b, a·d_v/t) -> the gradient at the LN1 output (s_l, b, h), every TP
    reduction included; consumes the saved tensors of mla_attention_forward."""
    m = spec.model
    dq, dk, dv = yield from core_grads(r, spec, saved, dproj, proj_in)
    dq_up, dkv_up, dk_pe = yield from _heads_qkv_backward(r, m, dq, dk, dv)
    r.free(dq, dk, dv)
    if "qkv_input" not in saved:  # layernorm recomputed
        saved["qkv_input"] = yield from recompute_norm(r, m, w, saved["ln1_input"], "ln1",
                                                       "qkv_input")
    if m.q_lora_rank is None:
        return (yield from _backward_without_q_latent(r, m, w, g, saved, dq_up, dkv_up, dk_pe))
    dcqn = yield from column_parallel_backward(r, dq_up, saved.pop("q_up_input"), w, g,
                                               "attn.q_up", False)  # (s_l, b, r_q)
    dckvn = yield from column_parallel_backward(r, dkv_up, saved.pop("kv_up_input"), w, g,
                                                "attn.kv_up", False)  # (s_l, b, r_kv)
    dk_pe_local = yield from mappings.enter_backward(r, dk_pe, "k_pe_enter_grad")  # (s_l,b,dr)
    if dk_pe_local is not dk_pe:
        r.free(dk_pe)
    cq, ckv = saved.pop("q_down_output"), saved.pop("kv_down_output")
    dcq = yield from ops.rmsnorm_backward(r, dcqn, cq, w["attn.q_norm.gamma"], m.norm_epsilon,
                                          g, "attn.q_norm", "d_q_down_output")
    dckv = yield from ops.rmsnorm_backward(r, dckvn, ckv, w["attn.kv_norm.gamma"],
                                           m.norm_epsilon, g, "attn.kv_norm", "d_kv_down_latent")
    r.free(dcqn, dckvn, cq, ckv)
    dkv_all = yield from ops.elementwise(
        r, dckv.shape[:-1] + (dckv.shape[-1] + dk_pe_local.shape[-1],), "d_kv_down_output",
        lambda: np.concatenate([dckv.data, dk_pe_local.data], axis=-1),
        2 * (dckv.nbytes + dk_pe_local.nbytes))  # (s_l, b, r_kv + d_r)
    r.free(dckv, dk_pe_local)
    y1 = saved.pop("qkv_input")
    dy1 = yield from _down_backward(r, dcq, y1, w, g, "attn.q_down")
    dy_kv = yield from _down_backward(r, dkv_all, y1, w, g, "attn.kv_down")
    r.free(y1)
    yield from ops.accumulate(r, dy1, dy_kv, "d_qkv_input")
    r.free(dy_kv)
    return dy1


def _kv_down_input_grad(r, dckvn, dk_pe, saved: dict, w: dict, g: dict, m):
    """The KV path's backward below its up projection: the latent norm, the shared RoPE key's
    gradient joined, the down projection -> its share of d y1 (s_l, b, h)."""
    dk_pe_local = yield from mappings.enter_backward(r, dk_pe, "k_pe_enter_grad")  # (s_l,b,dr)
    if dk_pe_local is not dk_pe:
        r.free(dk_pe)
    ckv = saved.pop("kv_down_output")
    dckv = yield from ops.rmsnorm_backward(r, dckvn, ckv, w["attn.kv_norm.gamma"],
                                           m.norm_epsilon, g, "attn.kv_norm", "d_kv_down_latent")
    r.free(dckvn, ckv)
    dkv_all = yield from ops.elementwise(
        r, dckv.shape[:-1] + (dckv.shape[-1] + dk_pe_local.shape[-1],), "d_kv_down_output",
        lambda: np.concatenate([dckv.data, dk_pe_local.data], axis=-1),
        2 * (dckv.nbytes + dk_pe_local.nbytes))  # (s_l, b, r_kv + d_r)
    r.free(dckv, dk_pe_local)
    return (yield from _down_backward(r, dkv_all, saved["qkv_input"], w, g, "attn.kv_down"))


def _backward_without_q_latent(r, m, w: dict, g: dict, saved: dict, dq_up, dkv_up, dk_pe):
    """Backward below the heads when the query comes straight from y1 (Megatron's
    linear_q_proj, --q-lora-rank unset): the KV path, then the column-parallel q projection
    (which frees y1) -> d y1 (s_l, b, h)."""
    dckvn = yield from column_parallel_backward(r, dkv_up, saved.pop("kv_up_input"), w, g,
                                                "attn.kv_up", False)  # (s_l, b, r_kv)
    dy_kv = yield from _kv_down_input_grad(r, dckvn, dk_pe, saved, w, g, m)
    dy1 = yield from column_parallel_backward(r, dq_up, saved.pop("qkv_input"), w, g,
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
