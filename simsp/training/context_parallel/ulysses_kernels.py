"""Ulysses attention (context parallelism, --cp-comm-type a2a) in numeric mode.

Transformer Engine's AttnFuncWithCPAndQKVOA2A (NVIDIA/TransformerEngine
transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py; DeepSpeed-Ulysses,
Jacobs et al. 2023, arXiv:2309.14509): an all-to-all turns each rank's (all heads, s/cp tokens)
into (heads/cp, all s tokens) — the received pieces put back in sequence order
(reorder_seq_chunks_for_a2a_before_attn) — then plain causal attention runs on the whole sequence
for its head group, and a second all-to-all returns the output to the sequence split. The
backward does the same with dout in and dQ/dK/dV out. Query and KV head counts must divide by cp.
"""

import numpy as np

from simsp.model.context_split import local_positions
from simsp.training.context_parallel.ring_kernels import block_backward, block_forward


def seq_to_heads(parts: list, positions: list) -> list:
    """All-to-all: rank r's (b, H, n, d) (tokens at positions[r]) -> rank j's head group j of
    every rank's tokens, in sequence order, (b, H/cp, s, d)."""
    cp = len(parts)
    order = np.argsort(np.concatenate(positions))  # (s,) received order -> sequence order
    heads = parts[0].shape[1] // cp
    return [np.concatenate([p[:, j * heads:(j + 1) * heads] for p in parts], axis=2)[:, :, order]
            for j in range(cp)]


def heads_to_seq(parts: list, positions: list) -> list:
    """Inverse all-to-all: rank j's (b, H/cp, s, d) -> rank r's (b, H, n, d) at positions[r]."""
    return [np.concatenate([p[:, :, pos] for p in parts], axis=1) for pos in positions]


def ulysses_forward(shards: list) -> tuple:
    """CpShard per rank -> (out per rank (b, a, n, d), the head groups' (q, k, v, out, lse))."""
    positions = [s.pos for s in shards]
    s = sum(len(p) for p in positions)
    full = np.arange(s)  # (s,) every head group sees the whole sequence in order
    qs, ks, vs = (seq_to_heads([getattr(sh, name) for sh in shards], positions)
                  for name in ("q", "k", "v"))
    saved = []
    for q, k, v in zip(qs, ks, vs):
        out, lse = block_forward(q, k, v, full, full)
        saved.append((q, k, v, out, lse))
    return heads_to_seq([o for *_, o, _ in saved], positions), saved


def ulysses_backward(shards: list, douts: list, saved: list) -> list:
    """Every rank's (dq (b, a, n, d), dk, dv (b, G, n, d)) through the two all-to-alls."""
    positions = [s.pos for s in shards]
    full = np.arange(sum(len(p) for p in positions))
    grads = []
    for dout, (q, k, v, out, lse) in zip(seq_to_heads(douts, positions), saved):
        delta = (dout * out).sum(axis=-1, keepdims=True)  # (b, a/cp, s, 1)
        grads.append(block_backward(dout, q, k, v, full, full, lse, delta))
    back = [heads_to_seq([g[i] for g in grads], positions) for i in range(3)]
    return [(back[0][r], back[1][r], back[2][r]) for r in range(len(shards))]


def shard_positions(s: int, cp: int, load_balanced: bool = True) -> list:
    """Each CP rank's global positions under the split (the input layout Ulysses starts from)."""
    return [local_positions(s, cp, r, load_balanced) for r in range(cp)]
