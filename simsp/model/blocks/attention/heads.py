"""How attention's tensors are laid out over heads: the fused QKV's group-major columns, heads
to hidden and back, and the K/V heads a group of query heads shares (grouped-query attention):
numpy math and the rank's copy kernels.

Megatron's fused QKV column = head*3d + j*d + e for j in q, k, v when every head has its own K/V
(GPT); with G groups each group holds its a/G query heads, its key head, its value head
(Megatron-LM attention.py get_query_key_value_tensors). The unfused core expands each K/V head
to its group's query heads (Megatron DotProductAttention's repeat_interleave); FlashAttention
reads them unexpanded.
"""

import numpy as np

from simsp.model.base.ops import elementwise
from simsp.model.tensor import FP16, Tensor

# ---------------------------------------------------------------------------------------------
# numpy


def split_qkv(qkv, heads, groups=None):
    """(s, b, (heads + 2G)*d) group-major fused QKV -> q (b, heads, s, d), k, v (b, G, s, d).

    Each of the G groups holds its heads/G query heads, its key head, its value head (Megatron-LM
    attention.py); G = heads (the default) is GPT's head-major [q, k, v] per head."""
    groups = groups or heads
    s, b, width = qkv.shape
    per = heads // groups  # query heads per group
    d = width // (heads + 2 * groups)
    grouped = qkv.reshape(s, b, groups, per + 2, d)  # (s, b, G, per + 2, d)
    q = grouped[:, :, :, :per].reshape(s, b, heads, d).transpose(1, 2, 0, 3)  # (b, heads, s, d)
    k = grouped[:, :, :, per].transpose(1, 2, 0, 3)  # (b, G, s, d)
    v = grouped[:, :, :, per + 1].transpose(1, 2, 0, 3)  # (b, G, s, d)
    return q, k, v


def merge_qkv_grads(dq, dk, dv):
    """Inverse of split_qkv: dq (b, heads, s, d), dk, dv (b, G, s, d) -> (s, b, (heads+2G)*d)."""
    b, heads, s, d = dq.shape
    groups = dk.shape[1]
    per = heads // groups
    q = dq.transpose(2, 0, 1, 3).reshape(s, b, groups, per, d)  # (s, b, G, per, d)
    kv = np.stack([dk, dv], axis=2).transpose(3, 0, 1, 2, 4)  # (s, b, G, 2, d)
    return np.concatenate([q, kv], axis=3).reshape(s, b, (heads + 2 * groups) * d)


def merge_heads(context):
    """(b, heads, s, d) -> (s, b, heads*d), head-major columns."""
    b, heads, s, d = context.shape
    return context.transpose(2, 0, 1, 3).reshape(s, b, heads * d)  # (s, b, heads*d)


def split_heads(x, heads):
    """Inverse of merge_heads: (s, b, heads*d) -> (b, heads, s, d)."""
    s, b, width = x.shape
    return x.reshape(s, b, heads, width // heads).transpose(1, 2, 0, 3)  # (b, heads, s, d)


def expand_kv(x, repeats):
    """(b, G, s, d) -> (b, G*repeats, s, d): each KV head shared by its group's query heads
    (Megatron DotProductAttention repeat_interleave)."""
    return np.repeat(x, repeats, axis=1)  # (b, a, s, d)


def reduce_kv(dx, repeats):
    """Inverse of expand_kv's gradient: sum each group's query heads, (b, a, s, d) -> (b, G, s, d)."""
    b, a, s, d = dx.shape
    return dx.reshape(b, a // repeats, repeats, s, d).sum(axis=2)  # (b, G, s, d)


# ---------------------------------------------------------------------------------------------
# ops on a rank


def kv_names(m) -> tuple[str, str]:
    """Names of K and V as split: "k_groups"/"v_groups" when the unfused core expands them."""
    expand = m.query_groups != m.num_attention_heads and not m.flash
    return ("k_groups", "v_groups") if expand else ("k", "v")


def qkv_split(r, qkv, heads: int, head_dim: int, groups: int | None = None,
              names: tuple = ("q", "k", "v")):
    """(s, b, (a + 2G)d/t) group-major fused QKV -> q (b, a/t, s, d), k, v (b, G/t, s, d)."""
    s, b, _ = qkv.shape
    groups = groups or heads
    parts = []
    for j, name in enumerate(names):
        t = r.alloc((b, heads if j == 0 else groups, s, head_dim), FP16, name)
        if r.numeric:
            t.data = np.ascontiguousarray(split_qkv(qkv.data, heads, groups)[j])
        parts.append(t)
    yield from r.compute("split_qkv", "elementwise", nbytes=2 * qkv.nbytes)
    return parts


def qkv_merge_grads(r, dq, dk, dv):
    """dq (b, a/t, s, d), dk, dv (b, G/t, s, d) -> d(qkv) (s, b, (a + 2G)d/t), group-major."""
    b, heads, s, d = dq.shape
    out = r.alloc((s, b, (heads + 2 * dk.shape[1]) * d), FP16, "d_qkv")
    if r.numeric:
        out.data = merge_qkv_grads(dq.data, dk.data, dv.data)
    yield from r.compute("merge_qkv_grads", "elementwise", nbytes=2 * out.nbytes)
    return out


def kv_expand(r, x: Tensor, repeats: int, name: str):
    """(b, G, s, d) -> (b, G·repeats, s, d): each KV head copied for its group's query heads."""
    b, groups, s, d = x.shape
    return (yield from elementwise(r, (b, groups * repeats, s, d), name,
                                   lambda: expand_kv(x.data, repeats),
                                   x.nbytes * (1 + repeats)))


def kv_reduce(r, dx: Tensor, repeats: int, name: str):
    """Gradient of expand_kv: (b, a, s, d) summed per group -> (b, a/repeats, s, d)."""
    b, heads, s, d = dx.shape
    return (yield from elementwise(r, (b, heads // repeats, s, d), name,
                                   lambda: reduce_kv(dx.data, repeats),
                                   dx.nbytes * (1 + repeats) // repeats))
