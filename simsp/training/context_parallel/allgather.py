"""All-gather context-parallel attention (--cp-comm-type allgather; docs/context-parallel.md):
K and V gathered over the CP group, each local query chunk attending to the keys up to its end."""

import numpy as np

from simsp.hardware.attention_kernels import AttentionShape
from simsp.model.blocks.attention.flash import fused_core
from simsp.model.mappings import tensor_collective
from simsp.model.tensor import FP16, FP32, Tensor
from simsp.training.context_parallel.attention import (BACKWARD_GEMMS, FORWARD_GEMMS, CpAttention,
                                                       _kernel_share)
from simsp.training.context_parallel.ring_kernels import block_backward, block_forward


class CpAllGather(CpAttention):
    """One rank's all-gather attention (--cp-comm-type allgather; Transformer Engine's
    AttnFuncWithCPAndKVAllGather, same file): K and V are all-gathered over the CP group (a ring
    all-gather on the links), each of the rank's two query chunks attends to the keys up to its
    own end, and the backward gathers K/V again, computes dQ and the whole sequence's partial
    dK/dV and reduce-scatters them back to their owners. Nothing beyond the layer's own q, k,
    v, output and logsumexp is kept for backward; the gathered K/V lives while it is used."""

    saved_name = None

    def saved(self, r, k: Tensor, v: Tensor) -> None:
        """Nothing kept beyond the layer's own tensors."""
        return None

    def _mask(self, keep, heads: int, keys):
        """The rank's queries' dropout keep-mask (b, a/t, n, s) against every key."""
        drawer = self._keep(keep, heads)
        return None if drawer is None else drawer(self.positions, keys)

    def _chunk_gemms(self, r, q: Tensor, names: tuple):
        """Each local query chunk's GEMMs against the keys up to its end: chunk id i of 2·cp
        (c tokens) sees (i + 1)·c keys (TE's per-chunk causal slices)."""
        b, heads, n, d = q.shape
        c = n // 2
        for chunk in (self.index, 2 * self.size - 1 - self.index):
            keys = (chunk + 1) * c
            if r.attention is not None:  # the fused kernel: c queries, causal over `keys`
                parts = {f"cp_ag_{name}_{chunk}": 2 * b * heads * c * d * keys for name in names}
                yield from fused_core(r, AttentionShape(b, heads, heads, c, keys, d, d, True),
                                      parts, *_kernel_share(names))
                continue
            for name in names:
                yield from r.compute(f"cp_ag_{name}_{chunk}", "gemm", 2 * b * heads * c * d * keys,
                                     gemm=(c, d, keys))

    def _gather_kv(self, r, k: Tensor, v: Tensor, tag: str):
        """All-gather K and V over the CP group -> the gathered buffer and, numeric, k, v
        (b, G/t, s, d) each in sequence order."""
        local = Tensor((2 * k.numel,), FP16)
        if r.numeric:
            local.data = np.concatenate([k.data.reshape(-1), v.data.reshape(-1)])
        full = (self.size * local.numel,)
        gathered = yield from tensor_collective(r, "all_gather", local, full, full,
                                                r.key(tag), label="cp_all_gather",
                                                group=self.members, track="cp_comm")
        if not r.numeric:
            return gathered, None, None
        b, groups, n, d = k.shape
        parts = gathered.data.reshape(self.size, 2, b, groups, n, d)
        order = np.argsort(np.concatenate(self._all_positions()))  # (s,)
        k_all, v_all = (np.concatenate(list(parts[:, j]), axis=2)[:, :, order] for j in (0, 1))
        return gathered, k_all, v_all

    def forward(self, r, q: Tensor, k: Tensor, v: Tensor, out_name: str, lse_name: str,
                keep=None, p: float = 0.0):
        """q (b, a/t, n, d), k, v (b, G/t, n, d) -> output (n, b, a/t·d), logsumexp (b, a/t, n)."""
        b, heads, n, d = q.shape
        gathered, k_all, v_all = yield from self._gather_kv(r, k, v, f"cp_kv_gather_{r.phase}")
        out = r.alloc((n, b, heads * d), FP16, out_name)
        lse = r.alloc((b, heads, n), FP32, lse_name)
        yield from self._chunk_gemms(r, q, FORWARD_GEMMS)
        if r.numeric:
            s = k_all.shape[2]
            mask = self._mask(keep, q.shape[1], np.arange(s))  # (b, a/t, n, s) or None
            o, lse.data = block_forward(q.data, k_all, v_all, self.positions, np.arange(s),
                                        mask, p)
            out.data = o.transpose(2, 0, 1, 3).reshape(n, b, heads * d)
        r.free(gathered)
        return out, lse

    def backward(self, r, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                 lse: Tensor, keep=None, p: float = 0.0):
        """dout (n, b, a/t·d) -> dq (b, a/t, n, d), dk, dv (b, G/t, n, d): K/V gathered again,
        the whole sequence's partial dK/dV reduce-scattered to their owners."""
        b, heads, n, d = q.shape
        gathered, k_all, v_all = yield from self._gather_kv(r, k, v, "cp_kv_gather_backward")
        dq = r.alloc(q.shape, FP16, "d_q")
        partial = r.alloc((2 * self.size * k.numel,), FP16, "cp_dkv_partial")
        phase, r.phase = r.phase, "recompute"
        yield from self._chunk_gemms(r, q, ("recompute_scores",))
        r.phase = phase
        yield from self._chunk_gemms(r, q, BACKWARD_GEMMS)
        r.free(gathered)
        if r.numeric:
            to_heads = lambda x: x.reshape(n, b, heads, d).transpose(1, 2, 0, 3)  # (b,a,n,d)
            do, o = to_heads(dout.data), to_heads(out.data)
            delta = (do * o).sum(axis=-1, keepdims=True)  # (b, a/t, n, 1)
            keys = np.arange(k_all.shape[2])  # (s,)
            dq.data, dk_all, dv_all = block_backward(do, q.data, k_all, v_all, self.positions,
                                                     keys, lse.data, delta,
                                                     self._mask(keep, heads, keys), p)
            partial.data = np.concatenate([np.stack([dk_all[:, :, pos], dv_all[:, :, pos]])
                                           .reshape(-1) for pos in self._all_positions()])
        owned = yield from tensor_collective(r, "reduce_scatter", partial, partial.shape,
                                             (2 * k.numel,), r.key("cp_dkv_scatter"),
                                             label="cp_reduce_scatter", group=self.members,
                                             track="cp_comm")
        r.free(partial)
        dk = r.alloc(k.shape, FP16, "d_k")
        dv = r.alloc(v.shape, FP16, "d_v")
        if r.numeric:
            dk.data, dv.data = owned.data.reshape((2,) + k.shape)
        r.free(owned)
        return dq, dk, dv

