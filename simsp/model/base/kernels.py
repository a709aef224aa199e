"""The numpy math every block shares, as plain forward/backward pairs (llm.c style),
dtype-agnostic: the linear layer, dropout with counter-based masks over global coordinates.

Every function takes and returns numpy arrays in the caller's float dtype (float64 or float32);
constants are Python floats so numpy 2 (NEP 50) never promotes float32 to float64. Activations use
the Megatron layout (s, b, h). A block's own math lives in its block (simsp/model/blocks/).
"""

import numpy as np

# ---------------------------------------------------------------------------------------------
# Linear: y = x @ w + b


def linear_forward(x, w, b):
    """y = x @ w + b over the last dim of x; b may be None."""
    y = x @ w  # (..., n) from x (..., k), w (k, n)
    return y if b is None else y + b  # (..., n)


def linear_backward(dy, x, w):
    """Gradients of y = x @ w + b: (dx, dw, db); db is returned even if the forward had no bias."""
    k, n = w.shape
    dx = dy @ w.T  # (..., k)
    dw = x.reshape(-1, k).T @ dy.reshape(-1, n)  # (k, n)
    db = dy.reshape(-1, n).sum(axis=0)  # (n,)
    return dx, dw, db


# ---------------------------------------------------------------------------------------------
# Dropout with counter-based masks over GLOBAL coordinates (any sharding draws the same mask)

_MASK64 = (1 << 64) - 1
_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # splitmix64 increment (golden ratio)


def _splitmix64(z):
    """splitmix64 finalizer (Steele, Lea, Flood 2014) on uint64 arrays; wraps mod 2^64."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def keep_mask(p, seed, site, starts, shape):
    """Bool mask; element idx has global coordinates starts + idx: keep = U(seed, site, coords) >= p.

    U is a splitmix64 chain over (seed, site, c_0, c_1, ...) mapped to [0, 1); p = 0 keeps all.
    A start may be an array of the axis's coordinates (n,): a context-parallel rank's rows.
    """
    shape = tuple(int(n) for n in shape)
    assert len(starts) == len(shape), "one start per dimension"
    if p == 0.0:
        return np.ones(shape, dtype=bool)
    with np.errstate(over="ignore"):
        h = _splitmix64(np.array([seed & _MASK64], dtype=np.uint64) + _GAMMA)  # (1,)
        h = _splitmix64(h ^ _splitmix64(np.array([site & _MASK64], dtype=np.uint64) + _GAMMA))
        h = h.reshape((1,) * len(shape))  # (1, ..., 1)
        for axis, (start, n) in enumerate(zip(starts, shape)):
            coord = (np.arange(start, start + n, dtype=np.int64) if np.ndim(start) == 0
                     else np.asarray(start, dtype=np.int64)).astype(np.uint64)  # (n,)
            view = [1] * len(shape)
            view[axis] = n
            h = _splitmix64(h ^ _splitmix64(coord + _GAMMA).reshape(view))  # broadcast grows
        uniform = (h >> np.uint64(11)).astype(np.float64) * 2.0**-53  # shape, in [0, 1)
    return uniform >= p  # shape


def dropout_forward(x, keep, p):
    """x * keep / (1 - p) (inverted dropout, as Megatron/torch)."""
    return x * keep / (1.0 - p)  # (...)


def dropout_backward(dy, keep, p):
    """dx = dy * keep / (1 - p)."""
    return dy * keep / (1.0 - p)  # (...)
