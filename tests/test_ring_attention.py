"""Ring attention (CP p2p) equals full causal attention, forward and backward, to rounding."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simsp.model.context_split import gather_sequence, local_positions, split_sequence
from simsp.training.context_parallel.ring_kernels import (CpShard, ring_backward, ring_forward,
                                                          source_rank)


def oracle_attention(q, k, v):
    """Plain causal softmax attention, q (b, a, s, d), k/v (b, G, s, d): out (b, a, s, d)."""
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = q.shape[2]
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    scores = scores + np.triu(np.full((s, s), -np.inf), 1)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p @ v


def oracle_grads(q, k, v, dout):
    """Chain rule of oracle_attention by hand: dq, dk, dv."""
    rep = q.shape[1] // k.shape[1]
    kx, vx = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s, scale = q.shape[2], 1 / np.sqrt(q.shape[-1])
    scores = q @ kx.swapaxes(-1, -2) * scale + np.triu(np.full((s, s), -np.inf), 1)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = dout @ vx.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) * scale
    fold = lambda x: x.reshape(x.shape[0], -1, rep, *x.shape[2:]).sum(2)  # noqa: E731
    return ds @ kx, fold(ds.swapaxes(-1, -2) @ q), fold(p.swapaxes(-1, -2) @ dout)


def _tensors(s, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 4, s, 8))  # (b, a, s, d)
    k, v = rng.standard_normal((2, 1, 2, s, 8))  # (b, G, s, d) each
    return q, k, v, rng.standard_normal(q.shape)


def test_oracle_gradient_matches_finite_differences():
    q, k, v, dout = _tensors(6, seed=1)
    grads = oracle_grads(q, k, v, dout)
    h = 1e-6
    for which, x in enumerate((q, k, v)):
        for idx in [(0, 0, 3, 1), (0, 1, 5, 7), (0, 0, 0, 0)]:
            up, down = x.copy(), x.copy()
            up[idx] += h
            down[idx] -= h
            args_up = [up if i == which else t for i, t in enumerate((q, k, v))]
            args_dn = [down if i == which else t for i, t in enumerate((q, k, v))]
            fd = ((oracle_attention(*args_up) - oracle_attention(*args_dn)) * dout).sum() / (2 * h)
            assert abs(fd - grads[which][idx]) < 1e-8


@pytest.mark.parametrize("cp", [2, 4, 8])
@pytest.mark.parametrize("balanced", [True, False])
def test_ring_attention_equals_full_causal_attention(cp, balanced):
    s = 32
    q, k, v, dout = _tensors(s, seed=cp)
    cut = lambda x: [split_sequence(x, cp, r, balanced) for r in range(cp)]  # noqa: E731
    shards = [CpShard(qr, kr, vr, local_positions(s, cp, r, balanced))
              for r, (qr, kr, vr) in enumerate(zip(cut(q), cut(k), cut(v)))]
    state = ring_forward(shards)
    out = gather_sequence([o for o, _ in state], balanced)
    assert np.abs(out - oracle_attention(q, k, v)).max() < 1e-12
    grads = ring_backward(shards, cut(dout), [o for o, _ in state], [lse for _, lse in state])
    for which, expected in enumerate(oracle_grads(q, k, v, dout)):
        got = gather_sequence([g[which] for g in grads], balanced)
        assert np.abs(got - expected).max() < 1e-12


def test_each_step_holds_the_previous_ranks_block():
    assert [[source_rank(r, i, 4) for r in range(4)] for i in range(4)] == [
        [0, 1, 2, 3], [3, 0, 1, 2], [2, 3, 0, 1], [1, 2, 3, 0]]


def test_cp_by_tp_attention_core_with_rope_equals_the_single_device_flash_core():
    from simsp.model.blocks.attention.flash import flash_backward, flash_forward
    from simsp.model.blocks.attention.rope import (rope_angles, rope_backward, rope_forward,
                                                   rope_tables)
    cp, tp, s, rot, base = 4, 2, 32, 8, 10000.0
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 8, s, 8))  # (b, a, s, d) before RoPE
    k, v = rng.standard_normal((2, 2, 4, s, 8))  # (b, G, s, d)
    dout = rng.standard_normal(q.shape)
    cos, sin = rope_angles(s, rot, base)
    q_rot, k_rot = rope_forward(q, cos, sin), rope_forward(k, cos, sin)
    out, lse = flash_forward(q_rot, k_rot, v)
    dq_rot, dk_rot, dv = flash_backward(dout, q_rot, k_rot, v, out, lse)
    expected = (out, rope_backward(dq_rot, cos, sin),
                rope_backward(dk_rot, cos, sin), dv)
    got = [np.zeros_like(x) for x in expected]
    for t in range(tp):  # each TP rank: a/t query heads, G/t KV heads
        heads, groups = slice(4 * t, 4 * t + 4), slice(2 * t, 2 * t + 2)
        shards, tables = [], []
        for r in range(cp):
            pos = local_positions(s, cp, r)
            c, sn = rope_tables(pos, rot, base)
            tables.append((c, sn))
            shards.append(CpShard(rope_forward(q[:, heads][:, :, pos], c, sn),
                                  rope_forward(k[:, groups][:, :, pos], c, sn),
                                  v[:, groups][:, :, pos], pos))
        state = ring_forward(shards)
        douts = [dout[:, heads][:, :, sh.pos] for sh in shards]
        grads = ring_backward(shards, douts, [o for o, _ in state], [lse for _, lse in state])
        for r, (sh, (c, sn)) in enumerate(zip(shards, tables)):
            got[0][:, heads.start:heads.stop, sh.pos] = state[r][0]
            got[1][:, heads.start:heads.stop, sh.pos] = rope_backward(grads[r][0], c, sn)
            got[2][:, groups.start:groups.stop, sh.pos] = rope_backward(grads[r][1], c, sn)
            got[3][:, groups.start:groups.stop, sh.pos] = grads[r][2]
    for mine, ref in zip(got, expected):
        assert np.abs(mine - ref).max() < 1e-12


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("balanced", [True, False])
def test_ulysses_attention_equals_full_causal_attention(cp, balanced):
    from simsp.training.context_parallel.ulysses_kernels import ulysses_backward, ulysses_forward
    s = 32
    rng = np.random.default_rng(cp)
    q = rng.standard_normal((1, 8, s, 8))  # (b, a, s, d)
    k, v = rng.standard_normal((2, 1, 4, s, 8))  # (b, G, s, d)
    dout = rng.standard_normal(q.shape)
    cut = lambda x: [split_sequence(x, cp, r, balanced) for r in range(cp)]  # noqa: E731
    shards = [CpShard(qr, kr, vr, local_positions(s, cp, r, balanced))
              for r, (qr, kr, vr) in enumerate(zip(cut(q), cut(k), cut(v)))]
    outs, saved = ulysses_forward(shards)
    assert np.abs(gather_sequence(outs, balanced) - oracle_attention(q, k, v)).max() < 1e-12
    grads = ulysses_backward(shards, cut(dout), saved)
    for which, expected in enumerate(oracle_grads(q, k, v, dout)):
        got = gather_sequence([g[which] for g in grads], balanced)
        assert np.abs(got - expected).max() < 1e-12


@settings(max_examples=12, deadline=None)
@given(cp=st.sampled_from([2, 3, 4]), chunk=st.integers(1, 3), groups=st.sampled_from([1, 2]),
       rep=st.sampled_from([1, 3]), balanced=st.booleans(), seed=st.integers(0, 2**16))
def test_ring_attention_matches_the_oracle_on_random_layouts(cp, chunk, groups, rep, balanced,
                                                             seed):
    s = chunk * (2 * cp if balanced else cp)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, groups * rep, s, 4))  # (b, a, s, d)
    k, v = rng.standard_normal((2, 2, groups, s, 4))  # (b, G, s, d)
    dout = rng.standard_normal(q.shape)
    cut = lambda x: [split_sequence(x, cp, r, balanced) for r in range(cp)]  # noqa: E731
    shards = [CpShard(qr, kr, vr, local_positions(s, cp, r, balanced))
              for r, (qr, kr, vr) in enumerate(zip(cut(q), cut(k), cut(v)))]
    state = ring_forward(shards)
    assert np.abs(gather_sequence([o for o, _ in state], balanced)
                  - oracle_attention(q, k, v)).max() < 1e-12
    grads = ring_backward(shards, cut(dout), [o for o, _ in state], [lse for _, lse in state])
    for which, expected in enumerate(oracle_grads(q, k, v, dout)):
        assert np.abs(gather_sequence([g[which] for g in grads], balanced)
                      - expected).max() < 1e-12
