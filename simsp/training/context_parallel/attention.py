"""Context-parallel attention inside a layer, run by the CP group's rank programs together.

A layer's FlashAttention core becomes Transformer Engine's context-parallel attention
(NVIDIA/TransformerEngine transformer_engine/pytorch/attention/dot_product_attention/
context_parallel.py) by --cp-comm-type: p2p, AttnFuncWithCPAndKVP2P (CpAttention): every CP rank
keeps its query chunks (Megatron-LM's 2·cp load-balanced split, megatron/core/utils.py
get_batch_on_this_cp_rank) and the K/V blocks go round the ring step by step while each rank
computes the block it holds (training/context_parallel/ring.py schedules it on the links,
training/context_parallel/ring_kernels.py gives the numbers); a2a, AttnFuncWithCPAndQKVOA2A (CpUlysses); allgather,
AttnFuncWithCPAndKVAllGather (CpAllGather, allgather.py). One shared instance serves one layer's forward,
recompute or backward of one micro-batch on one CP group; the group's ranks meet in it through
`rings`, shared by the world. Each implements the model's declared interface
ContextParallelAttention (model/blocks/attention/core.py), which the model calls as `r.cp`.
"""

import numpy as np

from simsp.hardware.attention_kernels import AttentionShape
from simsp.model.blocks.attention.core import ContextParallelAttention
from simsp.model.blocks.attention.flash import fused_core
from simsp.model.context_split import local_positions
from simsp.training.context_parallel.ring_kernels import CpShard, block_backward, block_forward
from simsp.model.tensor import FP16, FP32, Tensor
from simsp.training.context_parallel.ulysses_kernels import heads_to_seq, seq_to_heads
from simsp.training.context_parallel.a2a import CpAllToAll
from simsp.training.context_parallel.ring import CpRing, block_gemm, diagonal_step, exchange_bytes
from simsp.training.context_parallel.ring_numeric import RankRingNumbers, RingMailbox
from simsp.training.context_parallel.ring_pass import RingPass
from simsp.training.context_parallel.step_clock import call_seconds as call_charges
from simsp.training.context_parallel.step_clock import charged_apart, run_step
from simsp.training.context_parallel import te_p2p_kernels as te_kernels

FORWARD_GEMMS = ("scores", "context")  # a block's batched GEMMs, as ops.flash_attention
BACKWARD_GEMMS = ("d_v", "d_probs", "d_q", "d_k")  # after the recomputed scores


def _kernel_share(names: tuple) -> tuple:
    """(backward?, share of the fused kernel) of a call's GEMM names: the forward whole; the
    backward kernel's 5 equal GEMMs (d_qk = d_v) split 1 recomputed + 4."""
    if names == FORWARD_GEMMS:
        return False, 1.0
    return True, len(names) / (len(BACKWARD_GEMMS) + 1)


class SharedRing:
    """One ring (CpRing) or all-to-all (CpAllToAll) met by every rank of a CP group, with its
    numeric mailbox."""

    def __init__(self, ring: CpRing):
        self.ring, self.mailbox, self.done = ring, RingMailbox(), 0


class CpAttention(ContextParallelAttention):
    """One rank's context-parallel attention: its CP group, its tokens' global positions."""

    def __init__(self, env, network, rings: dict, members: tuple, index: int, seq_length: int):
        self.env, self.network, self.rings = env, network, rings
        self.members, self.index, self.size = members, index, len(members)
        self.positions = local_positions(seq_length, self.size, index)  # (s/cp,)
        self.held = {}  # ledger scope -> the K/V block the forward ended on (numeric)
        self.steps = {}  # a ring step's kernels -> what they charge (step_clock.run_step)
        self.lone = None  # context_parallel/lone_ring.py LoneRing, where the plan allows it
        # a CP leader's group, its own Rank first, and the run's slices
        # (context_parallel/shadows.py); None on every other rank
        self.shadows = self.slices = None

    @staticmethod
    def _keep(keep, heads: int, first: int = 0):
        """keep(q_pos, k_pos) -> the (b, heads, nq, nk) dropout keep-mask of heads first..
        (None without dropout); `keep` is the attention core's cp_attention_keep drawer."""
        if keep is None:
            return None
        return lambda q_pos, k_pos: keep(q_pos, k_pos, first, heads)

    def _all_positions(self) -> list:
        """Every CP rank's global positions, (s/cp,) each, in cp-rank order."""
        s = len(self.positions) * self.size
        return [local_positions(s, self.size, j) for j in range(self.size)]

    def _ring(self, r, phase: str, kv_bytes: int) -> SharedRing:
        """The group's ring for this layer scope and phase, made by whichever rank comes first."""
        key = (self.members, r.scope, phase)
        shared = self.rings.get(key)
        if shared is None:
            ring = CpRing(self.env, self.network, self.members, kv_bytes, {}, prefix=r.scope,
                          lone=self.lone)
            if self.lone is not None and not r.numeric and charged_apart(r):  # ring_pass.py
                ring.arith = RingPass(ring, steps=False)
            shared = self.rings[key] = SharedRing(ring)
        shared.ring.ledgers[self.index] = r.ledger
        return shared

    def _finished(self, r, phase: str) -> None:
        """Drop the ring once every rank of the group has run its side."""
        key = (self.members, r.scope, phase)
        shared = self.rings[key]
        shared.done += 1
        shared.done += self.size - 1 if self.shadows is not None else 0  # theirs with it
        if shared.done == self.size:
            del self.rings[key]
            shared.ring.arith = None  # its RingPass points back at it: freed now, not by the GC

    def _kernels(self, r, kernels: list):
        """TE's memory-bound bookkeeping kernels (te_p2p_kernels), one after the other; none
        on a group of one (TE runs no context-parallel attention there)."""
        for name, nbytes in kernels if self.size > 1 else []:
            yield from r.compute(name, "elementwise", nbytes=nbytes)

    def _bookkeeping(self, r, kernels: list):
        """_kernels before or after the ring (forward's output merge: cp kernels), under one
        timeout as a ring step's (step_clock.run_step)."""
        yield from run_step(r, lambda rank: self._kernels(rank, kernels), self.steps,
                            ("kernels", tuple(kernels), r.phase))

    def _group_bookkeeping(self, r, kernels_of, key: tuple):
        """_bookkeeping of `kernels_of(cp index)`; on a CP leader for its whole group, each
        slice's clock then its rank's (context_parallel/shadows.py; `key`: what the kernels
        depend on beside the rank and phase)."""
        if self.shadows is None:
            yield from self._bookkeeping(r, kernels_of(self.index))
            return
        start = self.slices.clocks.now  # (c,)
        yield from self._bookkeeping(r, kernels_of(0))
        self.slices.land(self.slices.kernels_end(start, self.shadows, kernels_of,
                                                 key + (r.phase,)))

    def _group_blocks(self, r, q, phase: str, after_of, after_bytes: tuple):
        """_blocks with `after_of(cp index)`'s kernels; on a CP leader its call_seconds gives
        the whole group's charges, each rank's own (ring_pass.py GroupCharges)."""
        run = self._blocks(r, q, phase, after_of(self.index), after_bytes)
        if self.shadows is None:
            return run
        own, shapes = run.call_seconds, (q.shape, phase, r.phase, False, after_bytes)

        def shadow(j: int, rank):  # its bookkeeping kernels per step, and its step kernels
            rank.phase = r.phase
            after = after_of(j)
            return after, rank.cp._blocks(rank, q, phase, after, after_bytes).kernels

        def call_seconds(ring_phase: str):
            return self.slices.group_charges(self.shadows, (shapes, ring_phase),
                                             own(ring_phase), shadow)
        run.call_seconds = call_seconds
        return run

    def _blocks(self, r, q, phase: str, after=None, after_bytes: tuple = ()):
        """The step's block attention on r's compute stream: TE's causal slices
        (training/context_parallel/ring.py block_gemm; the whole block at diagonal_step: forward's first,
        backward's last), 2 GEMMs forward, 1 recomputed + 4 backward; then `after(step)`'s
        bookkeeping kernels (TE's per-step merges, te_p2p_kernels) of tensors of `after_bytes`."""
        b, heads, n, d = q.shape
        shapes = (q.shape, phase, r.phase, after is None, after_bytes)  # and the step: its charges

        def run(ring_phase: str, step: int):  # the step's kernels under one timeout (step_clock)
            yield from run_step(r, lambda rank: kernels(rank, ring_phase, step), self.steps,
                                (shapes, ring_phase, step))

        def call_seconds(ring_phase: str):  # the whole call charged at once, for ring_pass.py
            return call_charges(r, lambda rank, step: kernels(rank, ring_phase, step), self.size,
                                self.steps, (shapes, ring_phase))

        def kernels(r, ring_phase: str, step: int):
            yield from block(r, ring_phase, step)
            if after is not None:
                yield from self._kernels(r, after(step))

        def block(r, ring_phase: str, step: int):
            diagonal = step == diagonal_step(ring_phase, self.size)
            m, k, cols = block_gemm(n, d, diagonal)
            flops = 2 * b * heads * m * k * cols
            if r.attention is not None:  # the fused kernel: causal diagonal, whole half blocks
                backward = ring_phase == "backward"
                names = (("recompute_scores",) + BACKWARD_GEMMS if backward else FORWARD_GEMMS)
                shape = AttentionShape(b, heads, heads, n, n if diagonal else n // 2, d, d,
                                       diagonal)
                yield from fused_core(r, shape, {f"cp_{x}_{step}": flops for x in names},
                                      backward)
                return
            if ring_phase == "backward":
                saved, r.phase = r.phase, "recompute"
                yield from r.compute(f"cp_recompute_scores_{step}", "gemm", flops,
                                     gemm=(m, k, cols))
                r.phase = saved
            for name in BACKWARD_GEMMS if ring_phase == "backward" else FORWARD_GEMMS:
                yield from r.compute(f"cp_{name}_{step}", "gemm", flops, gemm=(m, k, cols))
        run.call_seconds, run.kernels = call_seconds, kernels
        return run

    def forward(self, r, q: Tensor, k: Tensor, v: Tensor, out_name: str, lse_name: str,
                keep=None, p: float = 0.0):
        """Ring attention forward: q (b, a/t, n, d), k, v (b, G/t, n, d) with n = s/cp ->
        output (n, b, a/t·d) and the fp32 logsumexp (b, a/t, n), as ops.flash_attention."""
        b, heads, n, d = q.shape
        out = r.alloc((n, b, heads * d), FP16, out_name)
        lse = r.alloc((b, heads, n), FP32, lse_name)
        phase = r.phase
        shared = self._ring(r, phase, k.nbytes + v.nbytes)
        numbers = None
        if r.numeric:
            shard = CpShard(q.data, k.data, v.data, self.positions)
            numbers = RankRingNumbers(self.index, self.size, shard, shared.mailbox)
            numbers.keep, numbers.p = self._keep(keep, q.shape[1]), p
        flops = dict(r.flops) if self.shadows is not None else None
        yield from self._group_bookkeeping(
            r, lambda j: te_kernels.forward_prologue(k.nbytes + v.nbytes),
            ("forward_prologue", k.nbytes + v.nbytes))
        after = lambda j: lambda step: te_kernels.forward_step(step, j, lse.nbytes)
        yield from shared.ring.forward(self.index, self._group_blocks(
            r, q, phase, after, (lse.nbytes,)), numbers)
        yield from self._group_bookkeeping(
            r, lambda j: te_kernels.forward_epilogue(self.size, j, out.nbytes),
            ("forward_epilogue", out.nbytes))
        if flops is not None:
            self.slices.count_cp_flops(r.rank, flops, r.flops)
        self._count_exposed(r, shared.ring, "forward")
        r.count_comm("cp_ring", (self.size - 1) * shared.ring.kv_bytes)  # K/V, steps 0..cp-2
        self._finished(r, phase)
        if numbers is not None:
            out.data = numbers.out.transpose(2, 0, 1, 3).reshape(n, b, heads * d)
            lse.data = numbers.lse
            self.held[r.scope] = numbers.held
        return out, lse

    saved_name = "cp_kv_saved"  # what the layer's stash calls the tensor kept for backward

    def saved(self, r, k: Tensor, v: Tensor) -> Tensor:
        """The K/V block the forward ended on (rank + 1's), which the ring keeps in the ledger
        for backward: a handle the layer's stash can free."""
        saved = Tensor((2,) + k.shape, FP16)
        saved.key = r.key(self.saved_name)
        return saved

    def backward(self, r, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                 lse: Tensor, keep=None, p: float = 0.0):
        """Ring attention backward: dout, out (n, b, a/t·d) -> dq (b, a/t, n, d), dk, dv
        (b, G/t, n, d); dK/dV come back round the ring to their owner."""
        dq = r.alloc(q.shape, FP16, "d_q")
        dk = r.alloc(k.shape, FP16, "d_k")
        dv = r.alloc(v.shape, FP16, "d_v")
        shared = self._ring(r, "backward", k.nbytes + v.nbytes)
        numbers = None
        if r.numeric:
            b, heads, n, d = q.shape
            to_heads = lambda x: x.reshape(n, b, heads, d).transpose(1, 2, 0, 3)  # (b,a,n,d)
            numbers = RankRingNumbers(self.index, self.size,
                                      CpShard(q.data, k.data, v.data, self.positions),
                                      shared.mailbox)
            numbers.held = self.held.pop(r.scope)
            numbers.keep, numbers.p = self._keep(keep, q.shape[1]), p
            numbers.out, numbers.lse = to_heads(out.data), lse.data
            numbers.start_backward(to_heads(dout.data))
        flops = dict(r.flops) if self.shadows is not None else None
        yield from self._group_bookkeeping(
            r, lambda j: te_kernels.backward_prologue(k.nbytes + v.nbytes),
            ("backward_prologue", k.nbytes + v.nbytes))
        grads = lambda j: lambda step: te_kernels.backward_step(step, self.size, j, q.nbytes,
                                                                k.nbytes, v.nbytes)
        yield from shared.ring.backward(self.index, self._group_blocks(
            r, q, "backward", grads, (q.nbytes, k.nbytes, v.nbytes)), numbers)
        if flops is not None:
            self.slices.count_cp_flops(r.rank, flops, r.flops)
        self._count_exposed(r, shared.ring, "backward")
        r.count_comm("cp_ring", sum(exchange_bytes("backward", step, self.size,
                                                   shared.ring.kv_bytes)
                                    for step in range(self.size)))
        self._finished(r, "backward")
        if numbers is not None:
            dq.data, (dk.data, dv.data) = numbers.dq, numbers.dkv
        return dq, dk, dv

    def _count_exposed(self, r, ring: CpRing, phase: str) -> None:
        """The time this rank's side of the ring blocked on its K/V or dK/dV exchanges is
        exposed context-parallel communication."""
        r.count_exposed("cp_comm", ring.timeline.waited.get((phase, self.index), 0.0))


class CpUlysses(CpAttention):
    """One rank's Ulysses attention (--cp-comm-type a2a; Transformer Engine's
    AttnFuncWithCPAndQKVOA2A, same file; DeepSpeed-Ulysses, Jacobs et al. 2023): an all-to-all
    turns each rank's (a/t heads, s/cp tokens) q, k, v into (a/(t·cp) heads, all s tokens)
    (training/context_parallel/ulysses_kernels.py seq_to_heads), FlashAttention runs on the whole sequence for
    that head group, and a second all-to-all returns the output to the sequence split; the
    backward sends dout the same way and dQ/dK/dV back (training/context_parallel/a2a.py times the pieces).
    TE keeps the head-split q, k, v, output and logsumexp for backward: the layer's own q, k, v
    and logsumexp stand for the first (the same bytes), and the head-split output is kept
    beside proj_input as `cp_out_heads`."""

    saved_name = "cp_out_heads"

    def _a2a(self, r, phase: str, qkv_bytes: int, out_bytes: int) -> SharedRing:
        """The group's all-to-alls for this layer scope and phase (made by the first rank)."""
        key = (self.members, r.scope, phase)
        shared = self.rings.get(key)
        if shared is None:
            a2a = CpAllToAll(self.env, self.network, self.members, qkv_bytes, out_bytes)
            shared = self.rings[key] = SharedRing(a2a)
            shared.sent = {}  # (tensor, cp rank) -> the arrays that rank posted (numeric)
        return shared

    def _exchange(self, r, shared, tensor: str, arrays):
        """Post this rank's `tensor` all-to-all and wait for it; the wait is exposed."""
        if arrays is not None:
            shared.sent[(tensor, self.index)] = arrays
        nbytes = shared.ring.nbytes[tensor]
        r.count_comm("cp_all_to_all", nbytes - nbytes // self.size)  # 1/cp to each peer
        start = self.env.now
        yield shared.ring.exchange(tensor, self.index)
        r.count_exposed("cp_comm", self.env.now - start)
        if arrays is None:
            return None
        return [[shared.sent[(tensor, j)][c] for j in range(self.size)]
                for c in range(len(arrays))]  # [component][cp rank]

    def _flash(self, r, b: int, heads: int, s: int, d: int, names: tuple):
        """FlashAttention's GEMMs on the head group's whole sequence (as ops.flash_attention),
        or the fused kernel of that causal shape where the GPU has its figures."""
        if r.attention is not None:
            parts = {f"cp_a2a_{name}": 2 * b * heads * s * s * d for name in names}
            yield from fused_core(r, AttentionShape(b, heads, heads, s, s, d, d, True), parts,
                                  *_kernel_share(names))
            return
        for name in names:
            yield from r.compute(f"cp_a2a_{name}", "gemm", 2 * b * heads * s * s * d,
                                 gemm=(s, d, s))

    def forward(self, r, q: Tensor, k: Tensor, v: Tensor, out_name: str, lse_name: str,
                keep=None, p: float = 0.0):
        """q (b, a/t, n, d), k, v (b, G/t, n, d) -> output (n, b, a/t·d), logsumexp (b, a/t, n)."""
        b, heads, n, d = q.shape
        s, group = n * self.size, heads // self.size
        shared = self._a2a(r, r.phase, q.nbytes + k.nbytes + v.nbytes, q.nbytes)
        received = r.alloc((q.numel + k.numel + v.numel,), FP16, "cp_a2a_qkv")
        pieces = yield from self._exchange(r, shared, "qkv", (q.data, k.data, v.data)
                                           if r.numeric else None)
        heads_out = r.alloc((b, group, s, d), FP16, self.saved_name)  # (b, a/(t·cp), s, d)
        yield from self._flash(r, b, group, s, d, FORWARD_GEMMS)
        r.free(received)
        state = None
        if pieces is not None:
            qh, kh, vh = (seq_to_heads(parts, self._all_positions())[self.index]
                          for parts in pieces)  # (b, ./cp, s, d) each
            full = np.arange(s)  # (s,)
            mask = self._mask(keep, group, full)  # (b, a/(t·cp), s, s) or None
            o, lse_h = block_forward(qh, kh, vh, full, full, mask, p)
            heads_out.data, state = o, (qh, kh, vh, o, lse_h)
        out = r.alloc((n, b, heads * d), FP16, out_name)
        lse = r.alloc((b, heads, n), FP32, lse_name)
        back = yield from self._exchange(r, shared, "out", (heads_out.data,)
                                         if r.numeric else None)
        self._finished(r, r.phase)
        self.pending = heads_out
        if back is not None:
            o = heads_to_seq(back[0], self._all_positions())[self.index]  # (b, a/t, n, d)
            out.data = o.transpose(2, 0, 1, 3).reshape(n, b, heads * d)
            self.held[r.scope] = state
        return out, lse

    def _mask(self, keep, group: int, full):
        """The head group's dropout keep-mask (b, a/(t·cp), s, s) over the whole sequence."""
        drawer = self._keep(keep, group, self.index * group)
        return None if drawer is None else drawer(full, full)

    def saved(self, r, k: Tensor, v: Tensor) -> Tensor:
        """The head-split output TE keeps for backward (allocated by forward)."""
        return self.pending

    def backward(self, r, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                 lse: Tensor, keep=None, p: float = 0.0):
        """dout (n, b, a/t·d) -> dq (b, a/t, n, d), dk, dv (b, G/t, n, d) via two all-to-alls."""
        b, heads, n, d = q.shape
        s, group = n * self.size, heads // self.size
        shared = self._a2a(r, "backward", q.nbytes + k.nbytes + v.nbytes, q.nbytes)
        to_heads = lambda x: x.reshape(n, b, heads, d).transpose(1, 2, 0, 3)  # (b, a/t, n, d)
        douts = yield from self._exchange(r, shared, "dout", (to_heads(dout.data),)
                                          if r.numeric else None)
        received = r.alloc((b, group, s, d), FP16, "cp_a2a_dout")
        grads = r.alloc((q.numel + k.numel + v.numel,), FP16, "cp_a2a_dqkv")
        phase, r.phase = r.phase, "recompute"
        yield from self._flash(r, b, group, s, d, ("recompute_scores",))
        r.phase = phase
        yield from self._flash(r, b, group, s, d, BACKWARD_GEMMS)
        r.free(received)
        r.ledger.free(r.key(self.saved_name), "cp_a2a", self.env.now)
        arrays = None
        if douts is not None:
            qh, kh, vh, o, lse_h = self.held.pop(r.scope)
            dout_h = seq_to_heads(douts[0], self._all_positions())[self.index]
            delta = (dout_h * o).sum(axis=-1, keepdims=True)  # (b, a/(t·cp), s, 1)
            full = np.arange(s)  # (s,)
            arrays = block_backward(dout_h, qh, kh, vh, full, full, lse_h, delta,
                                    self._mask(keep, group, full), p)
        dq = r.alloc(q.shape, FP16, "d_q")
        dk = r.alloc(k.shape, FP16, "d_k")
        dv = r.alloc(v.shape, FP16, "d_v")
        back = yield from self._exchange(r, shared, "dqkv", arrays)
        r.free(grads)
        self._finished(r, "backward")
        if back is not None:
            dq.data, dk.data, dv.data = (heads_to_seq(parts, self._all_positions())[self.index]
                                         for parts in back)
        return dq, dk, dv
