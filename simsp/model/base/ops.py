"""The ops every block is built from, on an emulated rank: each allocates its output, computes
(numeric mode) and takes its time.

Every op is a simpy generator (`y = yield from linear(r, ...)`). The math lives in numpy
(base/kernels.py, or the block's own module); an op adds what a GPU run has on top of the math:
ledger entries, FLOP counts and kernel time. GEMM FLOPs are 2mkn (K22 App. A); element-wise
kernels are timed by bytes read and written (`elementwise`). A block's own ops (a norm, an
activation, the attention core) live in its block and are built on these.
"""

import numpy as np

from simsp.hardware.costmodel import kernel_time
from simsp.model import fp8
from simsp.model.base import kernels
from simsp.model.tensor import FP16, FP32, MASK, Tensor


def _data(t: Tensor | None):
    """The tensor's array, or None for no tensor."""
    return None if t is None else t.data


def linear(r, x: Tensor, w: Tensor, b: Tensor | None, name: str, normed: bool = False,
           runner=None):
    """y = x @ w + b. x (..., k), w (k, n) -> y (..., n). `normed`: x is a norm's output
    that TE's LayerNormLinear quantized in the norm's kernel (fp8.normed_cast_bytes), so an FP8
    GEMM needs no cast of its own (under SP, the gathered copy's transpose). `runner`: runs the
    GEMM in pieces beside communication (base/tp_overlap.py), setting y's data from the math."""
    k, n = w.shape
    m = x.numel // k
    y = r.alloc(x.shape[:-1] + (n,), FP16, name)
    in_fp8 = r.fp8 is not None and fp8.is_fp8_weight(w)

    def math():
        xd, wd = x.data, w.data
        if in_fp8:
            xd, wd = fp8.emulate(xd, "e4m3"), fp8.emulate(wd, "e4m3")
        return kernels.linear_forward(xd, wd, _data(b))
    if in_fp8:
        yield from (fp8.gathered_transpose(r, name, m * k) if normed
                    else fp8.quantize(r, name, m * k))
    yield from _gemm(r, name, (m, k, n), in_fp8, y, math, runner)
    return y


def _gemm(r, name: str, shape: tuple, in_fp8: bool, out: Tensor, math, runner):
    """One GEMM of `shape` (m, k, n) whose output `out` is `math()`: whole, or by `runner`."""
    if runner is not None:
        yield from runner(r, name, shape, in_fp8, out, math)
        return
    if r.numeric and math is not None:
        out.data = math()
    yield from gemm_kernel(r, name, shape, in_fp8)


def gemm_kernel(r, name: str, shape: tuple, in_fp8: bool):
    """Hold the compute stream for one (m, k, n) GEMM, FP8 or 16-bit."""
    m, k, n = shape
    if in_fp8:
        yield from fp8.gemm(r, name, m, k, n)
        return
    yield from r.compute(name, "gemm", 2 * m * k * n, gemm=shape)


def gemm_seconds(r, shape: tuple, in_fp8: bool, wgrad: bool = False) -> float:
    """The modelled seconds of one (m, k, n) GEMM alone on the GPU; `wgrad`: an FP8 weight
    gradient accumulating into the main gradient (fp8.wgrad_gemm)."""
    m, k, n = shape
    if in_fp8:
        return fp8.gemm_time(r, m, k, n, r.precision.main_grad_bytes if wgrad else 0)
    return kernel_time("gemm", 2 * m * k * n, 0, shape, r.compute_cal)


def linear_grad_input(r, dy: Tensor, w: Tensor, name: str, runner=None):
    """dx = dy @ w^T. dy (..., n), w (k, n) -> dx (..., k). `runner` as in `linear`."""
    k, n = w.shape
    m = dy.numel // n
    dx = r.alloc(dy.shape[:-1] + (k,), FP16, name)
    in_fp8 = r.fp8 is not None and fp8.is_fp8_weight(w)

    def math():
        if in_fp8:
            return fp8.emulate(dy.data, fp8.backward_format(r)) @ fp8.emulate(w.data, "e4m3").T
        return dy.data @ w.data.T
    if in_fp8:
        yield from fp8.quantize(r, name, m * n)  # dy, for this GEMM and the weight gradient's
    yield from _gemm(r, name, (m, n, k), in_fp8, dx, math, runner)
    return dx


def linear_grad_weight(r, dy: Tensor, x: Tensor, grads: dict, w_name: str, b_name: str | None,
                       name: str, runner=None):
    """Accumulate dW = x^T dy (and db = sum dy) into the fp32 main gradients; during the B step
    of a split backward (`r.wgrad`, base/wgrad_store.py) deferred to the W step instead (alone
    there: `runner`, a GEMM beside communication, applies only to one run now)."""
    if r.wgrad is not None:
        r.wgrad.defer(r, (dy, x), lambda dy, x: _grad_weight(r, dy, x, grads, w_name, b_name,
                                                              name))
        return
    yield from _grad_weight(r, dy, x, grads, w_name, b_name, name, runner)


def _grad_weight(r, dy: Tensor, x: Tensor, grads: dict, w_name: str, b_name: str | None,
                 name: str, runner=None):
    """dW = x^T dy (and db): dy (..., n), x (..., k) -> grads[w_name] (k, n) += x^T dy."""
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
    if in_fp8 and runner is None:
        yield from fp8.wgrad_gemm(r, name, k, m, n)  # saved FP8 input x FP8 dy, into main_grad
        return
    yield from _gemm(r, name, (k, m, n), in_fp8, None, None, runner)


def bias_grad(r, dy: Tensor, grads: dict, b_name: str, name: str):
    """Accumulate db = sum of dy over all but the last axis."""
    if r.numeric:
        grads[b_name].data += dy.data.reshape(-1, dy.shape[-1]).sum(axis=0)
    yield from r.compute(name, "elementwise", nbytes=dy.nbytes)


def elementwise(r, shape: tuple, name: str, compute, nbytes: int | tuple,
                itemsize: int = FP16):
    """A new tensor from a memory-bound kernel moving `nbytes` (or from the kernels moving each
    of a tuple's counts, base/fusions.py); `compute()` gives its data."""
    out = r.alloc(shape, itemsize, name)
    if r.numeric:
        out.data = compute()
    yield from run_kernels(r, name, nbytes if isinstance(nbytes, tuple) else (nbytes,))
    return out


def run_kernels(r, name: str, byte_counts: tuple):
    """Memory-bound kernels one after the other, each moving its count of bytes: the first
    named `name`, the others `name_1`, `name_2`, ... (an unfused op's eager kernels)."""
    for index, nbytes in enumerate(byte_counts):
        yield from r.compute(name if index == 0 else f"{name}_{index}", "elementwise",
                             nbytes=nbytes)


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


def dropout_mask(r, p: float, site: int, starts: tuple, shape: tuple, name: str):
    """The keep-mask (1 byte/element) drawn from global coordinates, so every layout agrees."""
    mask = r.alloc(shape, MASK, name)
    if r.numeric:
        mask.data = kernels.keep_mask(p, r.seed, site, starts, shape)
    return mask


def dropout(r, x: Tensor, mask: Tensor | None, p: float, name: str):
    """x * mask / (1 - p); with no mask (p == 0) a no-op that returns x."""
    return (yield from _masked(r, x, mask, p, name, kernels.dropout_forward))


def dropout_backward(r, dy: Tensor, mask: Tensor | None, p: float, name: str):
    """dy * mask / (1 - p); with no mask (p == 0) a no-op that returns dy."""
    return (yield from _masked(r, dy, mask, p, name, kernels.dropout_backward))


def _masked(r, x: Tensor, mask: Tensor | None, p: float, name: str, kernel):
    """kernel(x, mask, p) as a new tensor, reading x and the mask and writing the output; x
    itself without a mask."""
    if mask is None:
        return x
    y = r.alloc(x.shape, FP16, name)
    if r.numeric:
        y.data = kernel(x.data, mask.data, p)
    yield from r.compute(name, "elementwise", nbytes=2 * x.nbytes + mask.nbytes)
    return y


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
