"""The MoE layer's numpy forward against a per-token loop oracle, and its backward against
central finite differences (float64)."""

import math

import numpy as np
import pytest

from simsp.model.blocks.mlp.activation import gelu_forward, swiglu_forward
from simsp.model.blocks.moe.experts import (expert_weight_grads, experts_forward,
                                            experts_input_grads)
from simsp.model.blocks.moe.router import (MoeSpec, get_capacity, route, route_backward, unpermute,
                                          unpermute_backward)

T, H, F, E = 12, 6, 5, 4


# The rank-side kernels composed into the whole routed MoE on one device: route, the experts'
# GEMMs, un-permute (and back), as the MoE layer chains them (model/blocks/moe/).
def moe_forward(x, w: dict, spec: MoeSpec):
    """x (T, h) -> y (T, h), aux loss, cache. w: router (h, E), fc1 (E, h, ·), fc2 (E, f, h)."""
    c = route(x, w["router"], spec)
    c["out"], c["h1"], c["g"] = experts_forward(c["xp"], w["fc1"], w["fc2"], c["counts"],
                                                spec.swiglu)  # (N, h), (N, ·), (N, f)
    return unpermute(c["out"], c), c["aux"], c


def moe_backward(dy, w: dict, c: dict, spec: MoeSpec, daux: float = 1.0):
    """dx (T, h) and grads {router, fc1, fc2} of y and daux · aux loss (MoEAuxLossAutoScaler
    hands the aux loss a gradient of 1 per layer)."""
    dout, dprobs = unpermute_backward(dy, c["out"], c)  # (N, h), (T, E)
    dxp, dh1 = experts_input_grads(dout, c["h1"], w["fc1"], w["fc2"], c["counts"], spec.swiglu)
    dfc1 = expert_weight_grads(c["xp"], dh1, c["counts"])  # B's and W's halves (the split
    dfc2 = expert_weight_grads(c["g"], dout, c["counts"])  # backward's W runs these later)
    dx, drouter = route_backward(dxp, dprobs, c, w["router"], spec, daux)
    return dx, {"router": drouter, "fc1": dfc1, "fc2": dfc2}


def _weights(rng, swiglu):
    width = 2 * F if swiglu else F
    return {"router": rng.normal(0, 0.8, (H, E)), "fc1": rng.normal(0, 0.4, (E, H, width)),
            "fc2": rng.normal(0, 0.4, (E, F, H))}


def _oracle(x, w, spec):
    """Every token through every expert, then a per-token gate built with Python's sorted()
    and per-expert capacity lists: y (T, h) and the aux loss."""
    act = swiglu_forward if spec.swiglu else gelu_forward
    logits = x @ w["router"]
    gates = np.zeros((T, E))
    for t in range(T):
        ranked = sorted(range(E), key=lambda e: (-logits[t, e], e))[:spec.topk]
        if spec.score_function == "softmax":
            z = [math.exp(logits[t, e]) for e in ranked]
            vals = [v / sum(z) for v in z]
        else:
            sig = [1 / (1 + math.exp(-logits[t, e])) for e in ranked]
            vals = [v / (sum(sig) + 1e-20) for v in sig] if spec.topk > 1 else sig
        for e, v in zip(ranked, vals):
            gates[t, e] = v
    computed = gates > 0
    if spec.capacity_factor is not None:
        cap = math.ceil(T * spec.topk / E * spec.capacity_factor)
        for e in range(E):
            best = sorted(range(T), key=lambda t: (-gates[t, e], t))[:cap]
            for t in range(T):
                if t not in best:
                    gates[t, e] = 0.0
    y = np.zeros_like(x)
    for t in range(T):
        for e in range(E):
            y[t] += gates[t, e] * (act(x[t] @ w["fc1"][e]) @ w["fc2"][e])
    if spec.aux_loss_coeff == 0:
        return y, 0.0, computed
    if spec.score_function == "softmax":
        scores = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    else:
        sig = 1 / (1 + np.exp(-logits))
        scores = sig / (sig.sum(1, keepdims=True) + 1e-20)
    counts = [sum(1 for t in range(T) if e in sorted(range(E), key=lambda j: (-scores[t, j], j))[:spec.topk])
              for e in range(E)]
    aux = sum(E * spec.aux_loss_coeff / (spec.topk * T * T) * scores[:, e].sum() * counts[e]
              for e in range(E))
    return y, aux, computed


SPECS = [
    MoeSpec(E, 1, "softmax", 0.01),
    MoeSpec(E, 2, "softmax", 0.01, swiglu=True),
    MoeSpec(E, 2, "sigmoid", 0.01),
    MoeSpec(E, 1, "sigmoid", 0.0, swiglu=True),
    MoeSpec(E, 2, "softmax", 0.01, capacity_factor=0.5),
    MoeSpec(E, 1, "sigmoid", 0.01, capacity_factor=0.75, pad_to_capacity=True),
]


@pytest.mark.parametrize("spec", SPECS)
def test_forward_matches_per_token_oracle(spec):
    rng = np.random.default_rng(7)
    x, w = rng.normal(size=(T, H)), _weights(rng, spec.swiglu)
    y, aux, cache = moe_forward(x, w, spec)
    y_ref, aux_ref, _ = _oracle(x, w, spec)
    assert np.max(np.abs(y - y_ref)) < 1e-13
    assert abs(aux - aux_ref) < 1e-15
    if spec.capacity_factor is not None:
        cap = get_capacity(T * spec.topk, E, spec.capacity_factor)
        assert cache["counts"].max() <= cap
        if spec.pad_to_capacity:
            assert list(cache["counts"]) == [cap] * E  # padded to exactly capacity
        else:
            assert cache["counts"].sum() < T * spec.topk  # some pairs dropped


@pytest.mark.parametrize("spec", SPECS)
def test_backward_matches_finite_differences(spec):
    rng = np.random.default_rng(11)
    x, w = rng.normal(size=(T, H)), _weights(rng, spec.swiglu)
    probe = rng.normal(size=(T, H))  # L = Σ probe·y + aux

    def loss(x_, w_):
        y, aux, _ = moe_forward(x_, w_, spec)
        return float((probe * y).sum()) + aux

    y, aux, cache = moe_forward(x, w, spec)
    dx, grads = moe_backward(probe, w, cache, spec)
    eps = 1e-6
    worst = 0.0
    for target, grad in [(x, dx)] + [(w[k], grads[k]) for k in ("router", "fc1", "fc2")]:
        flat, gflat = target.reshape(-1), grad.reshape(-1)
        for i in rng.choice(flat.size, size=min(12, flat.size), replace=False):
            keep = flat[i]
            flat[i] = keep + eps
            up = loss(x, w)
            flat[i] = keep - eps
            down = loss(x, w)
            flat[i] = keep
            worst = max(worst, abs((up - down) / (2 * eps) - gflat[i]))
    assert worst < 1e-7


def test_capacity():
    assert get_capacity(24, 4, 1.0) == 6 and get_capacity(25, 4, 1.0) == 7
