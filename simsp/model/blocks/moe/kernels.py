"""A mixture-of-experts MLP as plain numpy forward/backward (Megatron-LM megatron/core/transformer/moe/).

Router (router.py TopKRouter: gating, routing), top-k with a softmax or sigmoid score
(moe_utils.py topk_routing_with_score_function), capacity and token dropping
(moe_utils.py get_capacity, apply_router_token_dropping, drop policy "probs"), the Switch
load-balancing loss (moe_utils.py switch_load_balancing_loss_func on the scores of
compute_routing_scores_for_aux_loss), permute / unpermute in expert-major, token-ascending
order (moe_utils.py permute, unpermute: probabilities applied at unpermute) and per-expert MLPs
without bias (experts.py SequentialMLP: fc1, GeLU or SwiGLU, fc2). Tokens are the rows of
x (T, h), T = s·b. docs/moe.md has the formulas; ties in top-k go to the lower index.
"""

from dataclasses import dataclass
import math

import numpy as np

from simsp.model import kernels

SCORE_EPS = 1e-20  # moe_utils.py: scores / (scores.sum(-1) + 1e-20)


@dataclass(frozen=True)
class MoeSpec:
    """Megatron-LM's MoE flags as one layer's routing needs them."""

    num_experts: int  # --num-experts
    topk: int  # --moe-router-topk
    score_function: str = "softmax"  # --moe-router-score-function
    aux_loss_coeff: float = 0.0  # --moe-aux-loss-coeff (load balancing type aux_loss)
    capacity_factor: float | None = None  # --moe-expert-capacity-factor; None is dropless
    pad_to_capacity: bool = False  # --moe-pad-expert-input-to-capacity
    swiglu: bool = False  # expert activation: SwiGLU (fc1 is h -> 2f) or GeLU


def get_capacity(num_tokens: int, num_experts: int, capacity_factor: float) -> int:
    """ceil(num_tokens / num_experts · capacity_factor) (moe_utils.py get_capacity)."""
    return math.ceil(num_tokens / num_experts * capacity_factor)


def _topk_indices(scores, k: int):
    """(T, k) indices of the k largest scores per row, ties to the lower index."""
    order = np.argsort(-scores, axis=1, kind="stable")  # (T, E)
    return order[:, :k]


def _normalize(s):
    """s / (Σ s + 1e-20) over the last axis."""
    return s / (s.sum(axis=-1, keepdims=True) + SCORE_EPS)


def _normalize_backward(dn, s):
    """d s of n = s / (Σ s + eps)."""
    total = s.sum(axis=-1, keepdims=True) + SCORE_EPS  # (..., 1)
    return dn / total - (dn * s).sum(axis=-1, keepdims=True) / total ** 2


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _softmax_backward(dp, p):
    return p * (dp - (dp * p).sum(axis=-1, keepdims=True))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def topk_routing(logits, spec: MoeSpec):
    """logits (T, E) -> routing probs (T, E) (zero off the top-k), top-k indices (T, k).
    softmax: softmax over the k largest logits; sigmoid: σ of the k largest, normalised when k > 1."""
    top = _topk_indices(logits, spec.topk)  # (T, k)
    picked = np.take_along_axis(logits, top, axis=1)  # (T, k)
    if spec.score_function == "softmax":
        probs_k = _softmax(picked)
    else:
        s = _sigmoid(picked)
        probs_k = _normalize(s) if spec.topk > 1 else s
    probs = np.zeros_like(logits)  # (T, E)
    np.put_along_axis(probs, top, probs_k, axis=1)
    return probs, top


def topk_routing_backward(dprobs, logits, top, spec: MoeSpec):
    """d logits (T, E) from d routing probs (T, E) (read only at the top-k entries)."""
    picked = np.take_along_axis(logits, top, axis=1)  # (T, k)
    dk = np.take_along_axis(dprobs, top, axis=1)  # (T, k)
    if spec.score_function == "softmax":
        dpicked = _softmax_backward(dk, _softmax(picked))
    else:
        s = _sigmoid(picked)
        ds = _normalize_backward(dk, s) if spec.topk > 1 else dk
        dpicked = ds * s * (1.0 - s)
    dlogits = np.zeros_like(logits)  # (T, E)
    np.put_along_axis(dlogits, top, dpicked, axis=1)
    return dlogits


def capacity_map(probs, top, spec: MoeSpec):
    """The (T, E) bool map of token-expert pairs computed: the top-k map, cut to each expert's
    `capacity` most probable tokens (or, padded, exactly those `capacity` tokens)."""
    T, E = probs.shape
    routed = np.zeros((T, E), dtype=bool)
    np.put_along_axis(routed, top, True, axis=1)
    if spec.capacity_factor is None:
        return routed
    capacity = get_capacity(T * spec.topk, E, spec.capacity_factor)
    if capacity > T:
        kept = np.ones((T, E), dtype=bool)
    else:
        order = np.argsort(-probs, axis=0, kind="stable")[:capacity]  # (C, E)
        kept = np.zeros((T, E), dtype=bool)
        np.put_along_axis(kept, order, True, axis=0)
    return kept if spec.pad_to_capacity else routed & kept


def aux_scores(logits, spec: MoeSpec):
    """Scores of every expert for the aux loss: softmax, or σ normalised over all experts."""
    if spec.score_function == "softmax":
        return _softmax(logits)
    return _normalize(_sigmoid(logits))


def aux_tokens(logits, spec: MoeSpec):
    """tokens_e (E,): how many tokens have e in the top-k of the aux scores."""
    T, E = logits.shape
    chosen = np.zeros((T, E), dtype=bool)
    np.put_along_axis(chosen, _topk_indices(aux_scores(logits, spec), spec.topk), True, axis=1)
    return chosen.sum(axis=0).astype(logits.dtype)  # (E,)


def aux_loss(logits, spec: MoeSpec, tokens_per_expert=None, total_tokens: int | None = None):
    """Switch loss E·coeff/(k·T²) · Σ_e (Σ_t score[t,e]) · tokens_e, tokens_e from the top-k of
    the scores. Under sequence parallelism a rank passes the whole sequence's tokens_e (E,) and
    T (get_tokens_per_expert_and_token_count): its share of the whole loss.
    Returns (loss, d loss / d scores (T, E), scores (T, E))."""
    E = logits.shape[1]
    T = total_tokens or logits.shape[0]
    scores = aux_scores(logits, spec)  # (T_local, E)
    if tokens_per_expert is None:
        tokens_per_expert = aux_tokens(logits, spec)  # (E,)
    scale = E * spec.aux_loss_coeff / (spec.topk * T * T)
    loss = scale * float((scores.sum(axis=0) * tokens_per_expert).sum())
    dscores = np.broadcast_to(scale * tokens_per_expert, scores.shape)  # (T_local, E)
    return loss, dscores, scores


def aux_loss_backward(dscores, scores, logits, spec: MoeSpec):
    """d logits (T, E) of the aux loss."""
    if spec.score_function == "softmax":
        return _softmax_backward(dscores, scores)
    s = _sigmoid(logits)
    return _normalize_backward(dscores, s) * s * (1.0 - s)


def permute(x, kept):
    """Rows of x (T, h) each kept (token, expert) pair sends, expert-major, tokens ascending
    (moe_utils.py permute). Returns permuted (N, h), token index (N,), tokens per expert (E,)."""
    experts_of_pairs, tokens_of_pairs = np.nonzero(kept.T)  # (N,) each, expert-major
    counts = np.bincount(experts_of_pairs, minlength=kept.shape[1])  # (E,)
    return x[tokens_of_pairs], tokens_of_pairs, counts


def _splits(counts):
    ends = np.cumsum(counts)
    return [(int(e - c), int(e)) for c, e in zip(counts, ends)]


def experts_forward(xp, fc1, fc2, counts, swiglu: bool):
    """Each expert's MLP on its rows of xp (N, h): fc1 (E, h, f|2f), fc2 (E, f, h).
    Returns out (N, h) and the activation inputs (N, f|2f) and outputs (N, f)."""
    act = kernels.swiglu_forward if swiglu else kernels.gelu_forward
    h1 = np.concatenate([xp[a:b] @ fc1[e] for e, (a, b) in enumerate(_splits(counts))])
    g = act(h1)  # (N, f)
    out = np.concatenate([g[a:b] @ fc2[e] for e, (a, b) in enumerate(_splits(counts))])
    return out, h1, g


def experts_backward(dout, xp, h1, g, fc1, fc2, counts, swiglu: bool):
    """d xp (N, h), d fc1 (E, h, ·), d fc2 (E, f, h) of experts_forward."""
    back = kernels.swiglu_backward if swiglu else kernels.gelu_backward
    dfc1, dfc2 = np.zeros_like(fc1), np.zeros_like(fc2)
    dxp = np.zeros_like(xp)  # (N, h)
    for e, (a, b) in enumerate(_splits(counts)):
        dg = dout[a:b] @ fc2[e].T  # (n_e, f)
        dfc2[e] = g[a:b].T @ dout[a:b]
        dh1 = back(dg, h1[a:b])  # (n_e, f|2f)
        dfc1[e] = xp[a:b].T @ dh1
        dxp[a:b] = dh1 @ fc1[e].T
    return dxp, dfc1, dfc2


def route(x, router, spec: MoeSpec) -> dict:
    """Gating, top-k, capacity and permutation of x (T, h) with router (h, E): the routing
    cache (logits, probs, top, kept, the permuted rows xp (N, h) with their tokens and experts
    (N,) expert-major, counts (E,)) and the aux loss with its score gradient."""
    logits = x @ router  # (T, E)
    probs, top = topk_routing(logits, spec)  # (T, E), (T, k)
    kept = capacity_map(probs, top, spec)  # (T, E)
    xp, tokens, counts = permute(x, kept)  # (N, h), (N,), (E,)
    experts = np.nonzero(kept.T)[0]  # (N,) expert of each permuted row
    loss, dscores, scores = (aux_loss(logits, spec) if spec.aux_loss_coeff > 0
                             else (0.0, None, None))
    return dict(x=x, logits=logits, probs=probs, top=top, kept=kept, xp=xp, tokens=tokens,
                experts=experts, counts=counts, aux=loss, dscores=dscores, scores=scores)


def unpermute(out, c: dict):
    """y (T, h) = Σ over kept pairs of p[t, e] · out row (moe_utils.py unpermute)."""
    weight = c["probs"][c["tokens"], c["experts"]][:, None]  # (N, 1): zero for padding rows
    y = np.zeros((c["probs"].shape[0], out.shape[1]), dtype=out.dtype)  # (T, h)
    np.add.at(y, c["tokens"], weight * out)
    return y


def unpermute_backward(dy, out, c: dict):
    """d out rows (N, h) and d probs (T, E) of unpermute, given dy (T, h)."""
    tokens, experts = c["tokens"], c["experts"]
    weight = c["probs"][tokens, experts][:, None]  # (N, 1)
    dprobs = np.zeros_like(c["probs"])  # (T, E)
    dprobs[tokens, experts] = (dy[tokens] * out).sum(axis=1)
    return weight * dy[tokens], dprobs


def route_backward(dxp, dprobs, c: dict, router, spec: MoeSpec, daux: float = 1.0):
    """dx (T, h) and d router (h, E) from the permuted rows' gradient dxp (N, h), the probs'
    dprobs (T, E) and daux · aux loss."""
    dx = np.zeros_like(c["x"])  # (T, h)
    np.add.at(dx, c["tokens"], dxp)
    return router_backward(dx, dprobs, c, router, spec, daux)


def router_backward(dx, dprobs, c: dict, router, spec: MoeSpec, daux: float = 1.0):
    """dx (T, h) plus the router's share, and d router (h, E), from dprobs (T, E) and daux ·
    aux loss; dx (T, h) holds the experts' gradient at the tokens already."""
    dlogits = topk_routing_backward(dprobs, c["logits"], c["top"], spec)  # (T, E)
    if spec.aux_loss_coeff > 0:
        dlogits = dlogits + daux * aux_loss_backward(c["dscores"], c["scores"], c["logits"], spec)
    dx += dlogits @ router.T
    return dx, c["x"].T @ dlogits


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
    dxp, dfc1, dfc2 = experts_backward(dout, c["xp"], c["h1"], c["g"], w["fc1"], w["fc2"],
                                       c["counts"], spec.swiglu)
    dx, drouter = route_backward(dxp, dprobs, c, w["router"], spec, daux)
    return dx, {"router": drouter, "fc1": dfc1, "fc2": dfc2}


def shared_forward(x, fc1, fc2, swiglu: bool):
    """The shared experts (shared_experts.py SharedExpertMLP, no gate, no bias): x (T, h) ->
    (out (T, h), activation input (T, f_s | 2f_s), fc2 input (T, f_s)); fc1 (h, f_s | 2f_s)."""
    act = kernels.swiglu_forward if swiglu else kernels.gelu_forward
    h1 = x @ fc1  # (T, f_s | 2f_s)
    g = act(h1)  # (T, f_s)
    return g @ fc2, h1, g


def shared_backward(dy, x, h1, g, fc1, fc2, swiglu: bool):
    """dx (T, h), d fc1, d fc2 of shared_forward."""
    back = kernels.swiglu_backward if swiglu else kernels.gelu_backward
    dh1 = back(dy @ fc2.T, h1)  # (T, f_s | 2f_s)
    return dh1 @ fc1.T, x.T @ dh1, g.T @ dy
