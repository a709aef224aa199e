"""Self-attention blocks of the reference, written apart from the simulated ones: grouped-query
attention (MHA when G = a, MQA when G = 1) and multi-head latent attention.

- GQA: Megatron-LM transformer/attention.py SelfAttention.get_query_key_value_tensors: the
  fused QKV output viewed (s, b, G, (a/G + 2)·d) and split into a/G query heads, one key head
  and one value head per group; RoPE on q and k (--position-embedding-type rope); the core
  softmax(q kᵀ/√d) v with dropout on the probabilities.
- MLA: Megatron-LM transformer/multi_latent_attention.py MLASelfAttention: q = RMSNorm(y W_qd)
  W_qu (or y W_q without --q-lora-rank), viewed (s, b, a, d_n + d_r) and split
  [q_nope | q_pe]; [c_kv | k_pe] = y W_kvd; [k_nope | v] = RMSNorm(c_kv) W_kvu viewed
  (s, b, a, d_n + d_v); q_pe and the single k_pe rotated with mla_rotary_interleaved (RoPE of
  width int(d_r · rotary_percent)); k = [k_nope | k_pe] with k_pe shared by every head;
  softmax scale 1/√(d_n + d_r) (rope_type "rope": no YaRN mscale).
Flash and unfused cores compute the same function; this is its plain form.
"""

import math

import numpy as np

from simsp.model.reference import autodiff as ad
from simsp.model.reference import textbook as tb


def grouped_query_attention(P: dict, y, model, keep, p: float):
    """y (s, B, h) -> the attention output before the projection (s, B, a·d)."""
    a, G, d = model.num_attention_heads, model.query_groups, model.head_dim
    s, B, _ = y.shape
    per = a // G  # query heads per group
    mixed = tb.linear(y, P["attn.qkv.weight"], P.get("attn.qkv.bias"))  # (s, B, (a + 2G)d)
    mixed = mixed.reshape(s, B, G, (per + 2) * d)
    q = mixed[..., :per * d].reshape(s, B, a, d).transpose(1, 2, 0, 3)  # (B, a, s, d)
    k = mixed[..., per * d:(per + 1) * d].transpose(1, 2, 0, 3)  # (B, G, s, d)
    v = mixed[..., (per + 1) * d:].transpose(1, 2, 0, 3)  # (B, G, s, d)
    if model.position_embedding_type == "rope":
        rot = int(d * model.rotary_percent)
        q, k = tb.rope(q, rot, model.rotary_base), tb.rope(k, rot, model.rotary_base)
    context = tb.causal_attention(q, k, v, 1.0 / math.sqrt(d), keep, p)  # (B, a, s, d)
    return tb.merge_heads(context)


def _mla_query(P: dict, y, model):
    """The queries (s, B, a·(d_n + d_r)) from the query latent, or straight from y."""
    if "attn.q_proj.weight" in P:
        return y @ P["attn.q_proj.weight"]
    latent = tb.rms_norm(y @ P["attn.q_down.weight"], P["attn.q_norm.gamma"],
                         model.norm_epsilon)  # (s, B, r_q)
    return latent @ P["attn.q_up.weight"]


def latent_attention(P: dict, y, model, keep, p: float):
    """y (s, B, h) -> the attention output before the projection (s, B, a·d_v)."""
    a, dn, dr = model.num_attention_heads, model.qk_head_dim, model.qk_pos_emb_head_dim
    rkv, (s, B, _) = model.kv_lora_rank, y.shape
    rot, base = int(dr * model.rotary_percent), model.rotary_base
    q = tb.split_heads(_mla_query(P, y, model), a)  # (B, a, s, d_n + d_r)
    kv_all = y @ P["attn.kv_down.weight"]  # (s, B, r_kv + d_r)
    latent = tb.rms_norm(kv_all[..., :rkv], P["attn.kv_norm.gamma"], model.norm_epsilon)
    kv = tb.split_heads(latent @ P["attn.kv_up.weight"], a)  # (B, a, s, d_n + d_v)
    k_pe = kv_all[..., rkv:].transpose(1, 0, 2).reshape(B, 1, s, dr)  # (B, 1, s, d_r)
    k_pe = tb.rope(k_pe, rot, base, deinterleave=True)[:, np.zeros(a, dtype=int)]  # (B,a,s,dr)
    q = ad.concatenate([q[..., :dn], tb.rope(q[..., dn:], rot, base, deinterleave=True)], -1)
    k = ad.concatenate([kv[..., :dn], k_pe], axis=-1)  # (B, a, s, d_n + d_r)
    context = tb.causal_attention(q, k, kv[..., dn:], 1.0 / math.sqrt(dn + dr), keep, p)
    return tb.merge_heads(context)  # (s, B, a·d_v)
