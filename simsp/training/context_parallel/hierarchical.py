"""Hierarchical context-parallel attention (--cp-comm-type a2a+p2p): all-to-all inside, ring across.

Megatron-LM's --hierarchical-context-parallel-sizes A P (megatron/core/parallel_state.py
create_hierarchical_groups, level 0 first) cuts each CP group (cp = A·P ranks, in CP-rank order)
into P a2a groups of A consecutive CP ranks and A p2p groups of P ranks A apart; CP rank
j = R·A + i is rank i of a2a group R and rank R of p2p group i. Transformer Engine's
AttnFuncWithCPAndKVP2P with a list of two groups (NVIDIA/TransformerEngine
transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py; Megatron passes
them from megatron/core/extensions/transformer_engine.py TEDotProductAttention) runs:

- forward: an all-to-all of q, k, v over the a2a group (training/context_parallel/a2a.py): each rank's a/t
  heads of its s/cp tokens become a/(t·A) heads of the group's A·s/cp tokens, put in sequence
  order (get_seq_chunk_ids_for_reordering_before_attn). Under Megatron's 2·cp split the group's
  tokens are exactly chunks R and 2P−1−R of a 2·P split, so the p2p ring over the P groups
  (training/context_parallel/ring.py, CpAttention) is the load-balanced ring at cp = P on that head group;
  its output (TE's out_part) goes back through a second all-to-all;
- backward: dout through the all-to-all, the ring backward, dQ/dK/dV back through a third.

Kept for backward, as TE's ctx.save_for_backward: the ring's last K/V block (p2p's cp_kv_saved)
and the head-split output (a2a's cp_out_heads), one ledger entry `cp_hcp_saved` between forward
and backward so the layer's stash can hold (or free) it as one tensor; the layer's own q, k, v
and logsumexp stand for the post-a2a q and softmax_lse (the same bytes).
"""

import numpy as np

from simsp.model.context_split import local_positions
from simsp.model.tensor import FP16, Tensor
from simsp.training.context_parallel.ulysses_kernels import heads_to_seq, seq_to_heads
from simsp.training.context_parallel.attention import CpAttention, CpUlysses


def hierarchical_groups(members: tuple, a2a_size: int) -> tuple[list, list]:
    """A CP group's (a2a groups, p2p groups), as create_hierarchical_groups forms them from
    the CP ranks: A consecutive ranks, then the ranks A apart."""
    a2a = [members[i:i + a2a_size] for i in range(0, len(members), a2a_size)]
    p2p = [members[i::a2a_size] for i in range(a2a_size)]
    return a2a, p2p


def _with_layout(shape: tuple, data) -> Tensor:
    """A view of a head group's tensor handed to the ring (held in the ledger elsewhere)."""
    view = Tensor(shape, FP16)
    view.data = data
    return view


class CpHierarchical(CpAttention):
    """One rank's a2a+p2p attention: its a2a group's all-to-alls (a CpUlysses on that group)
    around the ring of its p2p group (a CpAttention on that group, at positions of the 2·P
    split: the a2a group's tokens)."""

    saved_name = "cp_hcp_saved"

    def __init__(self, env, network, rings: dict, members: tuple, index: int, seq_length: int,
                 a2a_size: int):
        super().__init__(env, network, rings, members, index, seq_length)
        outer, inner = divmod(index, a2a_size)
        a2a_groups, p2p_groups = hierarchical_groups(members, a2a_size)
        self.a2a = CpUlysses(env, network, rings, a2a_groups[outer], inner, seq_length)
        self.ring = CpAttention(env, network, rings, p2p_groups[inner], outer, seq_length)
        ring_positions = self.ring.positions  # (A·s/cp,) ascending: the a2a group's tokens
        self.relative = [np.searchsorted(ring_positions, local_positions(
            seq_length, self.size, outer * a2a_size + j)) for j in range(a2a_size)]  # (s/cp,)
        self.kept_bytes = 0  # the last forward's cp_hcp_saved entry

    def _head_keep(self, keep, group: int):
        """The dropout drawer of this rank's head group: the TP rank's heads from
        index·group on."""
        if keep is None:
            return None
        first = self.a2a.index * group
        return lambda q_pos, k_pos, head, count: keep(q_pos, k_pos, first + head, count)

    def _to_heads(self, pieces, component: int):
        """The a2a group's pieces of one tensor -> this rank's head group, (b, ./A, A·n, d)."""
        return seq_to_heads(pieces[component], self.relative)[self.a2a.index]

    def forward(self, r, q: Tensor, k: Tensor, v: Tensor, out_name: str, lse_name: str,
                keep=None, p: float = 0.0):
        """q (b, a/t, n, d), k, v (b, G/t, n, d) -> output (n, b, a/t·d) and the head group's
        fp32 logsumexp (b, a/(t·A), A·n), TE's post-a2a softmax_lse (the same bytes)."""
        b, heads, n, d = q.shape
        size, groups = self.a2a.size, k.shape[1]
        group, tokens = heads // size, n * size
        shared = self.a2a._a2a(r, r.phase, q.nbytes + k.nbytes + v.nbytes, q.nbytes)
        received = r.alloc((q.numel + k.numel + v.numel,), FP16, "cp_a2a_qkv")
        pieces = yield from self.a2a._exchange(r, shared, "qkv", (q.data, k.data, v.data)
                                               if r.numeric else None)
        qh, kh, vh = ((self._to_heads(pieces, c) for c in range(3)) if pieces is not None
                      else (None, None, None))
        qh, kh, vh = (_with_layout((b, width, tokens, d), data)
                      for width, data in ((group, qh), (groups // size, kh),
                                          (groups // size, vh)))
        out_h, lse = yield from self.ring.forward(r, qh, kh, vh, "cp_out_heads", lse_name,
                                                  self._head_keep(keep, group), p)
        r.free(received)
        out = r.alloc((n, b, heads * d), FP16, out_name)
        heads_out = None
        if r.numeric:
            heads_out = out_h.data.reshape(tokens, b, group, d).transpose(1, 2, 0, 3)
        back = yield from self.a2a._exchange(r, shared, "out", (heads_out,)
                                             if r.numeric else None)
        self.a2a._finished(r, r.phase)
        if back is not None:
            mine = heads_to_seq(back[0], self.relative)[self.a2a.index]  # (b, a/t, n, d)
            out.data = mine.transpose(2, 0, 1, 3).reshape(n, b, heads * d)
            self.held[r.scope] = (qh, kh, vh, out_h)
        self._keep_for_backward(r, out_h, self._kv_kept(k, v))
        return out, lse

    def _kv_kept(self, k: Tensor, v: Tensor) -> int:
        """Bytes of the ring's kept K/V block: the local K/V's (the head group's A·n tokens of
        G/(t·A) heads), none with a ring of one."""
        return k.nbytes + v.nbytes if self.ring.size > 1 else 0

    def _keep_for_backward(self, r, out_h: Tensor, kv_bytes: int) -> None:
        """The ring's kept K/V block and the head-split output become one activations entry."""
        if kv_bytes:
            r.ledger.free(r.key(CpAttention.saved_name), "cp_hcp", self.env.now)
        self.kept_bytes = out_h.nbytes + kv_bytes
        r.ledger.alloc(r.key(self.saved_name), self.kept_bytes, "activations", "cp_hcp",
                       self.env.now)
        r.free(out_h)

    def saved(self, r, k: Tensor, v: Tensor) -> Tensor:
        """The kept K/V block and head-split output (entered by the forward just run), one
        handle the layer's stash can free."""
        handle = Tensor((self.kept_bytes // FP16,), FP16)
        handle.key = r.key(self.saved_name)
        return handle

    def backward(self, r, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                 lse: Tensor, keep=None, p: float = 0.0):
        """dout (n, b, a/t·d) -> dq (b, a/t, n, d), dk, dv (b, G/t, n, d): dout through the
        all-to-all, the ring backward on the head group, dQ/dK/dV back."""
        b, heads, n, d = q.shape
        size, groups = self.a2a.size, k.shape[1]
        group, tokens = heads // size, n * size
        out_h = self._split_kept(r, (tokens, b, group * d), self._kv_kept(k, v))
        shared = self.a2a._a2a(r, "backward", q.nbytes + k.nbytes + v.nbytes, q.nbytes)
        to_heads = lambda x: x.reshape(n, b, heads, d).transpose(1, 2, 0, 3)  # (b, a/t, n, d)
        douts = yield from self.a2a._exchange(r, shared, "dout", (to_heads(dout.data),)
                                              if r.numeric else None)
        dout_h = r.alloc((tokens, b, group * d), FP16, "cp_a2a_dout")
        qh = _with_layout((b, group, tokens, d), None)
        kh = vh = _with_layout((b, groups // size, tokens, d), None)
        if douts is not None:
            qh, kh, vh, kept_out = self.held.pop(r.scope)
            out_h.data = kept_out.data
            mine = self._to_heads(douts, 0)  # (b, a/(t·A), A·n, d)
            dout_h.data = mine.transpose(2, 0, 1, 3).reshape(tokens, b, group * d)
        dqh, dkh, dvh = yield from self.ring.backward(r, dout_h, qh, kh, vh, out_h, lse,
                                                      self._head_keep(keep, group), p)
        r.free(dout_h, out_h)
        dq = r.alloc(q.shape, FP16, "d_q")
        dk = r.alloc(k.shape, FP16, "d_k")
        dv = r.alloc(v.shape, FP16, "d_v")
        arrays = (dqh.data, dkh.data, dvh.data) if r.numeric else None
        back = yield from self.a2a._exchange(r, shared, "dqkv", arrays)
        r.free(dqh, dkh, dvh)
        self.a2a._finished(r, "backward")
        if back is not None:
            dq.data, dk.data, dv.data = (heads_to_seq(parts, self.relative)[self.a2a.index]
                                         for parts in back)
        return dq, dk, dv

    def _split_kept(self, r, shape: tuple, kv_bytes: int) -> Tensor:
        """Back to the ring's kept K/V block (its backward frees it) and the head-split output
        `shape` (A·n, b, a/(t·A)·d), which this backward frees."""
        r.ledger.free(r.key(self.saved_name), "cp_hcp", self.env.now)
        if kv_bytes:
            r.ledger.alloc(r.key(CpAttention.saved_name), kv_bytes, "activations", "cp_ring",
                           self.env.now)
        return r.alloc(shape, FP16, "cp_out_heads", "activations")
