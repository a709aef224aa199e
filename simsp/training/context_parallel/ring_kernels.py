"""Ring attention (context parallelism, --cp-comm-type p2p) in numeric mode.

Transformer Engine's AttnFuncWithCPAndKVP2P (NVIDIA/TransformerEngine
transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py): every CP rank
keeps its query chunks; at step i rank r holds the K/V of rank (r - i) mod cp, computes that
block's attention while sending it on to rank r + 1, and merges the block's output into its own
with the online softmax (out, logsumexp) correction. The backward walks the ring the other way,
each rank adding its dK/dV of the block it holds to that block's dK/dV buffer, which travels one
step behind the K/V and ends on the block's owner. Causal masking is per (query, key) pair of global positions,
so any split (the 2cp load-balanced one or plain) is exact.
"""

import math
from typing import NamedTuple

import numpy as np

from simsp.model.blocks.attention.heads import expand_kv, reduce_kv


class CpShard(NamedTuple):
    """One CP rank's tensors: q (b, a, n, d); k, v (b, G, n, d); pos (n,) global positions."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    pos: np.ndarray


def source_rank(cp_rank: int, step: int, cp: int) -> int:
    """Whose K/V block rank `cp_rank` holds at ring `step` (sent on from rank - 1 each step)."""
    return (cp_rank - step) % cp


def _visible(q_pos, k_pos):
    """Causal mask (n_q, n_k): query at position p sees keys at positions <= p."""
    return k_pos[None, :] <= q_pos[:, None]


def block_forward(q, k, v, q_pos, k_pos, keep=None, p: float = 0.0):
    """Softmax attention of q (b, a, nq, d) on one K/V block (b, G, nk, d), causal by position,
    the probabilities dropped where the keep-mask `keep` (b, a, nq, nk) is False (rate p,
    scaled by 1/(1 - p); the logsumexp is the undropped one, as FlashAttention's).
    Returns the block output (b, a, nq, d) and its logsumexp (b, a, nq), -inf where no key is seen."""
    group = q.shape[1] // k.shape[1]
    kx, vx = expand_kv(k, group), expand_kv(v, group)  # (b, a, nk, d)
    visible = _visible(q_pos, k_pos)  # (nq, nk)
    scores = np.where(visible, (q @ kx.swapaxes(-1, -2)) / math.sqrt(q.shape[-1]), -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)  # (b, a, nq, 1)
    safe_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.exp(scores - safe_max)  # (b, a, nq, nk)
    row_sum = e.sum(axis=-1, keepdims=True)  # (b, a, nq, 1)
    seen = row_sum > 0
    weights = e if keep is None else e * keep / (1.0 - p)  # (b, a, nq, nk)
    out = np.where(seen, (weights @ vx) / np.where(seen, row_sum, 1.0), 0.0)  # (b, a, nq, d)
    with np.errstate(divide="ignore"):
        lse = (safe_max + np.log(row_sum))[..., 0]  # (b, a, nq)
    return out, lse


def merge_block(out, lse, block_out, block_lse):
    """Online-softmax merge of a block's (output, logsumexp) into the running pair
    (Milakov & Gimelshein 2018, arXiv:1805.02867; TE flash_attn_fwd_out_correction)."""
    new_lse = np.logaddexp(lse, block_lse)  # (b, a, nq)
    finite = np.isfinite(new_lse)
    base = np.where(finite, new_lse, 0.0)
    old_w = np.where(finite, np.exp(lse - base), 0.0)[..., None]  # (b, a, nq, 1)
    new_w = np.where(finite, np.exp(block_lse - base), 0.0)[..., None]
    return out * old_w + block_out * new_w, new_lse


def ring_forward(shards: list) -> list:
    """Every CP rank's (out (b, a, n, d), lse (b, a, n)) after cp ring steps of K/V."""
    cp = len(shards)
    held = [(s.k, s.v, s.pos) for s in shards]  # the K/V block each rank holds at this step
    state = [(np.zeros_like(s.q), np.full(s.q.shape[:-1], -np.inf)) for s in shards]
    for step in range(cp):
        for r, shard in enumerate(shards):
            k, v, k_pos = held[r]
            block = block_forward(shard.q, k, v, shard.pos, k_pos)
            state[r] = merge_block(*state[r], *block)
        if step < cp - 1:
            held = [held[(r - 1) % cp] for r in range(cp)]  # p2p: rank r sends to r + 1
    return state


def block_backward(dout, q, k, v, q_pos, k_pos, lse, delta, keep=None, p: float = 0.0):
    """dq (b, a, nq, d) and dk, dv (b, G, nk, d) of one block, probabilities recomputed from the
    final logsumexp; delta (b, a, nq, 1) = rowsum(dout * out) (Dao et al. 2022, Alg. 2), which
    stays right under dropout (keep (b, a, nq, nk), rate p) since out holds the dropped weights."""
    group = q.shape[1] // k.shape[1]
    kx, vx = expand_kv(k, group), expand_kv(v, group)  # (b, a, nk, d)
    scale = 1.0 / math.sqrt(q.shape[-1])
    visible = _visible(q_pos, k_pos)  # (nq, nk)
    scores = (q @ kx.swapaxes(-1, -2)) * scale  # (b, a, nq, nk)
    probs = np.where(visible, np.exp(scores - lse[..., None]), 0.0)  # (b, a, nq, nk)
    dropped = probs if keep is None else probs * keep / (1.0 - p)  # (b, a, nq, nk)
    dvx = dropped.swapaxes(-1, -2) @ dout  # (b, a, nk, d)
    dprobs = dout @ vx.swapaxes(-1, -2)  # (b, a, nq, nk): at the dropped probabilities
    if keep is not None:
        dprobs = dprobs * keep / (1.0 - p)
    dscores = probs * (dprobs - delta) * scale  # (b, a, nq, nk)
    dq = dscores @ kx  # (b, a, nq, d)
    dkx = dscores.swapaxes(-1, -2) @ q  # (b, a, nk, d)
    return dq, reduce_kv(dkx, group), reduce_kv(dvx, group)


def ring_backward(shards: list, douts: list, outs: list, lses: list) -> list:
    """Every CP rank's (dq, dk, dv), TE's backward ring: it runs the other way (rank r sends to
    r - 1) from the block the forward ended on (rank r + 1's); a block's dK/dV buffer follows
    it one step behind, each rank adding its share, and is complete on the block's owner after
    the last step (cp - 1 K/V and cp - 1 dK/dV transfers)."""
    cp = len(shards)
    deltas = [(do * o).sum(axis=-1, keepdims=True) for do, o in zip(douts, outs)]  # (b,a,n,1)
    dqs = [np.zeros_like(s.q) for s in shards]
    held = [(s.k, s.v, s.pos) for s in (shards[(r + 1) % cp] for r in range(cp))]
    dkv = [None] * cp  # the dK/dV buffer rank r accumulates this step
    for step in range(cp):
        received = [dkv[(r + 1) % cp] for r in range(cp)]  # from rank r + 1, one step behind
        for r, shard in enumerate(shards):
            k, v, k_pos = held[r]
            dq, dk_b, dv_b = block_backward(douts[r], shard.q, k, v, shard.pos, k_pos,
                                            lses[r], deltas[r])
            dqs[r] += dq
            dkv[r] = (dk_b, dv_b) if step == 0 else (received[r][0] + dk_b,
                                                    received[r][1] + dv_b)
        if step < cp - 1:
            held = [held[(r + 1) % cp] for r in range(cp)]  # K/V: rank r + 1 sends to r
    return [(dqs[r], *dkv[r]) for r in range(cp)]
