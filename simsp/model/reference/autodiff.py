"""Reverse-mode differentiation of numpy code: the reference's backward pass.

The reference (this package) writes only the forward math of each block; its gradients come
from this tape, so no backward formula is written twice (once in the simulated kernels, once
here). Each primitive's vector-Jacobian product is the calculus rule of one numpy operation
(Griewank & Walther, Evaluating Derivatives, 2nd ed., §3: the reverse mode), a line each, and
tests/test_reference_autodiff.py checks every one against central differences.

A Var holds a value (numpy array) and, after `backward`, its gradient. Arrays and Python
numbers mixed into an expression are constants. Values keep their dtype (constants are Python
floats or arrays of the value's dtype), as the simulated kernels do.
"""

import itertools

import numpy as np

_ORDER = itertools.count()  # creation order: a topological order of the graph


class Var:
    """One value of the computation, the inputs it was made from and its gradient."""

    __slots__ = ("value", "grad", "parents", "order", "needs_grad")

    def __init__(self, value, parents=(), needs_grad=None):
        self.value = np.asarray(value)
        self.parents = parents  # ((parent Var, vjp: grad -> parent's grad), ...)
        self.needs_grad = any(p.needs_grad for p, _ in parents) if needs_grad is None \
            else needs_grad
        self.grad = None
        self.order = next(_ORDER)

    shape = property(lambda self: self.value.shape)
    ndim = property(lambda self: self.value.ndim)
    dtype = property(lambda self: self.value.dtype)

    def __add__(self, other):
        return add(self, other)

    __radd__ = __add__

    def __sub__(self, other):
        return add(self, -other)

    def __rsub__(self, other):
        return add(other, neg(self))

    def __mul__(self, other):
        return mul(self, other)

    __rmul__ = __mul__

    def __truediv__(self, other):
        return mul(self, reciprocal(other) if isinstance(other, Var) else 1.0 / other)

    def __rtruediv__(self, other):
        return mul(other, reciprocal(self))

    def __neg__(self):
        return neg(self)

    def __matmul__(self, other):
        return matmul(self, other)

    def __rmatmul__(self, other):
        return matmul(other, self)

    def __getitem__(self, index):
        return take(self, index)

    def reshape(self, *shape):
        return reshape(self, shape[0] if len(shape) == 1 else shape)

    def transpose(self, *perm):
        return transpose(self, perm)

    def sum(self, axis=None, keepdims=False):
        return total(self, axis, keepdims)


def leaf(array) -> Var:
    """A variable the gradient is wanted for (a parameter, an input)."""
    return Var(array, needs_grad=True)


def _var(x) -> Var:
    """x as a Var: a constant unless it already is one."""
    return x if isinstance(x, Var) else Var(x, needs_grad=False)


def _pair(a, b) -> tuple[Var, Var]:
    """a and b as Vars, a Python number taking its partner's dtype (so float32 stays float32)."""
    if not isinstance(a, Var) and np.ndim(a) == 0 and isinstance(b, Var):
        a = np.asarray(a, dtype=b.dtype)
    if not isinstance(b, Var) and np.ndim(b) == 0 and isinstance(a, Var):
        b = np.asarray(b, dtype=a.dtype)
    return _var(a), _var(b)


def _unbroadcast(grad, shape):
    """Sum grad over the axes numpy broadcast to reach it from `shape`."""
    while grad.ndim > len(shape):
        grad = grad.sum(axis=0)
    for axis, n in enumerate(shape):
        if n == 1 and grad.shape[axis] != 1:
            grad = grad.sum(axis=axis, keepdims=True)
    return grad


def _node(value, *pairs) -> Var:
    """A result Var from (input, vjp) pairs."""
    return Var(value, tuple((p, vjp) for p, vjp in pairs))


def add(a, b) -> Var:
    a, b = _pair(a, b)
    return _node(a.value + b.value, (a, lambda g: _unbroadcast(g, a.shape)),
                 (b, lambda g: _unbroadcast(g, b.shape)))


def neg(a) -> Var:
    a = _var(a)
    return _node(-a.value, (a, lambda g: -g))


def mul(a, b) -> Var:
    a, b = _pair(a, b)
    return _node(a.value * b.value, (a, lambda g: _unbroadcast(g * b.value, a.shape)),
                 (b, lambda g: _unbroadcast(g * a.value, b.shape)))


def reciprocal(a) -> Var:
    a = _var(a)
    out = 1.0 / a.value
    return _node(out, (a, lambda g: -g * out * out))


def matmul(a, b) -> Var:
    """a @ b over the last two axes (leading axes broadcast)."""
    a, b = _var(a), _var(b)
    return _node(a.value @ b.value,
                 (a, lambda g: _unbroadcast(g @ np.swapaxes(b.value, -1, -2), a.shape)),
                 (b, lambda g: _unbroadcast(np.swapaxes(a.value, -1, -2) @ g, b.shape)))


def exp(a) -> Var:
    a = _var(a)
    out = np.exp(a.value)
    return _node(out, (a, lambda g: g * out))


def log(a) -> Var:
    a = _var(a)
    return _node(np.log(a.value), (a, lambda g: g / a.value))


def tanh(a) -> Var:
    a = _var(a)
    out = np.tanh(a.value)
    return _node(out, (a, lambda g: g * (1.0 - out * out)))


def sqrt(a) -> Var:
    a = _var(a)
    out = np.sqrt(a.value)
    return _node(out, (a, lambda g: g * 0.5 / out))


def total(a, axis=None, keepdims=False) -> Var:
    """Sum over `axis` (all axes when None)."""
    a = _var(a)

    def vjp(g):
        if not keepdims and axis is not None:
            g = np.expand_dims(g, axis)
        return np.broadcast_to(g, a.shape)

    return _node(a.value.sum(axis=axis, keepdims=keepdims), (a, vjp))


def mean(a, axis, keepdims=False) -> Var:
    """Average over one axis."""
    a = _var(a)
    return total(a, axis, keepdims) * (1.0 / a.shape[axis])


def reshape(a, shape) -> Var:
    a = _var(a)
    return _node(a.value.reshape(shape), (a, lambda g: g.reshape(a.shape)))


def transpose(a, perm) -> Var:
    a = _var(a)
    return _node(a.value.transpose(perm), (a, lambda g: g.transpose(np.argsort(perm))))


def take(a, index) -> Var:
    """a[index], basic or advanced indexing; repeated entries sum their gradients."""
    a = _var(a)

    def vjp(g):
        full = np.zeros(a.shape, dtype=g.dtype)
        np.add.at(full, index, g)
        return full

    return _node(a.value[index], (a, vjp))


def concatenate(parts, axis) -> Var:
    """numpy.concatenate of Vars (or constants) along `axis`."""
    parts = [_var(p) for p in parts]
    cuts = np.cumsum([p.shape[axis] for p in parts])[:-1]
    pieces = lambda g: np.split(g, cuts, axis=axis)
    value = np.concatenate([p.value for p in parts], axis=axis)
    return _node(value, *((p, lambda g, i=i: pieces(g)[i]) for i, p in enumerate(parts)))


def where(condition, a, b) -> Var:
    """a where the constant boolean `condition` holds, else b."""
    a, b = _pair(a, b)
    return _node(np.where(condition, a.value, b.value),
                 (a, lambda g: _unbroadcast(np.where(condition, g, 0.0), a.shape)),
                 (b, lambda g: _unbroadcast(np.where(condition, 0.0, g), b.shape)))


def backward(root: Var, seed) -> None:
    """Gradients of <root, seed> into every Var that needs one and that root depends on."""
    order, seen, stack = [], set(), [root]
    while stack:
        node = stack.pop()
        if id(node) in seen or not node.needs_grad:
            continue
        seen.add(id(node))
        order.append(node)
        stack.extend(p for p, _ in node.parents)
    root.grad = np.broadcast_to(np.asarray(seed, dtype=root.dtype), root.shape)
    for node in sorted(order, key=lambda n: n.order, reverse=True):
        if node.grad is None:
            continue
        for parent, vjp in node.parents:
            if parent.needs_grad:
                grad = vjp(node.grad)
                parent.grad = grad if parent.grad is None else parent.grad + grad
