"""GPT math as plain numpy forward/backward pairs (llm.c style), dtype-agnostic.

Every function takes and returns numpy arrays in the caller's float dtype (float64 or float32);
constants are Python floats so numpy 2 (NEP 50) never promotes float32 to float64. Activations use
the Megatron layout (s, b, h); attention tensors are (b, heads, s, d).
"""

import math

import numpy as np

# ---------------------------------------------------------------------------------------------
# Linear: y = x @ w + b


def linear_forward(x, w, b):
    """y = x @ w + b over the last dim of x; b may be None."""
    y = x @ w  # (..., n) from x (..., k), w (k, n)
    return y if b is None else y + b  # (..., n)


def linear_backward(dy, x, w):
    """Gradients of y = x @ w + b: (dx, dw, db); db is returned even if the forward had no bias."""
    k, n = w.shape
    dx = dy @ w.T  # (..., k)
    dw = x.reshape(-1, k).T @ dy.reshape(-1, n)  # (k, n)
    db = dy.reshape(-1, n).sum(axis=0)  # (n,)
    return dx, dw, db


# ---------------------------------------------------------------------------------------------
# Layer norm over the last dim (llm.c layernorm_forward/backward)


def _layernorm_stats(x, eps):
    """Mean and reciprocal standard deviation over the last dim (biased variance, as torch)."""
    mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # (..., 1)
    rstd = 1.0 / np.sqrt(var + eps)  # (..., 1)
    return mean, rstd


def layernorm_forward(x, gamma, beta, eps=1e-5):
    """y = (x - mean) * rstd * gamma + beta over the last dim."""
    mean, rstd = _layernorm_stats(x, eps)  # (..., 1) each
    return (x - mean) * rstd * gamma + beta  # (..., h)


def layernorm_backward(dy, x, gamma, eps=1e-5):
    """(dx, dgamma, dbeta); mean/rstd are recomputed from x (K22 does not count them as kept)."""
    h = x.shape[-1]
    mean, rstd = _layernorm_stats(x, eps)  # (..., 1) each
    xhat = (x - mean) * rstd  # (..., h)
    dgamma = (dy * xhat).reshape(-1, h).sum(axis=0)  # (h,)
    dbeta = dy.reshape(-1, h).sum(axis=0)  # (h,)
    dxhat = dy * gamma  # (..., h)
    # llm.c: dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))  # (..., h)
    return dx, dgamma, dbeta


# ---------------------------------------------------------------------------------------------
# GeLU, tanh approximation (GPT-2 / Megatron: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))))

_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


def gelu_forward(x):
    """GPT-2 tanh-approximated GeLU, elementwise."""
    return 0.5 * x * (1.0 + np.tanh(_GELU_C * (x + _GELU_A * x**3)))  # (...)


def gelu_backward(dy, x):
    """dx of the tanh-approximated GeLU (derivative of the formula above)."""
    t = np.tanh(_GELU_C * (x + _GELU_A * x**3))  # (...)
    dinner = _GELU_C * (1.0 + 3.0 * _GELU_A * x**2)  # (...)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner)  # (...)


# ---------------------------------------------------------------------------------------------
# Causal softmax and attention


def causal_mask(s_q, s_k):
    """Boolean (s_q, s_k): True where query i may see key j, i.e. j <= i."""
    return np.arange(s_k)[None, :] <= np.arange(s_q)[:, None]  # (s_q, s_k)


def causal_softmax_forward(scores):
    """Softmax over the last dim of (b, heads, s_q, s_k) with keys j > i masked to exactly 0."""
    visible = causal_mask(*scores.shape[-2:])  # (s_q, s_k)
    masked = np.where(visible, scores, -np.inf)  # (b, heads, s_q, s_k)
    shifted = masked - masked.max(axis=-1, keepdims=True)  # (b, heads, s_q, s_k)
    e = np.exp(shifted)  # (b, heads, s_q, s_k), exp(-inf) = 0 on masked keys
    return e / e.sum(axis=-1, keepdims=True)  # (b, heads, s_q, s_k)


def softmax_backward(dprobs, probs):
    """dscores = probs * (dprobs - sum(dprobs * probs)); masked entries get 0 as probs is 0."""
    inner = (dprobs * probs).sum(axis=-1, keepdims=True)  # (b, heads, s_q, 1)
    return probs * (dprobs - inner)  # (b, heads, s_q, s_k)


def attention_scores_forward(q, k):
    """scores = q @ k^T / sqrt(d) for q (b, heads, s_q, d), k (b, heads, s_k, d)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    return (q @ k.swapaxes(-1, -2)) * scale  # (b, heads, s_q, s_k)


def attention_scores_backward(dscores, q, k):
    """(dq, dk) of scores = q @ k^T / sqrt(d)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    dq = (dscores @ k) * scale  # (b, heads, s_q, d)
    dk = (dscores.swapaxes(-1, -2) @ q) * scale  # (b, heads, s_k, d)
    return dq, dk


def attention_context_forward(probs, v):
    """context = probs @ v for probs (b, heads, s_q, s_k), v (b, heads, s_k, d)."""
    return probs @ v  # (b, heads, s_q, d)


def attention_context_backward(dcontext, probs, v):
    """(dprobs, dv) of context = probs @ v."""
    dprobs = dcontext @ v.swapaxes(-1, -2)  # (b, heads, s_q, s_k)
    dv = probs.swapaxes(-1, -2) @ dcontext  # (b, heads, s_k, d)
    return dprobs, dv


# ---------------------------------------------------------------------------------------------
# Head layout of the fused QKV (Megatron: column = head*3d + j*d + e, j in q, k, v)


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


# ---------------------------------------------------------------------------------------------
# Dropout with counter-based masks over GLOBAL coordinates (any sharding draws the same mask)

_MASK64 = (1 << 64) - 1
_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # splitmix64 increment (golden ratio)


def _splitmix64(z):
    """splitmix64 finalizer (Steele, Lea, Flood 2014) on uint64 arrays; wraps mod 2^64."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def keep_mask(p, seed, site, starts, shape):
    """Bool mask; element idx has global coordinates starts + idx: keep = U(seed, site, coords) >= p.

    U is a splitmix64 chain over (seed, site, c_0, c_1, ...) mapped to [0, 1); p = 0 keeps all.
    A start may be an array of the axis's coordinates (n,): a context-parallel rank's rows.
    """
    shape = tuple(int(n) for n in shape)
    assert len(starts) == len(shape), "one start per dimension"
    if p == 0.0:
        return np.ones(shape, dtype=bool)
    with np.errstate(over="ignore"):
        h = _splitmix64(np.array([seed & _MASK64], dtype=np.uint64) + _GAMMA)  # (1,)
        h = _splitmix64(h ^ _splitmix64(np.array([site & _MASK64], dtype=np.uint64) + _GAMMA))
        h = h.reshape((1,) * len(shape))  # (1, ..., 1)
        for axis, (start, n) in enumerate(zip(starts, shape)):
            coord = (np.arange(start, start + n, dtype=np.int64) if np.ndim(start) == 0
                     else np.asarray(start, dtype=np.int64)).astype(np.uint64)  # (n,)
            view = [1] * len(shape)
            view[axis] = n
            h = _splitmix64(h ^ _splitmix64(coord + _GAMMA).reshape(view))  # broadcast grows
        uniform = (h >> np.uint64(11)).astype(np.float64) * 2.0**-53  # shape, in [0, 1)
    return uniform >= p  # shape


def dropout_forward(x, keep, p):
    """x * keep / (1 - p) (inverted dropout, as Megatron/torch)."""
    return x * keep / (1.0 - p)  # (...)


def dropout_backward(dy, keep, p):
    """dx = dy * keep / (1 - p)."""
    return dy * keep / (1.0 - p)  # (...)


# ---------------------------------------------------------------------------------------------
# Embedding (word + learned position) and the cross-entropy loss


def embedding_forward(tokens, word, position):
    """tokens (s, b) ints -> word[tokens] + position[0:s], shape (s, b, h)."""
    s = tokens.shape[0]
    return word[tokens] + position[:s][:, None, :]  # (s, b, h)


def embedding_backward(dy, tokens, v, s):
    """Scatter-add dy (s_tok, b, h) into (dword (v, h), dposition (s, h)); s is the table length."""
    h = dy.shape[-1]
    dword = np.zeros((v, h), dtype=dy.dtype)  # (v, h)
    np.add.at(dword, tokens.reshape(-1), dy.reshape(-1, h))
    dposition = np.zeros((s, h), dtype=dy.dtype)  # (s, h)
    dposition[: dy.shape[0]] = dy.sum(axis=1)
    return dword, dposition


def _loss_dtype(logits):
    """fp32 semantics: never below float32 (Megatron upcasts fp16 logits for the loss)."""
    return np.promote_types(logits.dtype, np.float32)


def _log_softmax(logits):
    """Stable log-softmax over the vocabulary (last dim), in the loss dtype."""
    z = logits.astype(_loss_dtype(logits), copy=False)  # (s, b, v)
    z = z - z.max(axis=-1, keepdims=True)  # (s, b, v)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))  # (s, b, v)


def cross_entropy_forward(logits, targets):
    """SUM over tokens of -log softmax(logits)[target]; logits (s, b, v), targets (s, b)."""
    logp = _log_softmax(logits)  # (s, b, v)
    picked = np.take_along_axis(logp, targets[..., None], axis=-1)  # (s, b, 1)
    return -picked.sum()


def cross_entropy_backward(logits, targets, dloss):
    """dlogits = (softmax - onehot(target)) * dloss, in the logits dtype."""
    dlogits = np.exp(_log_softmax(logits))  # (s, b, v)
    np.put_along_axis(dlogits, targets[..., None],
                      np.take_along_axis(dlogits, targets[..., None], axis=-1) - 1.0, axis=-1)
    return (dlogits * dloss).astype(logits.dtype, copy=False)  # (s, b, v)


# ---------------------------------------------------------------------------------------------
# Llama-class layers (Megatron-LM megatron/core/transformer; docs/llama.md)


def rmsnorm_forward(x, gamma, eps=1e-5):
    """y = x * rsqrt(mean(x^2) + eps) * gamma over the last dim (Zhang & Sennrich 2019)."""
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
    return x * rstd * gamma  # (..., h)


def rmsnorm_backward(dy, x, gamma, eps=1e-5):
    """(dx, dgamma); rstd is recomputed from x, as for LayerNorm."""
    h = x.shape[-1]
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
    xhat = x * rstd  # (..., h)
    dgamma = (dy * xhat).reshape(-1, h).sum(axis=0)  # (h,)
    dxhat = dy * gamma  # (..., h)
    dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))  # (..., h)
    return dx, dgamma


def swiglu_forward(x):
    """silu(gate) * up for x (..., 2f') = [gate | up] (Megatron-LM fusions/fused_bias_swiglu.py)."""
    gate, up = np.split(x, 2, axis=-1)  # (..., f') each
    return gate / (1.0 + np.exp(-gate)) * up  # (..., f')


def swiglu_backward(dy, x):
    """dx (..., 2f') = [d gate | d up] of silu(gate) * up."""
    gate, up = np.split(x, 2, axis=-1)  # (..., f') each
    sig = 1.0 / (1.0 + np.exp(-gate))  # (..., f')
    dgate = dy * up * sig * (1.0 + gate * (1.0 - sig))  # (..., f')
    return np.concatenate([dgate, dy * gate * sig], axis=-1)  # (..., 2f')


def rope_angles(s, rot_dim, base, start=0):
    """cos, sin (s, rot_dim) of positions start..start+s-1: inv_freq = base^(-2i/rot_dim),
    repeated for both halves (Megatron-LM RotaryEmbedding, non-interleaved)."""
    inv_freq = 1.0 / (float(base) ** (np.arange(0, rot_dim, 2, dtype=np.float64) / rot_dim))
    freqs = np.arange(start, start + s, dtype=np.float64)[:, None] * inv_freq  # (s, rot/2)
    emb = np.concatenate([freqs, freqs], axis=-1)  # (s, rot_dim)
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


def expand_kv(x, repeats):
    """(b, G, s, d) -> (b, G*repeats, s, d): each KV head shared by its group's query heads
    (Megatron DotProductAttention repeat_interleave)."""
    return np.repeat(x, repeats, axis=1)  # (b, a, s, d)


def reduce_kv(dx, repeats):
    """Inverse of expand_kv's gradient: sum each group's query heads, (b, a, s, d) -> (b, G, s, d)."""
    b, a, s, d = dx.shape
    return dx.reshape(b, a // repeats, repeats, s, d).sum(axis=2)  # (b, G, s, d)


FLASH_BLOCK = 16  # tile rows/columns of the blockwise attention (numeric mode)


def _flash_tiles(s):
    return [(i, min(i + FLASH_BLOCK, s)) for i in range(0, s, FLASH_BLOCK)]


def _tile_keep(keep, i0, i1, j0, j1):
    return None if keep is None else keep(i0, i1, j0, j1)


def flash_forward(q, k, v, keep=None, p=0.0):
    """FlashAttention forward (Dao et al. 2022, arXiv:2205.14135, Alg. 1): causal softmax
    attention tile by tile with an online softmax. q (b, a, s, d); k, v (b, G, s, d) shared by
    a/G query heads each; keep(i0, i1, j0, j1) gives a tile's (b, a, i, j) dropout keep-mask.
    Returns the output (b, a, s, d) and the per-row logsumexp (b, a, s)."""
    b, a, s, d = q.shape
    group = a // k.shape[1]
    kx, vx = expand_kv(k, group), expand_kv(v, group)  # (b, a, s, d): views of the tiles' K, V
    scale = 1.0 / math.sqrt(d)
    dv = v.shape[-1]  # value width (d_v of multi-latent attention; d otherwise)
    out = np.zeros((b, a, s, dv), dtype=q.dtype)  # (b, a, s, d_v)
    lse = np.zeros((b, a, s), dtype=q.dtype)  # (b, a, s)
    for i0, i1 in _flash_tiles(s):
        acc = np.zeros((b, a, i1 - i0, dv), dtype=q.dtype)  # (b, a, i, d_v)
        row_max = np.full((b, a, i1 - i0, 1), -np.inf, dtype=q.dtype)  # (b, a, i, 1)
        row_sum = np.zeros((b, a, i1 - i0, 1), dtype=q.dtype)  # (b, a, i, 1)
        for j0, j1 in _flash_tiles(s):
            if j0 >= i1:
                break  # causal: later keys are masked for every row of this tile
            scores = (q[:, :, i0:i1] @ kx[:, :, j0:j1].swapaxes(-1, -2)) * scale  # (b,a,i,j)
            visible = np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None]  # (i, j)
            scores = np.where(visible, scores, -np.inf)
            new_max = np.maximum(row_max, scores.max(axis=-1, keepdims=True))  # (b, a, i, 1)
            e = np.exp(scores - new_max)  # (b, a, i, j)
            correction = np.exp(row_max - new_max)  # (b, a, i, 1)
            row_sum = row_sum * correction + e.sum(axis=-1, keepdims=True)
            mask = _tile_keep(keep, i0, i1, j0, j1)
            dropped = e if mask is None else e * mask / (1.0 - p)  # (b, a, i, j)
            acc = acc * correction + dropped @ vx[:, :, j0:j1]  # (b, a, i, d)
            row_max = new_max
        out[:, :, i0:i1] = acc / row_sum
        lse[:, :, i0:i1] = (row_max + np.log(row_sum))[..., 0]
    return out, lse


def flash_backward(dout, q, k, v, out, lse, keep=None, p=0.0):
    """FlashAttention backward (Dao et al. 2022, Alg. 2): recompute each tile's probabilities
    from q, k and the logsumexp; D = rowsum(dout * out). Returns dq (b, a, s, d) and dk, dv
    (b, G, s, d) summed over each group's query heads."""
    b, a, s, d = q.shape
    group = a // k.shape[1]
    kx, vx = expand_kv(k, group), expand_kv(v, group)  # (b, a, s, d)
    scale = 1.0 / math.sqrt(d)
    dq, dkx, dvx = np.zeros_like(q), np.zeros_like(kx), np.zeros_like(vx)  # (b, a, s, d) each
    delta = (dout * out).sum(axis=-1, keepdims=True)  # (b, a, s, 1)
    for i0, i1 in _flash_tiles(s):
        for j0, j1 in _flash_tiles(s):
            if j0 >= i1:
                break
            scores = (q[:, :, i0:i1] @ kx[:, :, j0:j1].swapaxes(-1, -2)) * scale  # (b,a,i,j)
            visible = np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None]
            probs = np.where(visible, np.exp(scores - lse[:, :, i0:i1, None]), 0.0)
            mask = _tile_keep(keep, i0, i1, j0, j1)
            dropped = probs if mask is None else probs * mask / (1.0 - p)  # (b, a, i, j)
            dvx[:, :, j0:j1] += dropped.swapaxes(-1, -2) @ dout[:, :, i0:i1]
            ddropped = dout[:, :, i0:i1] @ vx[:, :, j0:j1].swapaxes(-1, -2)  # (b, a, i, j)
            dprobs = ddropped if mask is None else ddropped * mask / (1.0 - p)
            dscores = probs * (dprobs - delta[:, :, i0:i1]) * scale  # (b, a, i, j)
            dq[:, :, i0:i1] += dscores @ kx[:, :, j0:j1]
            dkx[:, :, j0:j1] += dscores.swapaxes(-1, -2) @ q[:, :, i0:i1]
    return dq, reduce_kv(dkx, group), reduce_kv(dvx, group)
