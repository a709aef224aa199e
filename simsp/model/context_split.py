"""Context parallelism's sequence split: 2*cp chunks, rank r holding chunks r and 2cp-1-r.

Causal attention gives later query rows more keys; Megatron-LM's get_batch_on_this_cp_rank
(megatron/core/utils.py) cuts the sequence into 2*cp chunks and gives CP rank r the chunks r and
2*cp-1-r so every rank does the same causal work. Positions (for RoPE) are the chunks' global
positions, so each rank rotates its tokens by where they sit in the whole sequence.
"""

import numpy as np


def chunk_ids(cp: int, cp_rank: int, load_balanced: bool = True) -> tuple[int, ...]:
    """The sequence chunks CP rank `cp_rank` holds: (r, 2cp-1-r) of 2cp, or (r,) of cp unbalanced."""
    if not 0 <= cp_rank < cp:
        raise ValueError(f"cp rank {cp_rank} outside [0, {cp})")
    return (cp_rank, 2 * cp - 1 - cp_rank) if load_balanced else (cp_rank,)


def chunk_count(cp: int, load_balanced: bool = True) -> int:
    """How many equal chunks the sequence is cut into: 2cp balanced, cp plain."""
    return 2 * cp if load_balanced else cp


def local_positions(s: int, cp: int, cp_rank: int, load_balanced: bool = True) -> np.ndarray:
    """Global token positions (s/cp,) held by `cp_rank`, in the order it stores them."""
    n = chunk_count(cp, load_balanced)
    if s % n:
        raise ValueError(f"sequence length {s} is not a multiple of {n} chunks")
    size = s // n
    return np.concatenate([np.arange(c * size, (c + 1) * size)
                           for c in chunk_ids(cp, cp_rank, load_balanced)])  # (s/cp,)


def split_sequence(x: np.ndarray, cp: int, cp_rank: int, load_balanced: bool = True,
                   axis: int = -2) -> np.ndarray:
    """`cp_rank`'s share of x along the sequence `axis` (get_batch_on_this_cp_rank)."""
    s = x.shape[axis]
    return np.take(x, local_positions(s, cp, cp_rank, load_balanced), axis=axis)


def gather_sequence(parts: list, load_balanced: bool = True, axis: int = -2) -> np.ndarray:
    """Inverse of split_sequence: the CP ranks' shares (in cp-rank order) back in sequence order."""
    cp = len(parts)
    s = parts[0].shape[axis] * cp
    order = np.concatenate([local_positions(s, cp, r, load_balanced) for r in range(cp)])
    stacked = np.concatenate(parts, axis=axis)
    return np.take(stacked, np.argsort(order), axis=axis)


def visible_pairs(s: int, cp: int, cp_rank: int, step: int, load_balanced: bool = True) -> int:
    """Causal (query, key) pairs rank `cp_rank` computes at ring step `step` (the K/V of rank
    cp_rank - step), counted from the positions: the work of that step's block attention."""
    q_pos = local_positions(s, cp, cp_rank, load_balanced)  # (s/cp,)
    k_pos = local_positions(s, cp, (cp_rank - step) % cp, load_balanced)  # (s/cp,)
    return int((k_pos[None, :] <= q_pos[:, None]).sum())


def balanced_step_pairs(s: int, cp: int, step: int) -> int:
    """Closed form of visible_pairs under the 2cp split (chunk c = s/2cp), the same on every
    rank: the diagonal step sees two causal chunk triangles and one full chunk pair,
    c(c + 1) + c²; every other step one full half block, 2c² (TE's three causal cases)."""
    c = s // (2 * cp)
    return c * (c + 1) + c * c if step == 0 else 2 * c * c
