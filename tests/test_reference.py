"""Reference GPT: finite-difference gradients of every parameter, SGD descent, dropout p = 0."""

import numpy as np
import pytest

from simsp.scenario.config import Model
from simsp.model.base.kernels import dropout_backward, keep_mask
from simsp.model.base.dropout_sites import site_id
from simsp.model.params import init_params, param_shapes
from simsp.model.reference import reference_forward_backward

TINY = Model(num_layers=2, hidden_size=16, num_attention_heads=2, seq_length=8, vocab_size=32,
             hidden_dropout=0.1, attention_dropout=0.1)
NO_DROPOUT = Model(**{**TINY.__dict__, "hidden_dropout": 0.0, "attention_dropout": 0.0})
SEED, B, OFFSET = 42, 2, 3


def batch(model, seed=0):
    """Random tokens and targets (s, B)."""
    rng = np.random.default_rng(seed)
    shape = (model.seq_length, B)
    return rng.integers(0, model.vocab_size, shape), rng.integers(0, model.vocab_size, shape)


def loss_of(params, model, tokens, targets):
    return reference_forward_backward(params, tokens, targets, model, SEED, OFFSET)[0]


@pytest.fixture(scope="module")
def tiny():
    params = init_params(TINY, seed=7, dtype=np.float64)
    tokens, targets = batch(TINY)
    loss, grads = reference_forward_backward(params, tokens, targets, TINY, SEED, OFFSET)
    return params, tokens, targets, loss, grads


def test_param_names_and_count():
    shapes = param_shapes(TINY)
    assert list(shapes)[:2] == ["embedding.word", "embedding.position"]
    assert list(shapes)[-2:] == ["final_ln.gamma", "final_ln.beta"]
    assert shapes["layers.1.attn.qkv.weight"] == (16, 48)
    assert shapes["layers.0.mlp.fc2.weight"] == (64, 16)
    L, h, v, s = 2, 16, 32, 8
    # N21 Eq. 2 plus the final layer norm
    count = sum(int(np.prod(shape)) for shape in param_shapes(TINY).values())
    assert count == 12 * L * h * h + 13 * L * h + (v + s) * h + 2 * h
    a, b = init_params(TINY, 7), init_params(TINY, 7)
    assert all(np.array_equal(a[n], b[n]) for n in a)


def test_grads_cover_every_param(tiny):
    params, _, _, _, grads = tiny
    assert list(grads) == [*params, "embedding_output"]
    assert all(grads[n].shape == params[n].shape for n in params)


def central_difference(params, name, idx, tokens, targets, eps=1e-5):
    """d loss / d params[name][idx] by central differences (the entry is restored)."""
    p = params[name]
    old = p[idx]
    p[idx] = old + eps
    plus = loss_of(params, TINY, tokens, targets)
    p[idx] = old - eps
    minus = loss_of(params, TINY, tokens, targets)
    p[idx] = old
    return (plus - minus) / (2 * eps)


def test_finite_differences_every_param(tiny):
    """Six sampled entries of each parameter's gradient against central differences (dropout on).

    Norm-wise over the sampled entries: entry-wise, tiny gradients (~1e-7) drown in roundoff.
    """
    params, tokens, targets, _, grads = tiny
    rng, worst = np.random.default_rng(1), 0.0
    for name, p in params.items():
        picks = [np.unravel_index(f, p.shape) for f in rng.choice(p.size, 6, replace=False)]
        numeric = np.array([central_difference(params, name, i, tokens, targets) for i in picks])
        analytic = np.array([grads[name][i] for i in picks])
        err = np.linalg.norm(numeric - analytic) / np.linalg.norm(analytic)
        worst = max(worst, err)
        assert err < 1e-6, (name, numeric, analytic)
    print(f"worst per-parameter relative error {worst:.2e}")


def test_embedding_output_grad(tiny):
    """d position = sum over the batch of the embedding-dropout backward of d embedding_output."""
    _, _, _, _, grads = tiny
    keep = keep_mask(TINY.hidden_dropout, SEED, site_id(-1, "embedding"), (0, OFFSET, 0),
                       grads["embedding_output"].shape)  # (s, B, h)
    demb = dropout_backward(grads["embedding_output"], keep, TINY.hidden_dropout)
    assert np.allclose(demb.sum(axis=1), grads["embedding.position"], rtol=1e-12, atol=1e-15)


def test_sgd_step_decreases_loss(tiny):
    params, tokens, targets, loss, grads = tiny
    stepped = {n: p - 0.5 * grads[n] for n, p in params.items()}
    assert loss_of(stepped, TINY, tokens, targets) < loss


def plain_loss(params, model, tokens, targets):
    """Independent no-dropout forward with explicit per-head column indices and loops."""
    a, d = model.num_attention_heads, model.head_dim
    s = tokens.shape[0]

    def ln(x, g, b):
        return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b

    x = params["embedding.word"][tokens] + params["embedding.position"][:s, None]  # (s, B, h)
    for i in range(model.num_layers):
        prefix = f"layers.{i}."
        P = {n[len(prefix):]: p for n, p in params.items() if n.startswith(prefix)}
        qkv = ln(x, P["ln1.gamma"], P["ln1.beta"]) @ P["attn.qkv.weight"] + P["attn.qkv.bias"]
        ctx = np.zeros_like(x)  # (s, B, h)
        for head in range(a):
            q, k, v = (qkv[..., head * 3 * d + j * d: head * 3 * d + (j + 1) * d] for j in range(3))
            for t in range(s):  # query t attends to keys 0..t
                sc = np.einsum("bd,kbd->bk", q[t], k[: t + 1]) / np.sqrt(d)  # (B, t+1)
                w = np.exp(sc - sc.max(-1, keepdims=True))
                w /= w.sum(-1, keepdims=True)
                ctx[t, :, head * d:(head + 1) * d] = np.einsum("bk,kbd->bd", w, v[: t + 1])
        x = x + ctx @ P["attn.proj.weight"] + P["attn.proj.bias"]
        f1 = ln(x, P["ln2.gamma"], P["ln2.beta"]) @ P["mlp.fc1.weight"] + P["mlp.fc1.bias"]
        gelu = 0.5 * f1 * (1 + np.tanh(np.sqrt(2 / np.pi) * (f1 + 0.044715 * f1**3)))
        x = x + gelu @ P["mlp.fc2.weight"] + P["mlp.fc2.bias"]
    logits = ln(x, params["final_ln.gamma"], params["final_ln.beta"]) @ params["embedding.word"].T
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    return -np.take_along_axis(logp, targets[..., None], -1).mean()


def test_p0_matches_plain_forward_and_ignores_seed():
    params = init_params(NO_DROPOUT, seed=7)
    tokens, targets = batch(NO_DROPOUT)
    loss, grads = reference_forward_backward(params, tokens, targets, NO_DROPOUT, 1)
    assert np.isclose(loss, plain_loss(params, NO_DROPOUT, tokens, targets), rtol=1e-12)
    loss2, grads2 = reference_forward_backward(params, tokens, targets, NO_DROPOUT, 99, 5)
    assert loss2 == loss and all(np.array_equal(grads[n], grads2[n]) for n in grads)


def test_dropout_changes_loss_and_depends_on_offset(tiny):
    params, tokens, targets, loss, _ = tiny
    assert loss != loss_of(params, NO_DROPOUT, tokens, targets)
    other = reference_forward_backward(params, tokens, targets, TINY, SEED, OFFSET + 1)[0]
    assert other != loss


def test_float32_runs_in_float32():
    params = init_params(TINY, seed=7, dtype=np.float32)
    tokens, targets = batch(TINY)
    loss, grads = reference_forward_backward(params, tokens, targets, TINY, SEED)
    loss64, grads64 = reference_forward_backward(init_params(TINY, 7), tokens, targets, TINY, SEED)
    assert all(g.dtype == np.float32 for g in grads.values())
    assert np.isclose(loss, loss64, rtol=1e-5)
    assert np.allclose(grads["embedding.word"], grads64["embedding.word"], atol=1e-6)
