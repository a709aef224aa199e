"""Meta mode's routing model: how many tokens each expert gets when no real router runs.

Balanced (`--moe-routing-imbalance 0`, the default): the T·k (token, expert) pairs spread as
evenly as integers allow, as NVIDIA's published MoE benchmarks force it. Imbalanced (simsp's own
model, docs/moe.md): expert loads follow a Zipf law, expert of popularity rank i (0 the most
popular) getting a share ∝ (i + 1)^-α of the pairs, the popularity order a permutation of the
experts drawn from (seed, layer); counts are the largest-remainder rounding of T·k·share, each
at most T (a token picks an expert once; the excess goes to the next most popular). The same
expected loads hold on every rank and micro-batch: the hot experts of a layer stay hot. Then
the capacity (blocks/moe/router.py get_capacity) cuts or pads each expert's rows.
"""

import numpy as np

from simsp.model.blocks.moe.router import MoeSpec, get_capacity, moe_spec


def zipf_shares(E: int, alpha: float, seed: int, layer: int) -> np.ndarray:
    """(E,) shares summing to 1: (i + 1)^-α by popularity rank, over a seeded expert order."""
    weights = (np.arange(E) + 1.0) ** -alpha  # (E,) by popularity rank
    order = np.random.default_rng([seed, layer, 7919]).permutation(E)  # rank -> expert
    shares = np.empty(E)
    shares[order] = weights / weights.sum()
    return shares


def _round_capped(total: int, shares: np.ndarray, cap: int) -> np.ndarray:
    """Integers summing to `total`, largest remainder, none above `cap` (excess to the next
    largest shares)."""
    counts = np.zeros(len(shares), dtype=np.int64)
    open_ = np.ones(len(shares), dtype=bool)
    left = total
    while left > 0:
        share = np.where(open_, shares, 0.0)
        raw = left * share / share.sum()  # (E,)
        add = np.floor(raw).astype(np.int64)
        remainder = left - int(add.sum())
        for e in np.argsort(-(raw - add), kind="stable")[:remainder]:
            add[e] += 1
        counts += add
        over = np.maximum(counts - cap, 0)
        counts -= over
        left = int(over.sum())
        open_ &= counts < cap
    return counts


def routed_counts(T: int, spec: MoeSpec, alpha: float, seed: int, layer: int) -> np.ndarray:
    """(E,) tokens routed to each expert before capacity."""
    E, pairs = spec.num_experts, T * spec.topk
    if alpha == 0:
        return np.full(E, pairs // E) + (np.arange(E) < pairs % E)
    return _round_capped(pairs, zipf_shares(E, alpha, seed, layer), T)


def kept_counts(routed: np.ndarray, T: int, spec: MoeSpec) -> np.ndarray:
    """(E,) rows each expert computes after the capacity: cut to C, or padded to it."""
    if spec.capacity_factor is None:
        return routed
    capacity = get_capacity(T * spec.topk, spec.num_experts, spec.capacity_factor)
    if capacity > T:
        return np.full_like(routed, T) if spec.pad_to_capacity else routed
    return np.full_like(routed, capacity) if spec.pad_to_capacity else np.minimum(routed, capacity)


def model_counts(r, spec, T: int) -> tuple[np.ndarray, np.ndarray]:
    """Meta mode: the routing model's pairs routed to each expert (E,) and its rows (E,)
    after the capacity, for this layer (spec: its LayerSpec) on rank r."""
    m = spec.model
    routed = routed_counts(T, moe_spec(m), m.moe_routing_imbalance, r.seed, spec.layer)
    return routed, kept_counts(routed, T, moe_spec(m))


def uniform_routing(sc) -> bool:
    """Meta mode routes every expert of every layer the same rows (balanced, T·k a multiple of
    E, the capacity cutting or padding all alike): every EP member then sends every other the
    same, and one member stands for its group."""
    m, p = sc.model, sc.parallel
    if m.num_experts is None or m.moe_routing_imbalance > 0:
        return False
    coeff = 0.0
    spec = MoeSpec(m.num_experts, m.moe_router_topk, m.moe_router_score_function, coeff,
                     m.moe_expert_capacity_factor, m.moe_pad_expert_input_to_capacity, m.swiglu)
    T = m.seq_length // p.cp // (p.tp if p.sequence_parallel else 1) * p.micro_batch_size
    counts = kept_counts(routed_counts(T, spec, 0.0, 0, 0), T, spec)
    return len(set(counts.tolist())) == 1
