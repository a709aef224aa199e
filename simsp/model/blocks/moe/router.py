"""The MoE router (Megatron-LM megatron/core/transformer/moe/router.py TopKRouter: gating,
routing) as plain numpy forward/backward, and its ops on a rank.

Top-k with a softmax or sigmoid score (moe_utils.py topk_routing_with_score_function), capacity
and token dropping (moe_utils.py get_capacity, apply_router_token_dropping, drop policy
"probs"), the Switch load-balancing loss (moe_utils.py switch_load_balancing_loss_func on the
scores of compute_routing_scores_for_aux_loss), permute / unpermute in expert-major,
token-ascending order (moe_utils.py permute, unpermute: probabilities applied at unpermute).
Tokens are the rows of x (T, h), T = s·b. docs/moe.md has the formulas; ties in top-k go to
the lower index. On a rank, numeric mode routes on the data; meta mode routes by the routing
model (blocks/moe/routing.py). Kept for backward: router_logits (T, E) fp32 and routing_map
(T, E) bool (the top-k is recomputed from the logits).
"""

from dataclasses import dataclass
import math

import numpy as np

from simsp.model import mappings
from simsp.model.tensor import FP16, FP32, Tensor

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
    """Softmax over the last axis."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _softmax_backward(dp, p):
    """d x of p = softmax(x) from d p."""
    return p * (dp - (dp * p).sum(axis=-1, keepdims=True))


def _sigmoid(x):
    """The logistic function."""
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


# ---------------------------------------------------------------------------------------------
# ops on a rank

ROUTER = "mlp.router.weight"  # (h, E), replicated over TP
AUX_TOKENS = "aux_tokens_per_expert"  # SP: the whole sequence's tokens_e (E,), ledger-less


@dataclass(frozen=True)
class Routed:
    """One MoE layer's routing on a rank: the numeric cache (None in meta), the rows kept per
    expert (E,), the (token, expert) pairs routed and kept, and the kept tensors."""

    cache: dict | None
    counts: np.ndarray  # (E,) rows each expert computes after the capacity
    pairs: int  # (token, expert) pairs routed: T·k
    real: int  # pairs kept (not dropped, not padding)
    logits: Tensor  # router_logits (T, E) fp32
    routing_map: Tensor  # routing_map (T, E) bool


def moe_spec(m) -> MoeSpec:
    """The model's routing flags (aux loss only with load balancing type aux_loss)."""
    coeff = m.moe_aux_loss_coeff if m.moe_router_load_balancing_type == "aux_loss" else 0.0
    return MoeSpec(m.num_experts, m.moe_router_topk, m.moe_router_score_function, coeff,
                   m.moe_expert_capacity_factor, m.moe_pad_expert_input_to_capacity, m.swiglu)


def aux_group(r) -> tuple:
    """Megatron's tp_cp group, over which router.py reduces tokens_per_expert: the TP group,
    with context parallelism every (tp, cp) rank of this rank's (dp, pp) (rank = tp + t·cp)."""
    if r.cp is None:
        return r.tp.members
    return tuple(member - r.tp.index + i for member in r.cp.members for i in range(r.tp.size))


def sequence_aux(r, mspec, c, E: int, T: int):
    """Sequence (and context) parallelism: tokens_e (E,) all-reduced over the tp_cp group and
    T·t·cp tokens (moe_utils.py get_tokens_per_expert_and_token_count): this rank's share of
    the whole sequence's aux loss. Returns the summed tokens_e (ledger-less, 8·E bytes)."""
    group = aux_group(r)
    summed = Tensor((E,), 8, aux_tokens(c["logits"], mspec) if r.numeric else None)
    yield from mappings.tensor_collective(r, "all_reduce", summed, summed.shape, summed.shape,
                                          "moe_aux_tokens", "all_reduce_moe_aux", group=group)
    if r.numeric:
        c["aux"], c["dscores"], c["scores"] = aux_loss(c["logits"], mspec, summed.data,
                                                       T * len(group))
    return summed


def router_grad(r, g: dict, dx_tokens, dx_route, shape: tuple, E: int):
    """The router's backward after the experts': d logits (T, E) and d x = d logits · Wᵀ on
    top of the tokens' gradient dx_tokens (T, h) (freed); `dx_route()` gives (numeric) the
    input gradient and the router weight's (h, E). Returns d x (s, b, h)."""
    s, b, h = shape
    T = s * b
    dx_data = None
    if r.numeric:
        dx2, drouter = dx_route()
        g[ROUTER].data += drouter
        dx_data = dx2.reshape(s, b, h)
    dlogits = r.alloc((T, E), FP32, "d_router_logits")
    yield from r.compute("d_router_logits", "elementwise", nbytes=8 * T * E)
    r.free(dx_tokens)
    dx = r.alloc((s, b, h), FP16, "d_router", data=dx_data)
    yield from r.compute("d_router", "gemm", 2 * 2 * T * h * E, gemm=(T, E, h))
    r.free(dlogits)
    return dx
