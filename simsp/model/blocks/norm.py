"""LayerNorm and RMSNorm (--normalization) over the hidden axis: the numpy math, the rank's ops,
and the norm block a layer calls before its attention and before its MLP (and the final norm,
multi-token prediction's norms).

LayerNorm as llm.c's layernorm_forward/backward (biased variance, as torch); RMSNorm as Zhang &
Sennrich 2019, Megatron-LM's RMSNorm (docs/llama.md). Parameters: `{prefix}.gamma` (h,) and, for
LayerNorm, `{prefix}.beta` (h,). Kept for backward: the norm's input, which its caller stashes
(ln1_input, ln2_input, final_ln_input); the mean and rstd are recomputed from it (K22 does not
count them). An op reads x and writes y (2·x bytes); its backward reads dy and x, writes dx.
"""

import numpy as np

from simsp.model import fp8
from simsp.model.base.ops import elementwise
from simsp.model.base.stash import recomputing
from simsp.model.tensor import FP16, Tensor


def shapes(model, prefix: str) -> dict[str, tuple[int, ...]]:
    """The norm's parameters: {prefix}.gamma (h,) and, LayerNorm only, {prefix}.beta (h,)."""
    names = ("gamma",) if model.normalization == "RMSNorm" else ("gamma", "beta")
    return {f"{prefix}.{name}": (model.hidden_size,) for name in names}


# ---------------------------------------------------------------------------------------------
# numpy


def _layernorm_stats(x, eps):
    """Mean and reciprocal standard deviation over the last dim (biased variance, as torch)."""
    mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # (..., 1)
    rstd = 1.0 / np.sqrt(var + eps)  # (..., 1)
    return mean, rstd


def layernorm_forward(x, gamma, beta, eps=1e-5):
    """y = (x - mean) * rstd * gamma + beta over the last dim."""
    mean, rstd = _layernorm_stats(x, eps)  # (..., 1) each
    return (x - mean) * rstd * gamma + beta  # (..., h)


def layernorm_backward(dy, x, gamma, eps=1e-5):
    """(dx, dgamma, dbeta); mean/rstd are recomputed from x (K22 does not count them as kept)."""
    h = x.shape[-1]
    mean, rstd = _layernorm_stats(x, eps)  # (..., 1) each
    xhat = (x - mean) * rstd  # (..., h)
    dgamma = (dy * xhat).reshape(-1, h).sum(axis=0)  # (h,)
    dbeta = dy.reshape(-1, h).sum(axis=0)  # (h,)
    dxhat = dy * gamma  # (..., h)
    # llm.c: dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))  # (..., h)
    return dx, dgamma, dbeta


def rmsnorm_forward(x, gamma, eps=1e-5):
    """y = x * rsqrt(mean(x^2) + eps) * gamma over the last dim (Zhang & Sennrich 2019)."""
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
    return x * rstd * gamma  # (..., h)


def rmsnorm_backward(dy, x, gamma, eps=1e-5):
    """(dx, dgamma); rstd is recomputed from x, as for LayerNorm."""
    h = x.shape[-1]
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
    xhat = x * rstd  # (..., h)
    dgamma = (dy * xhat).reshape(-1, h).sum(axis=0)  # (h,)
    dxhat = dy * gamma  # (..., h)
    dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))  # (..., h)
    return dx, dgamma


# ---------------------------------------------------------------------------------------------
# ops on a rank


def layernorm(r, x: Tensor, gamma: Tensor, beta: Tensor, eps: float, name: str,
              moved: int | None = None):
    """LayerNorm over the hidden (last) axis: reads x, writes y (`moved` bytes, default 2x)."""
    return (yield from elementwise(
        r, x.shape, name, lambda: layernorm_forward(x.data, gamma.data, beta.data, eps),
        2 * x.nbytes if moved is None else moved))


def layernorm_grad(r, dy: Tensor, x: Tensor, gamma: Tensor, eps: float, grads: dict,
                   prefix: str, name: str):
    """dx of LayerNorm; dgamma, dbeta accumulate into grads[prefix.gamma/beta]."""
    dx = r.alloc(x.shape, FP16, name)
    if r.numeric:
        dx.data, dgamma, dbeta = layernorm_backward(dy.data, x.data, gamma.data, eps)
        grads[f"{prefix}.gamma"].data += dgamma
        grads[f"{prefix}.beta"].data += dbeta
    yield from r.compute(name, "elementwise", nbytes=3 * x.nbytes)
    return dx


def rmsnorm(r, x: Tensor, gamma: Tensor, eps: float, name: str, moved: int | None = None):
    """RMSNorm over the hidden (last) axis: reads x, writes y (as layernorm)."""
    return (yield from elementwise(
        r, x.shape, name, lambda: rmsnorm_forward(x.data, gamma.data, eps),
        2 * x.nbytes if moved is None else moved))


def rmsnorm_grad(r, dy: Tensor, x: Tensor, gamma: Tensor, eps: float, grads: dict,
                 prefix: str, name: str):
    """dx of RMSNorm; dgamma accumulates into grads[prefix.gamma]."""
    dx = r.alloc(x.shape, FP16, name)
    if r.numeric:
        dx.data, dgamma = rmsnorm_backward(dy.data, x.data, gamma.data, eps)
        grads[f"{prefix}.gamma"].data += dgamma
    yield from r.compute(name, "elementwise", nbytes=3 * x.nbytes)
    return dx


# ---------------------------------------------------------------------------------------------
# the block


def norm(r, m, x, w: dict, prefix: str, name: str, cast_fused: bool = False):
    """LayerNorm or RMSNorm (--normalization) of x (s_l, b, h) with the weights under prefix.
    `cast_fused`: the kernel writes its output as FP8 for the next linear (fp8.py
    normed_cast_bytes) instead of 16-bit; the numbers are the same (the GEMM emulates it)."""
    moved = x.nbytes + (fp8.normed_cast_bytes(r, x.numel) if cast_fused else x.nbytes)
    if m.normalization == "RMSNorm":
        return (yield from rmsnorm(r, x, w[f"{prefix}.gamma"], m.norm_epsilon, name, moved))
    return (yield from layernorm(r, x, w[f"{prefix}.gamma"], w[f"{prefix}.beta"],
                                 m.norm_epsilon, name, moved))


def norm_backward(r, m, dy, x, w: dict, g: dict, prefix: str, name: str):
    """dx of LayerNorm or RMSNorm at the kept input x; the weight gradients accumulate in g."""
    if m.normalization == "RMSNorm":
        return (yield from rmsnorm_grad(r, dy, x, w[f"{prefix}.gamma"], m.norm_epsilon, g,
                                        prefix, name))
    return (yield from layernorm_grad(r, dy, x, w[f"{prefix}.gamma"], m.norm_epsilon, g,
                                      prefix, name))


def recompute_norm(r, m, w, x, prefix: str, name: str):
    """--recompute-modules layernorm: the norm's output again from its kept input (Megatron's
    CheckpointWithoutOutput), just before the GEMM backward that reads it."""
    with recomputing(r):
        y = yield from norm(r, m, x, w, prefix, name)
    return y
