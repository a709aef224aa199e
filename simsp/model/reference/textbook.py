"""Textbook forward math of the transformer's pieces, written apart from the simulated kernels.

Forward only, on autodiff Vars (reference/autodiff.py gives the gradients). Each function is
the formula of its source, not a copy of the blocks' numpy kernels (simsp/model/blocks/): a disagreement between the
two is a bug in one of them. Layout (s, b, h) for activations, (b, heads, s, d) inside
attention. Sources:
- LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019) with eps inside the root,
  the epsilon of Megatron-LM's --norm-epsilon (transformer_config.py layernorm_epsilon: "for any
  LayerNorm/RMSNorm").
- GeLU in the tanh form of Megatron-LM fusions/fused_bias_gelu.py (Hendrycks & Gimpel 2016);
  SwiGLU silu(x W_gate) · (x W_up) (Shazeer 2020; Megatron-LM transformer/mlp.py glu: the
  first chunk of fc1's output is the gate).
- RoPE as Megatron-LM models/common/embeddings: inv_freq = base^(−2i/rot) over
  rot = int(d · rotary_percent) channels (rotary_pos_embedding.py), cos/sin of [θ | θ],
  rope_utils.py _apply_rotary_pos_emb_bshd: the first rot channels rotated by halves
  (x·cos + [−x₂ | x₁]·sin), the rest passed through; with MLA (mla_rotary_interleaved) those
  rot channels are first de-interleaved (even ones, then odd ones).
- Causal softmax attention softmax(q kᵀ · scale + mask) v (Vaswani et al. 2017), query head j
  reading KV group j // (a/G) (Megatron-LM DotProductAttention's repeat_interleave).
- Cross entropy −log softmax(logits)[target].
"""

import math

import numpy as np

from simsp.model.reference import autodiff as ad

GELU_TANH_SCALE = math.sqrt(2.0 / math.pi)  # fused_bias_gelu.py: 0.79788456
GELU_CUBIC = 0.044715


def linear(x, weight, bias=None):
    """x (..., k) @ weight (k, n) (+ bias (n,)) -> (..., n)."""
    y = x @ weight
    return y if bias is None else y + bias


def layer_norm(x, gamma, beta, eps: float):
    """(x − mean) / sqrt(var + eps) · gamma + beta over the last axis (biased variance)."""
    centred = x - ad.mean(x, -1, keepdims=True)  # (..., h)
    variance = ad.mean(centred * centred, -1, keepdims=True)  # (..., 1)
    return centred / ad.sqrt(variance + eps) * gamma + beta


def rms_norm(x, gamma, eps: float):
    """x / sqrt(mean(x²) + eps) · gamma over the last axis."""
    return x / ad.sqrt(ad.mean(x * x, -1, keepdims=True) + eps) * gamma


def gelu_tanh(x):
    """0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))."""
    return 0.5 * x * (1.0 + ad.tanh(GELU_TANH_SCALE * (x + GELU_CUBIC * x * x * x)))


def squared_relu(x):
    """max(x, 0)² (Primer, So et al. 2021; Megatron-LM core/activations.py squared_relu:
    torch.pow(F.relu(x), 2))."""
    positive = ad.where(x.value > 0, x, 0.0)
    return positive * positive


def sigmoid(x):
    """1 / (1 + e^(−x))."""
    return 1.0 / (1.0 + ad.exp(-x))


def swiglu(gate, up):
    """silu(gate) · up = gate · σ(gate) · up."""
    return gate * sigmoid(gate) * up


def softmax(x, axis: int = -1):
    """e^x / Σ e^x along `axis`; the row maximum (a constant: softmax ignores any shift) keeps
    the exponentials finite. Entries at −inf come out exactly 0."""
    shift = np.max(x.value, axis=axis, keepdims=True)  # constant
    e = ad.exp(x - shift)
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(x):
    """x − log Σ e^x over the last axis (shifted by its constant maximum)."""
    shifted = x - np.max(x.value, axis=-1, keepdims=True)
    return shifted - ad.log(ad.exp(shifted).sum(axis=-1, keepdims=True))


def cross_entropy_sum(logits, targets):
    """Σ over positions of −log softmax(logits)[target]; logits (s, b, v), targets (s, b)."""
    logp = log_softmax(logits)  # (s, b, v)
    s, b = targets.shape
    rows, cols = np.meshgrid(np.arange(s), np.arange(b), indexing="ij")  # (s, b) each
    return -logp[rows, cols, targets].sum()


def rope_tables(positions, rot: int, base: float):
    """cos, sin (n, rot) at the positions (n,): angles p·base^(−2i/rot), i < rot/2, twice."""
    inv_freq = 1.0 / float(base) ** (np.arange(0, rot, 2, dtype=np.float64) / rot)  # (rot/2,)
    theta = np.outer(np.asarray(positions, dtype=np.float64), inv_freq)  # (n, rot/2)
    both = np.concatenate([theta, theta], axis=-1)  # (n, rot)
    return np.cos(both), np.sin(both)


def rope(x, rot: int, base: float, deinterleave: bool = False):
    """Megatron's RoPE on x (b, heads, s, d) at positions 0..s−1: rotate the first `rot`
    channels (de-interleaved first for MLA), pass the others through."""
    s = x.shape[2]
    cos, sin = (t.astype(x.dtype) for t in rope_tables(np.arange(s), rot, base))  # (s, rot)
    head, rest = x[..., :rot], x[..., rot:]  # (b, heads, s, rot), (b, heads, s, d − rot)
    if deinterleave:
        head = ad.concatenate([head[..., 0::2], head[..., 1::2]], axis=-1)
    half = rot // 2
    rotated = ad.concatenate([-head[..., half:], head[..., :half]], axis=-1)  # [−x₂ | x₁]
    return ad.concatenate([head * cos + rotated * sin, rest], axis=-1)  # (b, heads, s, d)


def causal_attention(q, k, v, scale: float, keep=None, p: float = 0.0):
    """softmax(q kᵀ · scale, keys after the query masked) -> dropout -> · v.
    q (b, a, s, d_qk); k (b, G, s, d_qk), v (b, G, s, d_v), query head j on group j // (a/G);
    keep: the (b, a, s, s) keep-mask of the probabilities (None: no dropout). -> (b, a, s, d_v)."""
    a, groups, s = q.shape[1], k.shape[1], q.shape[2]
    group_of_head = np.arange(a) // (a // groups)  # (a,)
    k, v = k[:, group_of_head], v[:, group_of_head]  # (b, a, s, ·)
    scores = (q @ k.transpose(0, 1, 3, 2)) * scale  # (b, a, s, s)
    visible = np.tril(np.ones((s, s), dtype=bool))  # key j <= query i
    probs = softmax(ad.where(visible, scores, -np.inf))  # (b, a, s, s)
    if keep is not None:
        probs = probs * keep.astype(q.dtype) / (1.0 - p)
    return probs @ v


def dropout(x, keep, p: float):
    """Inverted dropout x · keep / (1 − p) with a given keep-mask (no mask: x)."""
    return x if keep is None else x * keep.astype(x.dtype) / (1.0 - p)


def merge_heads(x):
    """(b, heads, s, d) -> (s, b, heads·d), head-major columns."""
    b, heads, s, d = x.shape
    return x.transpose(2, 0, 1, 3).reshape(s, b, heads * d)


def split_heads(x, heads: int):
    """(s, b, heads·d) head-major columns -> (b, heads, s, d)."""
    s, b, width = x.shape
    return x.reshape(s, b, heads, width // heads).transpose(1, 2, 0, 3)
