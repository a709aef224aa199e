"""The independent reference's pieces (simsp/model/reference/) against values worked by hand
from their sources (Megatron-LM rope_utils.py, moe_utils.py, mlp.py; the norms' papers)."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from simsp.model.reference import autodiff as ad
from simsp.model.reference import moe
from simsp.model.reference import textbook as tb
from simsp.model.reference.layer import dense_mlp

COS1, SIN1 = math.cos(1.0), math.sin(1.0)  # position 1, inv_freq base^0 = 1
COS2, SIN2 = math.cos(0.01), math.sin(0.01)  # position 1, inv_freq 10000^(-2/4) = 0.01


def rope_at_position_1(x, rot, deinterleave=False):
    """tb.rope of x (d,) at positions (0, 1), base 10000: the row of position 1."""
    both = np.stack([np.zeros_like(x), x])[None, None]  # (1, 1, 2, d): positions 0, 1
    out = tb.rope(ad.Var(both), rot, 10000, deinterleave).value
    assert np.array_equal(out[0, 0, 0], np.zeros_like(x))  # position 0: no rotation
    return out[0, 0, 1]


def test_rope_rotates_the_two_halves_as_megatron():
    """Non-interleaved RoPE pairs channel i with i + rot/2: [x1·cos − x3·sin, ...]."""
    got = rope_at_position_1(np.array([1.0, 2.0, 3.0, 4.0]), 4)
    want = [1 * COS1 - 3 * SIN1, 2 * COS2 - 4 * SIN2, 3 * COS1 + 1 * SIN1, 4 * COS2 + 2 * SIN2]
    assert np.allclose(got, want, rtol=0, atol=1e-15)


def test_rope_rotary_percent_passes_the_tail_through():
    got = rope_at_position_1(np.array([1.0, 2.0, 3.0, 4.0]), 2)
    assert np.allclose(got, [1 * COS1 - 2 * SIN1, 2 * COS1 + 1 * SIN1, 3, 4], rtol=0, atol=1e-15)


def test_mla_rope_deinterleaves_first():
    """mla_rotary_interleaved: [x0, x2 | x1, x3] rotated by halves, so the adjacent pairs
    (x0, x1), (x2, x3) turn (DeepSeek's interleaved RoPE), output in de-interleaved order."""
    got = rope_at_position_1(np.array([1.0, 2.0, 3.0, 4.0]), 4, deinterleave=True)
    want = [1 * COS1 - 2 * SIN1, 3 * COS2 - 4 * SIN2, 2 * COS1 + 1 * SIN1, 4 * COS2 + 3 * SIN2]
    assert np.allclose(got, want, rtol=0, atol=1e-15)


def test_mla_rope_with_rotary_percent_deinterleaves_the_rotated_channels_only():
    """rope_utils.py cuts t[..., :rot_dim] before the de-interleave: channels 4..7 pass."""
    got = rope_at_position_1(np.arange(1.0, 9.0), 4, deinterleave=True)
    want = [1 * COS1 - 2 * SIN1, 3 * COS2 - 4 * SIN2, 2 * COS1 + 1 * SIN1, 4 * COS2 + 3 * SIN2,
            5, 6, 7, 8]
    assert np.allclose(got, want, rtol=0, atol=1e-15)


def test_norms_put_epsilon_inside_the_root():
    x = ad.Var(np.array([1.0, 3.0]))  # mean 2, biased variance 1
    ln = tb.layer_norm(x, np.ones(2), np.zeros(2), 0.25).value
    assert np.allclose(ln, [-1 / math.sqrt(1.25), 1 / math.sqrt(1.25)], rtol=1e-15)
    rms = tb.rms_norm(ad.Var(np.array([3.0, 4.0])), np.array([2.0, 1.0]), 0.5).value
    assert np.allclose(rms, [6 / math.sqrt(13), 4 / math.sqrt(13)], rtol=1e-15)  # 12.5 + 0.5


def test_gelu_is_megatrons_tanh_form():
    inner = math.sqrt(2 / math.pi) * (1 + 0.044715)
    assert tb.gelu_tanh(ad.Var(np.array(1.0))).value == pytest.approx(
        0.5 * (1 + math.tanh(inner)), rel=1e-15)


def test_swiglu_gates_with_the_first_half_of_fc1():
    """mlp.py glu: torch.chunk(x, 2)[0] is the gate: silu(1) · 2 = 2σ(1), not silu(2) · 1."""
    model = SimpleNamespace(swiglu=True)
    P = {"mlp.fc1.weight": np.array([[[1.0], [2.0]]]), "mlp.fc2.weight": np.array([[1.0]])}
    out = dense_mlp(P, ad.Var(np.ones((1, 1, 1))), model).value  # (h=1, [gate, up], f=1)
    assert out.item() == pytest.approx(2 / (1 + math.exp(-1)), rel=1e-15)


def test_query_heads_read_their_group_and_earlier_keys():
    """a = 4 heads on G = 2 groups: heads 0, 1 read group 0, heads 2, 3 group 1; position 0
    sees only itself."""
    b, a, G, s, d = 1, 4, 2, 2, 3
    rng = np.random.default_rng(0)
    v = np.zeros((b, G, s, d))
    v[:, :, 0] = np.array([10.0, 20.0])[None, :, None]  # position 0's value: 10·(group + 1)
    v[:, :, 1] = 99.0
    out = tb.causal_attention(ad.Var(rng.normal(size=(b, a, s, d))),
                              ad.Var(rng.normal(size=(b, G, s, d))), ad.Var(v), 0.5).value
    assert np.array_equal(out[0, :, 0, 0], [10.0, 10.0, 20.0, 20.0])


def test_attention_dropout_scales_the_kept_probabilities():
    """s = 2, q·k = 0: probabilities (1/2, 1/2) at position 1; dropping key 0 at p = 1/2 leaves
    v1 · (1/2) / (1 − 1/2) = v1."""
    q = k = ad.Var(np.zeros((1, 1, 2, 1)))
    v = ad.Var(np.array([[[[4.0], [6.0]]]]))
    keep = np.ones((1, 1, 2, 2), dtype=bool)
    keep[0, 0, 1, 0] = False
    out = tb.causal_attention(q, k, v, 1.0, keep, 0.5).value
    assert out[0, 0, :, 0].tolist() == [8.0, 6.0]  # position 0: 4 · 1 / (1/2)


def test_cross_entropy_of_uniform_logits_is_log_v():
    logits = ad.Var(np.zeros((3, 2, 4)))
    loss = tb.cross_entropy_sum(logits, np.array([[0, 1], [2, 3], [1, 1]])).value
    assert loss == pytest.approx(6 * math.log(4), rel=1e-15)


def router(score="softmax", k=2, capacity=None):
    return SimpleNamespace(moe_router_topk=k, moe_router_score_function=score,
                           moe_expert_capacity_factor=capacity, num_experts=3,
                           moe_aux_loss_coeff=1.0, moe_router_load_balancing_type="aux_loss")


@pytest.mark.parametrize("score, k, want", [
    ("softmax", 2, [1 / (1 + math.e), math.e / (1 + math.e), 0.0]),  # softmax over logits 1, 2
    ("sigmoid", 2, [1 / (1 + math.exp(-1)), 1 / (1 + math.exp(-2)), 0.0]),  # normalised below
    ("sigmoid", 1, [0.0, 1 / (1 + math.exp(-2)), 0.0]),  # k = 1: not normalised
])
def test_routing_weights_by_hand(score, k, want):
    w = moe.routing_weights(ad.Var(np.array([[1.0, 2.0, 0.0]])), router(score, k)).value[0]
    want = np.array(want)
    if score == "sigmoid" and k > 1:
        want = want / want.sum()
    assert np.allclose(w, want, rtol=1e-15, atol=0)


def test_capacity_keeps_each_experts_most_probable_tokens():
    """T = 4, k = 1, E = 2, factor 0.5: C = ceil(4·1/2·0.5) = 1 token per expert."""
    weights = np.array([[0.9, 0], [0.6, 0], [0, 0.7], [0, 0.8]])
    model = SimpleNamespace(moe_expert_capacity_factor=0.5, moe_router_topk=1)
    keep = moe.capacity_mask(weights, model)
    assert keep.tolist() == [[True, False], [False, False], [False, False], [False, True]]


def test_switch_aux_loss_by_hand():
    """Scores softmax([0, 0]) = (1/2, 1/2), softmax([ln 3, 0]) = (3/4, 1/4); top-1 picks
    expert 0 twice (the tie to the lower index): tokens_e = (2, 0); loss = E·coeff/(k·T²) ·
    Σ_e (Σ_t score) · tokens_e = 2/4 · (5/4 · 2) = 5/4."""
    model = SimpleNamespace(**{**router(k=1).__dict__, "num_experts": 2})
    x = ad.Var(np.array([[0.0, 0.0], [math.log(3.0), 0.0]]))
    loss = moe.aux_loss(x, {"mlp.router.weight": np.eye(2)}, model).value
    assert loss == pytest.approx(1.25, rel=1e-15)
