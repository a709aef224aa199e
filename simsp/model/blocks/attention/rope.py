"""Rotary position embedding (--position-embedding-type rope; Su et al. 2021, arXiv:2104.09864)
as Megatron-LM applies it (RotaryEmbedding, apply_rotary_pos_emb_bshd, non-interleaved): numpy
math, the rank's op and the angles a rank applies. RoPE rotates q and k in place of a position
table and keeps nothing more for backward (docs/llama.md); MLA's de-interleaved variant is
blocks/attention/mla.py's.
"""

import numpy as np

from simsp.model.base import fusions
from simsp.model.base.ops import elementwise
from simsp.model.tensor import Tensor


def rope_angles(s, rot_dim, base, start=0):
    """cos, sin (s, rot_dim) of positions start..start+s-1."""
    return rope_tables(np.arange(start, start + s, dtype=np.float64), rot_dim, base)


def rope_tables(positions: np.ndarray, rot_dim: int, base: float):
    """cos, sin (len(positions), rot_dim) at arbitrary global positions (a context-parallel
    rank's chunks): inv_freq = base^(-2i/rot_dim), repeated for both halves (Megatron-LM
    RotaryEmbedding, non-interleaved)."""
    inv_freq = 1.0 / (float(base) ** (np.arange(0, rot_dim, 2, dtype=np.float64) / rot_dim))
    freqs = positions.astype(np.float64)[:, None] * inv_freq  # (n, rot/2)
    emb = np.concatenate([freqs, freqs], axis=-1)  # (n, rot_dim)
    return np.cos(emb), np.sin(emb)


def _rotate_half(x):
    """[x1, x2] -> [-x2, x1] over the last dim."""
    x1, x2 = np.split(x, 2, axis=-1)
    return np.concatenate([-x2, x1], axis=-1)


def rope_forward(x, cos, sin):
    """Rotate the first rot_dim channels of x (b, heads, s, d) by the angles (s, rot_dim)
    (Megatron-LM apply_rotary_pos_emb_bshd); the rest pass through."""
    rot = cos.shape[-1]
    head, rest = x[..., :rot], x[..., rot:]  # (b, heads, s, rot), (b, heads, s, d - rot)
    cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
    return np.concatenate([head * cos + _rotate_half(head) * sin, rest], axis=-1)  # (b,h,s,d)


def rope_backward(dy, cos, sin):
    """dx of rope_forward: the inverse rotation (rotate_half is antisymmetric)."""
    rot = cos.shape[-1]
    head, rest = dy[..., :rot], dy[..., rot:]
    cos, sin = cos.astype(dy.dtype), sin.astype(dy.dtype)
    return np.concatenate([head * cos - _rotate_half(head * sin), rest], axis=-1)


def rope(r, x: Tensor, cos, sin, name: str, m, inverse: bool = False):
    """x (b, heads, s, d) rotated per position by the angles (s, rot) (RoPE); `inverse` is the
    backward (the transposed rotation). Priced fused (one kernel) or, without
    m.apply_rope_fusion, as PyTorch's eager kernels (base/fusions.py)."""
    kernel = rope_backward if inverse else rope_forward
    rotated = x.nbytes * int(m.head_dim * m.rotary_percent) // m.head_dim
    price = fusions.rope_backward if inverse else fusions.rope_forward
    return (yield from elementwise(r, x.shape, name, lambda: kernel(x.data, cos, sin),
                                   price(x.nbytes, rotated, m.apply_rope_fusion)))


def angles(m, s: int, cp=None):
    """cos, sin (s, rot) of positions 0..s−1: attention sees the whole sequence on every TP
    rank (SP gathers it first), so every rank applies the same angles; with context
    parallelism (`cp`, a rank's ContextParallelAttention) those of its chunks' global
    positions (rope_tables)."""
    rot = int(m.head_dim * m.rotary_percent)
    if cp is not None:
        return rope_tables(cp.positions, rot, m.rotary_base)
    return rope_angles(s, rot, m.rotary_base)
