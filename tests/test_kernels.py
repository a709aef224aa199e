"""Kernels: each backward against central finite differences; softmax and dropout-mask properties."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simsp.model.base.kernels import (dropout_backward, dropout_forward, keep_mask,
                                      linear_backward, linear_forward)
from simsp.model.blocks.attention.core import (attention_context_backward,
                                               attention_context_forward,
                                               attention_scores_backward, attention_scores_forward,
                                               causal_mask, causal_softmax_forward,
                                               softmax_backward)
from simsp.model.blocks.attention.heads import merge_heads, merge_qkv_grads, split_heads, split_qkv
from simsp.model.blocks.embedding import token_embedding_backward, token_embedding_forward
from simsp.model.blocks.head import cross_entropy_backward, cross_entropy_forward
from simsp.model.blocks.mlp.activation import gelu_backward, gelu_forward
from simsp.model.blocks.norm import layernorm_backward, layernorm_forward

RTOL = 1e-6


def numeric_grad(f, x, eps=1e-6):
    """Central finite differences of the scalar f() w.r.t. every entry of x (mutated in place)."""
    grad = np.zeros_like(x)  # x.shape
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        plus = f()
        x[idx] = old - eps
        minus = f()
        x[idx] = old
        grad[idx] = (plus - minus) / (2 * eps)
    return grad


def rel_err(a, b):
    """Norm-wise relative error between two gradients."""
    return np.linalg.norm(a - b) / max(np.linalg.norm(a), np.linalg.norm(b), 1e-30)


def check(f, analytic, *inputs):
    """Each analytic gradient matches finite differences of f to RTOL."""
    for x, g in zip(inputs, analytic):
        assert g.shape == x.shape
        assert rel_err(g, numeric_grad(f, x)) < RTOL


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_linear(rng):
    x, w, b = rng.normal(size=(3, 2, 4)), rng.normal(size=(4, 5)), rng.normal(size=5)
    r = rng.normal(size=(3, 2, 5))  # (..., n) random projection makes the output a scalar
    dx, dw, db = linear_backward(r, x, w)
    check(lambda: (linear_forward(x, w, b) * r).sum(), (dx, dw, db), x, w, b)
    assert np.array_equal(linear_forward(x, w, None) + b, linear_forward(x, w, b))


def test_layernorm(rng):
    x = rng.normal(size=(3, 2, 6)) * 2 + 0.5  # (s, b, h)
    gamma, beta = 1 + 0.1 * rng.normal(size=6), rng.normal(size=6)
    r = rng.normal(size=x.shape)
    dx, dg, db = layernorm_backward(r, x, gamma)
    check(lambda: (layernorm_forward(x, gamma, beta) * r).sum(), (dx, dg, db), x, gamma, beta)


def test_layernorm_normalises(rng):
    y = layernorm_forward(rng.normal(size=(4, 8)) * 3 + 1, np.ones(8), np.zeros(8))
    assert np.allclose(y.mean(-1), 0) and np.allclose(y.var(-1), 1, atol=1e-4)


def test_gelu(rng):
    x = rng.normal(size=(4, 5)) * 2  # (...)
    r = rng.normal(size=x.shape)
    check(lambda: (gelu_forward(x) * r).sum(), (gelu_backward(r, x),), x)
    # GPT-2 tanh approximation stays within 1e-3 of the exact x * Phi(x)
    from math import erf, sqrt
    exact = np.vectorize(lambda t: 0.5 * t * (1 + erf(t / sqrt(2))))(x)
    assert np.abs(gelu_forward(x) - exact).max() < 1e-3


def test_causal_softmax_rows_and_mask(rng):
    scores = rng.normal(size=(2, 3, 5, 5)) * 4  # (b, heads, s, s)
    probs = causal_softmax_forward(scores)
    assert np.allclose(probs.sum(-1), 1.0)
    upper = ~causal_mask(5, 5)  # (s, s) keys after the query
    assert np.all(probs[..., upper] == 0.0)
    assert np.all(probs[..., 0, 0] == 1.0)  # the first query sees only itself


def test_softmax_backward(rng):
    scores = rng.normal(size=(1, 2, 4, 4))  # (b, heads, s, s)
    r = rng.normal(size=scores.shape)
    dscores = softmax_backward(r, causal_softmax_forward(scores))
    check(lambda: (causal_softmax_forward(scores) * r).sum(), (dscores,), scores)


def test_attention_scores_and_context(rng):
    q, k, v = (rng.normal(size=(2, 2, 4, 3)) for _ in range(3))  # (b, heads, s, d)
    r = rng.normal(size=(2, 2, 4, 4))  # (b, heads, s_q, s_k)
    check(lambda: (attention_scores_forward(q, k) * r).sum(),
          attention_scores_backward(r, q, k), q, k)
    probs = rng.random(size=(2, 2, 4, 4))
    rc = rng.normal(size=(2, 2, 4, 3))
    check(lambda: (attention_context_forward(probs, v) * rc).sum(),
          attention_context_backward(rc, probs, v), probs, v)


def test_qkv_layout_head_major(rng):
    s, b, heads, d = 3, 2, 2, 4
    qkv = rng.normal(size=(s, b, 3 * heads * d))  # (s, b, 3h)
    q, k, v = split_qkv(qkv, heads)  # (b, heads, s, d)
    for head in range(heads):
        for j, part in enumerate((q, k, v)):
            cols = head * 3 * d + j * d + np.arange(d)  # Megatron column order
            assert np.array_equal(part[:, head], qkv[..., cols].transpose(1, 0, 2))
    assert np.array_equal(merge_qkv_grads(q, k, v), qkv)
    assert np.array_equal(split_heads(merge_heads(q), heads), q)


def test_dropout(rng):
    x, r = rng.normal(size=(4, 3, 5)), rng.normal(size=(4, 3, 5))
    keep = keep_mask(0.3, 7, 1, (0, 0, 0), x.shape)
    check(lambda: (dropout_forward(x, keep, 0.3) * r).sum(),
          (dropout_backward(r, keep, 0.3),), x)
    assert np.array_equal(dropout_forward(x, keep_mask(0.0, 7, 1, (0, 0, 0), x.shape), 0.0), x)


def test_float32_stays_float32(rng):
    x = rng.normal(size=(3, 2, 4)).astype(np.float32)  # (s, b, h)
    g = np.ones(4, np.float32)
    keep = keep_mask(0.5, 1, 1, (0, 0, 0), x.shape)
    outs = [gelu_forward(x), gelu_backward(x, x), layernorm_forward(x, g, g),
            *layernorm_backward(x, x, g), dropout_forward(x, keep, 0.5),
            attention_scores_forward(x[None], x[None]),
            causal_softmax_forward(x[None, :, :, :2] @ x[None, :, :, :2].swapaxes(-1, -2))]
    assert all(o.dtype == np.float32 for o in outs)


def test_embedding(rng):
    v, s_max, h = 7, 6, 3
    tokens = rng.integers(0, v, size=(4, 2))  # (s, b), repeated ids exercise the scatter-add
    word, position = rng.normal(size=(v, h)), rng.normal(size=(s_max, h))
    r = rng.normal(size=(4, 2, h))
    dword, dpos = token_embedding_backward(r, tokens, v, s_max)
    check(lambda: (token_embedding_forward(tokens, word, position) * r).sum(), (dword, dpos),
          word, position)


def test_cross_entropy(rng):
    logits = rng.normal(size=(3, 2, 5)) * 3  # (s, b, v)
    targets = rng.integers(0, 5, size=(3, 2))  # (s, b)
    dlogits = cross_entropy_backward(logits, targets, 0.7)
    check(lambda: 0.7 * cross_entropy_forward(logits, targets), (dlogits,), logits)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = -sum(logp[i, j, targets[i, j]] for i in range(3) for j in range(2))
    assert np.isclose(cross_entropy_forward(logits, targets), expected)


def test_cross_entropy_fp16_upcast():
    logits = np.full((1, 1, 4), 20.0, dtype=np.float16)
    loss = cross_entropy_forward(logits, np.zeros((1, 1), dtype=int))
    assert loss.dtype == np.float32 and np.isclose(loss, np.log(4))


# --- keep_mask: global coordinates ---------------------------------------------------------

FULL = (6, 5, 7)  # (s, b, h)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_keep_mask_same_for_any_shard(data):
    full = keep_mask(0.4, 11, 3, (0, 0, 0), FULL)  # (s, b, h)
    starts, sizes = [], []
    for n in FULL:
        start = data.draw(st.integers(0, n - 1))
        starts.append(start)
        sizes.append(data.draw(st.integers(1, n - start)))
    shard = keep_mask(0.4, 11, 3, tuple(starts), tuple(sizes))
    window = tuple(slice(a, a + n) for a, n in zip(starts, sizes))
    assert np.array_equal(shard, full[window])


def test_keep_mask_concatenated_shards():
    full = keep_mask(0.2, 5, 9, (2, 0, 0, 0), (2, 4, 8, 8))  # (b, heads, s, s) from sample 2
    heads = [keep_mask(0.2, 5, 9, (2, hd, 0, 0), (2, 2, 8, 8)) for hd in (0, 2)]
    assert np.array_equal(np.concatenate(heads, axis=1), full)


def test_keep_mask_fraction_and_determinism():
    p, shape = 0.1, (64, 32, 512)
    mask = keep_mask(p, 1234, 4, (0, 0, 0), shape)
    assert abs(mask.mean() - (1 - p)) < 0.003  # ~1e6 draws: std of the mean ~3e-4
    assert np.array_equal(mask, keep_mask(p, 1234, 4, (0, 0, 0), shape))
    assert not np.array_equal(mask, keep_mask(p, 1235, 4, (0, 0, 0), shape))
    assert not np.array_equal(mask, keep_mask(p, 1234, 5, (0, 0, 0), shape))
    assert keep_mask(0.0, 1234, 4, (0, 0, 0), shape).all()


def test_keep_mask_axes_independent():
    """Transposed coordinates draw different masks (no symmetry between axes)."""
    mask = keep_mask(0.5, 3, 2, (0, 0), (64, 64))  # (n, n)
    assert 0.3 < (mask == mask.T).mean() < 0.7
