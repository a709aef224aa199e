"""Ops on an emulated rank: each allocates its output, computes (numeric mode) and takes its time.

Every op is a simpy generator (`y = yield from linear(r, ...)`). Math lives in kernels.py; this
file adds what a GPU run has on top of the math: ledger entries, FLOP counts and kernel time.
GEMM FLOPs are 2mkn (K22 App. A); element-wise kernels are timed by bytes read and written.
"""

import numpy as np

from simsp.model import fp8, kernels
from simsp.model.tensor import FP16, FP32, MASK, Tensor


def _data(t: Tensor | None):
    return None if t is None else t.data


def linear(r, x: Tensor, w: Tensor, b: Tensor | None, name: str):
    """y = x @ w + b. x (..., k), w (k, n) -> y (..., n)."""
    k, n = w.shape
    m = x.numel // k
    y = r.alloc(x.shape[:-1] + (n,), FP16, name)
    in_fp8 = r.fp8 is not None and fp8.is_fp8_weight(w)
    if r.numeric:
        xd, wd = x.data, w.data
        if in_fp8:
            xd, wd = fp8.emulate(xd, "e4m3"), fp8.emulate(wd, "e4m3")
        y.data = kernels.linear_forward(xd, wd, _data(b))
    if in_fp8:
        yield from fp8.quantize(r, name, m * k)
        yield from fp8.gemm(r, name, m, k, n)
        return y
    yield from r.compute(name, "gemm", 2 * m * k * n, gemm=(m, k, n))
    return y


def linear_grad_input(r, dy: Tensor, w: Tensor, name: str):
    """dx = dy @ w^T. dy (..., n), w (k, n) -> dx (..., k)."""
    k, n = w.shape
    m = dy.numel // n
    dx = r.alloc(dy.shape[:-1] + (k,), FP16, name)
    in_fp8 = r.fp8 is not None and fp8.is_fp8_weight(w)
    if r.numeric and in_fp8:
        dx.data = fp8.emulate(dy.data, fp8.backward_format(r)) @ fp8.emulate(w.data, "e4m3").T
    elif r.numeric:
        dx.data = dy.data @ w.data.T
    if in_fp8:
        yield from fp8.quantize(r, name, m * n)  # dy, for this GEMM and the weight gradient's
        yield from fp8.gemm(r, name, m, n, k)
        return dx
    yield from r.compute(name, "gemm", 2 * m * k * n, gemm=(m, n, k))
    return dx


def linear_grad_weight(r, dy: Tensor, x: Tensor, grads: dict, w_name: str, b_name: str | None,
                       name: str):
    """Accumulate dW = x^T dy (and db = sum dy) into the fp32 main gradients."""
    k, n = x.shape[-1], dy.shape[-1]
    m = dy.numel // n
    in_fp8 = r.fp8 is not None and fp8.is_fp8_weight(grads[w_name])
    if r.numeric:
        x2, dy2 = x.data.reshape(m, k), dy.data.reshape(m, n)  # (m, k), (m, n)
        if in_fp8:  # the saved FP8 input and the quantized output gradient
            x2, dy2 = fp8.emulate(x2, "e4m3"), fp8.emulate(dy2, fp8.backward_format(r))
            grads[w_name].data += x2.T @ dy2
            dy2 = dy.data.reshape(m, n)  # the bias gradient is a BF16 reduction
        else:
            grads[w_name].data += x2.T @ dy2
        if b_name:
            grads[b_name].data += dy2.sum(axis=0)
    if in_fp8:
        yield from fp8.gemm(r, name, k, m, n)  # saved FP8 input x FP8 dy
        return
    yield from r.compute(name, "gemm", 2 * m * k * n, gemm=(k, m, n))


def bias_grad(r, dy: Tensor, grads: dict, b_name: str, name: str):
    """Accumulate db = sum of dy over all but the last axis."""
    if r.numeric:
        grads[b_name].data += dy.data.reshape(-1, dy.shape[-1]).sum(axis=0)
    yield from r.compute(name, "elementwise", nbytes=dy.nbytes)


def elementwise(r, shape: tuple, name: str, compute, nbytes: int, itemsize: int = FP16):
    """A new tensor from a memory-bound kernel moving `nbytes`; `compute()` gives its data."""
    out = r.alloc(shape, itemsize, name)
    if r.numeric:
        out.data = compute()
    yield from r.compute(name, "elementwise", nbytes=nbytes)
    return out


def layernorm(r, x: Tensor, gamma: Tensor, beta: Tensor, eps: float, name: str):
    """LayerNorm over the hidden (last) axis: reads x, writes y."""
    return (yield from elementwise(
        r, x.shape, name, lambda: kernels.layernorm_forward(x.data, gamma.data, beta.data, eps),
        2 * x.nbytes))


def layernorm_backward(r, dy: Tensor, x: Tensor, gamma: Tensor, eps: float, grads: dict,
                       prefix: str, name: str):
    """dx of LayerNorm; dgamma, dbeta accumulate into grads[prefix.gamma/beta]."""
    dx = r.alloc(x.shape, FP16, name)
    if r.numeric:
        dx.data, dgamma, dbeta = kernels.layernorm_backward(dy.data, x.data, gamma.data, eps)
        grads[f"{prefix}.gamma"].data += dgamma
        grads[f"{prefix}.beta"].data += dbeta
    yield from r.compute(name, "elementwise", nbytes=3 * x.nbytes)
    return dx


def bias_dropout_add(r, x: Tensor, bias: Tensor, mask: Tensor | None, p: float,
                     residual: Tensor, name: str):
    """residual + dropout(x + bias) as one kernel, as Megatron-LM's bias_dropout_add_fused_train:
    reads x and the residual, writes the output (and the mask drawn on the fly)."""
    def compute():
        biased = x.data if bias is None else x.data + bias.data
        return residual.data + (biased if mask is None
                                else kernels.dropout_forward(biased, mask.data, p))
    moved = 3 * x.nbytes + (mask.nbytes if mask is not None else 0)
    return (yield from elementwise(r, x.shape, name, compute, moved))


def add(r, x: Tensor, y: Tensor, name: str):
    """Residual add: a new tensor x + y."""
    return (yield from elementwise(r, x.shape, name, lambda: x.data + y.data, 3 * x.nbytes))


def gelu(r, x: Tensor, name: str):
    """GeLU (tanh form, kernels.gelu_forward)."""
    return (yield from elementwise(r, x.shape, name, lambda: kernels.gelu_forward(x.data),
                                   2 * x.nbytes))


def gelu_backward(r, dy: Tensor, x: Tensor, name: str):
    return (yield from elementwise(r, x.shape, name, lambda: kernels.gelu_backward(dy.data, x.data),
                                   3 * x.nbytes))


def dropout_mask(r, p: float, site: int, starts: tuple, shape: tuple, name: str):
    """The keep-mask (1 byte/element) drawn from global coordinates, so every layout agrees."""
    mask = r.alloc(shape, MASK, name)
    if r.numeric:
        mask.data = kernels.keep_mask(p, r.seed, site, starts, shape)
    return mask


def dropout(r, x: Tensor, mask: Tensor | None, p: float, name: str):
    """x * mask / (1 - p); with no mask (p == 0) a no-op that returns x."""
    if mask is None:
        return x
    y = r.alloc(x.shape, FP16, name)
    if r.numeric:
        y.data = kernels.dropout_forward(x.data, mask.data, p)
    yield from r.compute(name, "elementwise", nbytes=2 * x.nbytes + mask.nbytes)
    return y


def dropout_backward(r, dy: Tensor, mask: Tensor | None, p: float, name: str):
    if mask is None:
        return dy
    dx = r.alloc(dy.shape, FP16, name)
    if r.numeric:
        dx.data = kernels.dropout_backward(dy.data, mask.data, p)
    yield from r.compute(name, "elementwise", nbytes=2 * dy.nbytes + mask.nbytes)
    return dx


def batched_matmul(r, a: Tensor, b: Tensor, name: str, transpose_b: bool = False,
                   transpose_a: bool = False, scale: float = 1.0):
    """a @ b over leading batch axes: (..., m, k) @ (..., k, n) -> (..., m, n)."""
    m = a.shape[-1] if transpose_a else a.shape[-2]
    k = a.shape[-2] if transpose_a else a.shape[-1]
    n = b.shape[-2] if transpose_b else b.shape[-1]
    batch = a.numel // (m * k)
    out = r.alloc(a.shape[:-2] + (m, n), FP16, name)
    if r.numeric:
        left = np.swapaxes(a.data, -1, -2) if transpose_a else a.data
        right = np.swapaxes(b.data, -1, -2) if transpose_b else b.data
        out.data = scale * (left @ right)
    yield from r.compute(name, "gemm", 2 * batch * m * k * n, gemm=(m, k, n))
    return out


def causal_softmax(r, scores: Tensor, name: str):
    return (yield from elementwise(r, scores.shape, name,
                                   lambda: kernels.causal_softmax_forward(scores.data),
                                   2 * scores.nbytes))


def softmax_backward(r, dprobs: Tensor, probs: Tensor, name: str):
    return (yield from elementwise(r, probs.shape, name,
                                   lambda: kernels.softmax_backward(dprobs.data, probs.data),
                                   3 * probs.nbytes))


def reshape_copy(r, x: Tensor, shape: tuple, perm: tuple | None, name: str,
                 itemsize: int = FP16):
    """A new tensor holding x transposed by `perm` then reshaped (a copy kernel on GPU)."""
    out_shape = tuple(shape)
    y = r.alloc(out_shape, itemsize, name)
    if r.numeric:
        data = x.data if perm is None else np.transpose(x.data, perm)
        y.data = np.ascontiguousarray(data).reshape(out_shape)
    yield from r.compute(name, "elementwise", nbytes=2 * x.nbytes)
    return y


def accumulate(r, total: Tensor, extra: Tensor, name: str):
    """total += extra (gradient of a residual branch), in place."""
    if r.numeric:
        total.data = total.data + extra.data
    yield from r.compute(name, "elementwise", nbytes=3 * total.nbytes)
    return total


def fp32_copy(r, x: Tensor, name: str):
    """A float32 copy of x (the loss is computed on fp32 logits, K22 §4.3)."""
    return (yield from elementwise(r, x.shape, name, lambda: x.data.copy(), 3 * x.nbytes, FP32))


# ---------------------------------------------------------------------------------------------
# Llama-class ops (kernels.py holds the math; docs/llama.md the memory they keep)


def rmsnorm(r, x: Tensor, gamma: Tensor, eps: float, name: str):
    """RMSNorm over the hidden (last) axis: reads x, writes y (as layernorm)."""
    return (yield from elementwise(
        r, x.shape, name, lambda: kernels.rmsnorm_forward(x.data, gamma.data, eps), 2 * x.nbytes))


def rmsnorm_backward(r, dy: Tensor, x: Tensor, gamma: Tensor, eps: float, grads: dict,
                     prefix: str, name: str):
    """dx of RMSNorm; dgamma accumulates into grads[prefix.gamma]."""
    dx = r.alloc(x.shape, FP16, name)
    if r.numeric:
        dx.data, dgamma = kernels.rmsnorm_backward(dy.data, x.data, gamma.data, eps)
        grads[f"{prefix}.gamma"].data += dgamma
    yield from r.compute(name, "elementwise", nbytes=3 * x.nbytes)
    return dx


def swiglu(r, x: Tensor, name: str):
    """silu(gate) * up: x (..., 2f') -> (..., f'); reads 2f', writes f' per row."""
    shape = x.shape[:-1] + (x.shape[-1] // 2,)
    return (yield from elementwise(r, shape, name, lambda: kernels.swiglu_forward(x.data),
                                   3 * x.nbytes // 2))


def swiglu_backward(r, dy: Tensor, x: Tensor, name: str):
    """d[gate | up] (..., 2f') from dy (..., f') and the kept input x (..., 2f')."""
    return (yield from elementwise(r, x.shape, name,
                                   lambda: kernels.swiglu_backward(dy.data, x.data),
                                   dy.nbytes + 2 * x.nbytes))


def rope(r, x: Tensor, cos, sin, name: str, inverse: bool = False):
    """x (b, heads, s, d) rotated per position by the angles (s, rot) (RoPE); `inverse` is the
    backward (the transposed rotation)."""
    kernel = kernels.rope_backward if inverse else kernels.rope_forward
    return (yield from elementwise(r, x.shape, name, lambda: kernel(x.data, cos, sin),
                                   2 * x.nbytes))


def expand_kv(r, x: Tensor, repeats: int, name: str):
    """(b, G, s, d) -> (b, G·repeats, s, d): each KV head copied for its group's query heads."""
    b, groups, s, d = x.shape
    return (yield from elementwise(r, (b, groups * repeats, s, d), name,
                                   lambda: kernels.expand_kv(x.data, repeats),
                                   x.nbytes * (1 + repeats)))


def reduce_kv(r, dx: Tensor, repeats: int, name: str):
    """Gradient of expand_kv: (b, a, s, d) summed per group -> (b, a/repeats, s, d)."""
    b, heads, s, d = dx.shape
    return (yield from elementwise(r, (b, heads // repeats, s, d), name,
                                   lambda: kernels.reduce_kv(dx.data, repeats),
                                   dx.nbytes * (1 + repeats) // repeats))


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


def _flash_gemms(r, q: Tensor, names: tuple, widths: tuple | None = None):
    """One batched GEMM of the attention core per name, 2·b·heads·A·w FLOPs each, A the causal
    tiles' area (causal_tile_area), w the head width it contracts or produces (d; d_v for MLA's
    value GEMMs) (the tiles stay on chip: no element-wise traffic is charged)."""
    b, heads, s, d = q.shape
    area = causal_tile_area(s)
    for name, width in zip(names, widths or (d,) * len(names)):
        yield from r.compute(name, "gemm", 2 * b * heads * area * width, gemm=(s, width, s))


def flash_attention(r, q: Tensor, k: Tensor, v: Tensor, keep, p: float, out_name: str,
                    lse_name: str):
    """FlashAttention forward: q (b, a/t, s, d), k, v (b, G/t, s, d) -> output (s, b, a/t·d),
    written in the layout the output projection reads, and the fp32 logsumexp (b, a/t, s)."""
    b, heads, s, d = q.shape
    dv = v.shape[-1]  # d, or MLA's d_v
    out = r.alloc((s, b, heads * dv), FP16, out_name)
    lse = r.alloc((b, heads, s), FP32, lse_name)
    if r.numeric:
        o, lse.data = kernels.flash_forward(q.data, k.data, v.data, keep, p)  # (b, a, s, d_v)
        out.data = o.transpose(2, 0, 1, 3).reshape(s, b, heads * dv)
    yield from _flash_gemms(r, q, (f"{out_name}_scores", f"{out_name}_context"),
                            None if dv == d else (d, dv))
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
        dq.data, dk.data, dv.data = kernels.flash_backward(
            to_heads(dout.data), q.data, k.data, v.data, to_heads(out.data), lse.data, keep, p)
    phase, r.phase = r.phase, "recompute"
    yield from _flash_gemms(r, q, ("flash_recompute_scores",))
    r.phase = phase
    yield from _flash_gemms(r, q, ("flash_d_v", "flash_d_probs", "flash_d_q", "flash_d_k"),
                            None if width == d else (width, width, d, d))
    return dq, dk, dv
