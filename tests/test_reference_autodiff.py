"""The reference's reverse mode (simsp/model/reference/autodiff.py): every primitive's gradient
against central differences, dtype kept, and the reference package's imports (none of the
simulated kernels or ops)."""

import ast
from pathlib import Path

import numpy as np
import pytest

from simsp.model.reference import autodiff as ad

RNG = np.random.default_rng(5)
EPS = 1e-6


def numeric_gradient(f, arrays, cotangent):
    """d <f(arrays), cotangent> / d arrays by central differences, entry by entry."""
    grads = []
    for a in arrays:
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            old = a[idx]
            a[idx] = old + EPS
            plus = float((f(*arrays) * cotangent).sum())
            a[idx] = old - EPS
            minus = float((f(*arrays) * cotangent).sum())
            a[idx] = old
            g[idx] = (plus - minus) / (2 * EPS)
        grads.append(g)
    return grads


def check(op, *shapes, positive=False):
    """op's autodiff gradients of every input equal central differences to 1e-8."""
    arrays = [RNG.normal(size=s) + (3.0 if positive else 0.0) for s in shapes]
    leaves = [ad.leaf(a) for a in arrays]
    out = op(*leaves)
    cotangent = RNG.normal(size=out.shape)
    ad.backward((out * cotangent).sum(), 1.0)
    expected = numeric_gradient(lambda *xs: op(*[ad.Var(x) for x in xs]).value, arrays,
                                cotangent)
    for leaf, want in zip(leaves, expected):
        assert np.allclose(leaf.grad, want, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("op, shapes", [
    (lambda a, b: a + b, [(3, 4), (4,)]),
    (lambda a, b: a - b, [(3, 1), (3, 4)]),
    (lambda a, b: a * b, [(2, 3, 4), (3, 1)]),
    (lambda a, b: a / b, [(3, 4), (3, 4)]),
    (lambda a, b: a @ b, [(2, 3, 4), (4, 5)]),
    (lambda a, b: a @ b, [(2, 3, 4), (2, 4, 2)]),
    (lambda a: ad.exp(a), [(3, 4)]),
    (lambda a: ad.tanh(a), [(3, 4)]),
    (lambda a: -a, [(3,)]),
    (lambda a: a.sum(axis=1), [(3, 4)]),
    (lambda a: a.sum(axis=0, keepdims=True), [(3, 4)]),
    (lambda a: ad.mean(a, -1, keepdims=True), [(3, 4)]),
    (lambda a: a.reshape(4, 3).transpose(1, 0), [(3, 4)]),
    (lambda a: a[:, 1:3], [(3, 4)]),
    (lambda a: a[np.array([0, 2, 0]), np.array([1, 1, 1])], [(3, 4)]),  # repeats sum
    (lambda a, b: ad.concatenate([a, b, a], axis=1), [(2, 3), (2, 1)]),
    (lambda a, b: ad.where(np.array([True, False, True]), a, b), [(2, 3), (2, 3)]),
    (lambda a: 2.0 - 1.0 / (a + 0.5) * 3.0, [(3,)]),
])
def test_primitive_gradients_match_central_differences(op, shapes):
    check(op, *shapes)


@pytest.mark.parametrize("op", [ad.log, ad.sqrt])
def test_gradients_on_positive_inputs(op):
    check(op, (3, 4), positive=True)


def test_gradient_reaches_a_value_used_twice_and_skips_constants():
    x = ad.leaf(np.array([2.0, 3.0]))
    y = x * x + x * np.array([1.0, 1.0])  # x² + x
    ad.backward(y.sum(), 1.0)
    assert np.array_equal(x.grad, [5.0, 7.0])  # 2x + 1, by hand


def test_float32_stays_float32():
    x = ad.leaf(np.ones((2, 3), dtype=np.float32))
    y = ad.exp(x * 2.0 + 1.0) / 3.0 - ad.sqrt(x + 0.5)
    ad.backward(y.sum(), 1.0)
    assert y.dtype == np.float32 and x.grad.dtype == np.float32


def test_reference_imports_no_simulated_kernel():
    """The reference reads nothing of simsp but itself and the dropout masks' definition."""
    package = Path(__file__).resolve().parent.parent / "simsp" / "model" / "reference"
    allowed_outside = {"numpy", "math", "itertools", "dataclasses"}
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module]
            else:
                continue
            for name in names:
                assert (name in allowed_outside or name.startswith("simsp.model.reference")
                        or name.endswith(".dropout_sites")), f"{path.name} imports {name}"
