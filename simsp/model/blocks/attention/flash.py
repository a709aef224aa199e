"""FlashAttention (--attention-backend flash): the causal core tile by tile with an online
softmax, keeping its output and the fp32 logsumexp instead of any s × s tensor (Dao et al. 2022,
arXiv:2205.14135; FlashAttention-2, Dao 2023, arXiv:2307.08691): numpy math and the rank's ops.
K and V come in unexpanded (b, G, s, d), each shared by a/G query heads (blocks/attention/
heads.py). Timing: one fused kernel forward, one backward, priced as the tiled kernel the
backend runs on the rank's GPU (simsp/hardware/attention_kernels.py, docs/attention_kernels.md);
on a GPU whose profile has no figures for it, as the causal tiles' GEMMs (no element-wise
traffic: the tiles stay on chip). Either way the FLOPs counted are the causal tiles' GEMMs'.
"""

import math

import numpy as np

from simsp.hardware.attention_kernels import AttentionShape, attention_seconds, shape_of
from simsp.model.blocks.attention.heads import expand_kv, reduce_kv
from simsp.model.tensor import FP16, FP32, Tensor

NUMERIC_TILE = 16  # tile rows/columns of the numpy blockwise attention (numeric mode)


def _flash_tiles(s):
    """(start, end) of each numeric tile of a length-s axis."""
    return [(i, min(i + NUMERIC_TILE, s)) for i in range(0, s, NUMERIC_TILE)]


def _tile_keep(keep, i0, i1, j0, j1):
    """The tile's (b, a, i, j) dropout keep-mask, or None without dropout."""
    return None if keep is None else keep(i0, i1, j0, j1)


def flash_forward(q, k, v, keep=None, p=0.0):
    """FlashAttention forward (Dao et al. 2022, arXiv:2205.14135, Alg. 1): causal softmax
    attention tile by tile with an online softmax. q (b, a, s, d); k, v (b, G, s, d) shared by
    a/G query heads each; keep(i0, i1, j0, j1) gives a tile's (b, a, i, j) dropout keep-mask.
    Returns the output (b, a, s, d) and the per-row logsumexp (b, a, s)."""
    b, a, s, d = q.shape
    group = a // k.shape[1]
    kx, vx = expand_kv(k, group), expand_kv(v, group)  # (b, a, s, d): views of the tiles' K, V
    scale = 1.0 / math.sqrt(d)
    dv = v.shape[-1]  # value width (d_v of multi-latent attention; d otherwise)
    out = np.zeros((b, a, s, dv), dtype=q.dtype)  # (b, a, s, d_v)
    lse = np.zeros((b, a, s), dtype=q.dtype)  # (b, a, s)
    for i0, i1 in _flash_tiles(s):
        acc = np.zeros((b, a, i1 - i0, dv), dtype=q.dtype)  # (b, a, i, d_v)
        row_max = np.full((b, a, i1 - i0, 1), -np.inf, dtype=q.dtype)  # (b, a, i, 1)
        row_sum = np.zeros((b, a, i1 - i0, 1), dtype=q.dtype)  # (b, a, i, 1)
        for j0, j1 in _flash_tiles(s):
            if j0 >= i1:
                break  # causal: later keys are masked for every row of this tile
            scores = (q[:, :, i0:i1] @ kx[:, :, j0:j1].swapaxes(-1, -2)) * scale  # (b,a,i,j)
            visible = np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None]  # (i, j)
            scores = np.where(visible, scores, -np.inf)
            new_max = np.maximum(row_max, scores.max(axis=-1, keepdims=True))  # (b, a, i, 1)
            e = np.exp(scores - new_max)  # (b, a, i, j)
            correction = np.exp(row_max - new_max)  # (b, a, i, 1)
            row_sum = row_sum * correction + e.sum(axis=-1, keepdims=True)
            mask = _tile_keep(keep, i0, i1, j0, j1)
            dropped = e if mask is None else e * mask / (1.0 - p)  # (b, a, i, j)
            acc = acc * correction + dropped @ vx[:, :, j0:j1]  # (b, a, i, d)
            row_max = new_max
        out[:, :, i0:i1] = acc / row_sum
        lse[:, :, i0:i1] = (row_max + np.log(row_sum))[..., 0]
    return out, lse


def flash_backward(dout, q, k, v, out, lse, keep=None, p=0.0):
    """FlashAttention backward (Dao et al. 2022, Alg. 2): recompute each tile's probabilities
    from q, k and the logsumexp; D = rowsum(dout * out). Returns dq (b, a, s, d) and dk, dv
    (b, G, s, d) summed over each group's query heads."""
    b, a, s, d = q.shape
    group = a // k.shape[1]
    kx, vx = expand_kv(k, group), expand_kv(v, group)  # (b, a, s, d)
    scale = 1.0 / math.sqrt(d)
    dq, dkx, dvx = np.zeros_like(q), np.zeros_like(kx), np.zeros_like(vx)  # (b, a, s, d) each
    delta = (dout * out).sum(axis=-1, keepdims=True)  # (b, a, s, 1)
    for i0, i1 in _flash_tiles(s):
        for j0, j1 in _flash_tiles(s):
            if j0 >= i1:
                break
            scores = (q[:, :, i0:i1] @ kx[:, :, j0:j1].swapaxes(-1, -2)) * scale  # (b,a,i,j)
            visible = np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None]
            probs = np.where(visible, np.exp(scores - lse[:, :, i0:i1, None]), 0.0)
            mask = _tile_keep(keep, i0, i1, j0, j1)
            dropped = probs if mask is None else probs * mask / (1.0 - p)  # (b, a, i, j)
            dvx[:, :, j0:j1] += dropped.swapaxes(-1, -2) @ dout[:, :, i0:i1]
            ddropped = dout[:, :, i0:i1] @ vx[:, :, j0:j1].swapaxes(-1, -2)  # (b, a, i, j)
            dprobs = ddropped if mask is None else ddropped * mask / (1.0 - p)
            dscores = probs * (dprobs - delta[:, :, i0:i1]) * scale  # (b, a, i, j)
            dq[:, :, i0:i1] += dscores @ kx[:, :, j0:j1]
            dkx[:, :, j0:j1] += dscores.swapaxes(-1, -2) @ q[:, :, i0:i1]
    return dq, reduce_kv(dkx, group), reduce_kv(dvx, group)


# ---------------------------------------------------------------------------------------------
# ops on a rank

FLASH_BLOCK = 128  # FlashAttention-2's tile at head dimension 128 on A100/H100: 128 query rows
# forward (csrc/flash_attn/src/flash_fwd_launch_template.h, run_mha_fwd_hdim128), 128 key
# columns backward (flash_bwd_launch_template.h, run_mha_bwd_hdim128)


def causal_tile_area(s: int, block: int = FLASH_BLOCK) -> int:
    """Score elements a causal FlashAttention kernel computes of the s × s mask: each block of
    `block` query rows runs the key tiles up to its last row and skips those above the
    diagonal (Dao 2023, arXiv:2307.08691 §3.1.1; the numeric kernel skips them too):
    block²·n(n + 1)/2 for the n whole blocks, plus the last rows against all s keys; s² when
    s <= block."""
    whole, rest = divmod(s, block)
    return block * block * whole * (whole + 1) // 2 + rest * s


def _gemm_flops(q: Tensor, widths: tuple) -> list:
    """FLOPs of each GEMM of the core, 2·b·heads·A·w, A the causal tiles' area
    (causal_tile_area), w the head width it contracts or produces."""
    b, heads, s, _ = q.shape
    area = causal_tile_area(s)
    return [2 * b * heads * area * width for width in widths]


def _flash_gemms(r, q: Tensor, names: tuple, widths: tuple | None = None):
    """One batched GEMM of the attention core per name (the fallback pricing, for a GPU without
    the kernel's figures): FLOPs as _gemm_flops, each at a GEMM's efficiency for (s, w, s)."""
    s, d = q.shape[2], q.shape[3]
    widths = widths or (d,) * len(names)
    for name, width, flops in zip(names, widths, _gemm_flops(q, widths)):
        yield from r.compute(name, "gemm", flops, gemm=(s, width, s))


def fused_core(r, shape: AttentionShape, parts: dict, backward: bool, share: float = 1.0):
    """One fused attention kernel of `shape` on r's compute stream (r.attention's figures,
    simsp/hardware/attention_kernels.py), or the `share` of it that `parts` are: its time split
    over `parts` ({name: FLOPs}) in proportion to their FLOPs, so the FLOPs each phase counts
    stay the GEMMs'; a name with "recompute" in it counts to the recompute phase."""
    seconds = attention_seconds(r.attention, shape, backward) * share
    total = sum(parts.values())
    for name, flops in parts.items():
        phase = r.phase
        if "recompute" in name:
            r.phase = "recompute"
        yield from r.hold(name, "gemm", flops, seconds * flops / total)
        r.phase = phase


def _fused_kernel(r, q: Tensor, k: Tensor, v: Tensor, parts: dict, backward: bool, p: float):
    """The layer's causal core as one fused kernel (fused_core) of q, k, v's shapes, drawing its
    dropout mask in the kernel where p > 0."""
    shape = shape_of(q.shape, k.shape[1], q.shape[2], v.shape[-1], True, dropout=p > 0)
    yield from fused_core(r, shape, parts, backward)


def te_layout_copy(r, t: Tensor, name: str):
    """Transformer Engine's FlashAttention returns flash-attn's (b, s, h·d) output to Megatron's
    (s, b, h·d) by `output.view(b, s, -1).transpose(0, 1).contiguous()`, a copy, and the backward
    reshapes the transposed gradient back for flash-attn, another (TE 1.8
    transformer_engine/pytorch/attention.py FlashAttention.forward; the same at TE d0067d0,
    dot_product_attention/backends.py). With b = 1 the transpose is already contiguous and
    nothing is copied; TE's cuDNN FusedAttention takes the (s, b) layout as it is. One
    element-wise kernel reading and writing `t`, on the fused FA2/FA3 kernels' path."""
    if r.attention is None or r.attention.kernel == "cudnn" or t.shape[1] == 1:
        return
    yield from r.compute(name, "elementwise", nbytes=2 * t.nbytes)


def flash_attention(r, q: Tensor, k: Tensor, v: Tensor, keep, p: float, out_name: str,
                    lse_name: str):
    """FlashAttention forward: q (b, a/t, s, d), k, v (b, G/t, s, d) -> output (s, b, a/t·d),
    written in the layout the output projection reads, and the fp32 logsumexp (b, a/t, s)."""
    b, heads, s, d = q.shape
    dv = v.shape[-1]  # d, or MLA's d_v
    out = r.alloc((s, b, heads * dv), FP16, out_name)
    lse = r.alloc((b, heads, s), FP32, lse_name)
    if r.numeric:
        o, lse.data = flash_forward(q.data, k.data, v.data, keep, p)  # (b, a, s, d_v)
        out.data = o.transpose(2, 0, 1, 3).reshape(s, b, heads * dv)
    names = (f"{out_name}_scores", f"{out_name}_context")
    if r.attention is not None:
        parts = dict(zip(names, _gemm_flops(q, (d, dv))))
        yield from _fused_kernel(r, q, k, v, parts, backward=False, p=p)
        yield from te_layout_copy(r, out, f"{out_name}_to_sbhd")
    else:
        yield from _flash_gemms(r, q, names, None if dv == d else (d, dv))
    return out, lse


def flash_attention_backward(r, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                             lse: Tensor, keep, p: float):
    """FlashAttention backward: dout, out (s, b, a/t·d) -> dq (b, a/t, s, d), dk, dv (b, G/t, s, d).
    The scores are recomputed tile by tile (charged to the recompute phase: hardware FLOPs)."""
    dq = r.alloc(q.shape, FP16, "d_q")
    dk = r.alloc(k.shape, FP16, "d_k")
    dv = r.alloc(v.shape, FP16, "d_v")
    d, width = q.shape[-1], v.shape[-1]  # width: d, or MLA's d_v
    if r.numeric:
        b, heads, s, _ = q.shape
        to_heads = lambda x: x.reshape(s, b, heads, width).transpose(1, 2, 0, 3)  # (b,a,s,dv)
        dq.data, dk.data, dv.data = flash_backward(
            to_heads(dout.data), q.data, k.data, v.data, to_heads(out.data), lse.data, keep, p)
    names = ("flash_recompute_scores", "flash_d_v", "flash_d_probs", "flash_d_q", "flash_d_k")
    widths = (d, width, width, d, d)
    if r.attention is not None:
        yield from te_layout_copy(r, dout, "d_flash_output_to_bshd")
        parts = dict(zip(names, _gemm_flops(q, widths)))
        yield from _fused_kernel(r, q, k, v, parts, backward=True, p=p)
        return dq, dk, dv
    phase, r.phase = r.phase, "recompute"
    yield from _flash_gemms(r, q, names[:1])
    r.phase = phase
    yield from _flash_gemms(r, q, names[1:], None if width == d else widths[1:])
    return dq, dk, dv
