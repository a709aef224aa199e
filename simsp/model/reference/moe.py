"""The mixture-of-experts MLP, written apart from the simulated MoE (Megatron-LM
megatron/core/transformer/moe/: router.py TopKRouter, moe_utils.py, experts.py,
shared_experts.py; Fedus et al. 2021, Switch Transformers, for the load-balancing loss).

Dense formulation: every expert's MLP runs on every token and the output is
y_t = Σ_e w[t, e] · expert_e(x_t) + shared(x_t), with w the routing weight, zero off the
token's kept top-k experts. That is the same sum as Megatron's permute -> experts ->
unpermute without any of its bookkeeping (the reference has no permutation to get wrong).
- Router: logits x W_r (h, E). Softmax scores: top-k of the logits, softmax over those k;
  sigmoid: σ of the top-k, normalised by their sum + 1e-20 when k > 1
  (moe_utils.py topk_routing_with_score_function). Ties (measure zero) go to the lower index.
- Capacity (moe_utils.py get_capacity, apply_router_token_dropping, drop policy "probs"):
  C = ceil(T·k/E · capacity factor); when C <= T each expert keeps the C tokens of largest
  routing weight. Padding to capacity adds rows of weight 0: nothing changes numerically.
- Aux loss (switch_load_balancing_loss_func on compute_routing_scores_for_aux_loss):
  E·coeff/(k·T²) · Σ_e (Σ_t score[t, e]) · tokens_e over the T tokens of a micro-batch, the
  scores softmax over all E (or σ normalised over all E), tokens_e how many tokens have e in
  the top-k of those scores (a count: no gradient).
"""

import math

import numpy as np

from simsp.model.reference import autodiff as ad
from simsp.model.reference import textbook as tb

SCORE_EPS = 1e-20  # moe_utils.py: scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """(T, k) indices of the k largest scores of each row (ties to the lower index)."""
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def routing_weights(logits, model):
    """w (T, E): the routing probability of each token's top-k experts, 0 elsewhere."""
    T, E = logits.shape
    k = model.moe_router_topk
    rows = np.arange(T)[:, None]  # (T, 1)
    top = _top_k(logits.value, k)  # (T, k): σ and softmax keep the logits' order
    picked = logits[rows, top]  # (T, k)
    if model.moe_router_score_function == "softmax":
        probs = tb.softmax(picked)
    else:
        sig = tb.sigmoid(picked)
        probs = sig / (sig.sum(axis=-1, keepdims=True) + SCORE_EPS) if k > 1 else sig
    one_hot = (top[:, :, None] == np.arange(E)).astype(logits.dtype)  # (T, k, E)
    return (probs.reshape(T, k, 1) * one_hot).sum(axis=1)  # (T, E)


def capacity_mask(weights: np.ndarray, model) -> np.ndarray | None:
    """(T, E) bool: the pairs each expert's capacity keeps; None when nothing is dropped."""
    factor = model.moe_expert_capacity_factor
    T, E = weights.shape
    if factor is None:
        return None
    capacity = math.ceil(T * model.moe_router_topk / E * factor)
    if capacity > T:
        return None
    keep = np.zeros((T, E), dtype=bool)
    best = np.argsort(-weights, axis=0, kind="stable")[:capacity]  # (C, E)
    keep[best, np.arange(E)] = True
    return keep


def _expert_mlp(x, fc1, fc2, swiglu: bool):
    """One bias-free expert (or the shared experts): x (T, h) -> (T, h); fc1 (h, f) or
    SwiGLU (h, 2, f) [gate, up], fc2 (f, h)."""
    if swiglu:
        return tb.swiglu(x @ fc1[:, 0], x @ fc1[:, 1]) @ fc2
    return tb.gelu_tanh(x @ fc1) @ fc2


def routed_experts(x, P: dict, model):
    """The routed experts' output (T, h) of tokens x (T, h), routed and dropped among x."""
    weights = routing_weights(x @ P["mlp.router.weight"], model)  # (T, E)
    keep = capacity_mask(weights.value, model)
    if keep is not None:
        weights = weights * keep.astype(x.dtype)
    fc1, fc2 = P["mlp.experts.fc1.weight"], P["mlp.experts.fc2.weight"]
    out = None
    for e in range(model.num_experts):
        term = weights[:, e:e + 1] * _expert_mlp(x, fc1[e], fc2[e], model.swiglu)  # (T, h)
        out = term if out is None else out + term
    return out


def shared_experts(x, P: dict, model):
    """The shared experts (no gate): x (T, h) -> (T, h)."""
    return _expert_mlp(x, P["mlp.shared_experts.fc1.weight"],
                       P["mlp.shared_experts.fc2.weight"], model.swiglu)


def aux_loss(x, P: dict, model):
    """The switch load-balancing loss of one micro-batch's tokens x (T, h) (a scalar Var)."""
    T, E, k = x.shape[0], model.num_experts, model.moe_router_topk
    logits = x @ P["mlp.router.weight"]  # (T, E)
    if model.moe_router_score_function == "softmax":
        scores = tb.softmax(logits)
    else:
        sig = tb.sigmoid(logits)
        scores = sig / (sig.sum(axis=-1, keepdims=True) + SCORE_EPS)
    chosen = np.zeros((T, E), dtype=bool)
    chosen[np.arange(T)[:, None], _top_k(scores.value, k)] = True
    tokens_per_expert = chosen.sum(axis=0).astype(x.dtype)  # (E,)
    coeff = E * model.moe_aux_loss_coeff / (k * T * T)
    return (scores.sum(axis=0) * tokens_per_expert).sum() * coeff


def aux_enabled(model) -> bool:
    """Whether the layer adds Megatron's aux loss (load balancing type aux_loss, coeff > 0)."""
    return model.moe_router_load_balancing_type == "aux_loss" and model.moe_aux_loss_coeff > 0


def _row_sets(s: int, chunks) -> list:
    """The row sets routed on their own: `chunks` equal slices of s, or the given lists."""
    if isinstance(chunks, int):
        return [np.arange(k * s // chunks, (k + 1) * s // chunks) for k in range(chunks)]
    return [np.asarray(rows) for rows in chunks]


def moe_mlp(P: dict, y, model, group: int, chunks):
    """The MoE MLP on y (s, B, h): each micro-batch of `group` samples routed per row set of
    `chunks` (the ranks that route their own tokens: s/t slices under sequence parallelism, a
    (tp, cp) rank's positions under context parallelism). Returns the output (s, B, h) and
    the micro-batches' aux losses, each weighted group/B (Megatron's MoEAuxLossAutoScaler
    scale 1/(micro-batches · DP)), summed (None without aux loss)."""
    s, B, h = y.shape
    blocks, aux = [], None
    for start in range(0, B, group):
        block = y[:, start:start + group]  # (s, b, h)
        b = block.shape[1]
        if aux_enabled(model):
            term = aux_loss(block.reshape(s * b, h), P, model) * (b / B)
            aux = term if aux is None else aux + term
        rows = _row_sets(s, chunks)
        pieces = []
        for idx in rows:
            tokens = block[idx].reshape(len(idx) * b, h)  # (n·b, h)
            out = routed_experts(tokens, P, model)
            if "mlp.shared_experts.fc2.weight" in P:
                out = out + shared_experts(tokens, P, model)
            pieces.append(out.reshape(len(idx), b, h))
        order = np.argsort(np.concatenate(rows), kind="stable")  # back to sequence order
        blocks.append(ad.concatenate(pieces, axis=0)[order])  # (s, b, h)
    return ad.concatenate(blocks, axis=1), aux
