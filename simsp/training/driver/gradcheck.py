"""Finite-difference check of simsp's own parallel model: its gradients vs central differences.

For each parameter tensor (and the embedding output) a random unit direction u is drawn and
the directional derivative (L(θ+εu) − L(θ−εu)) / 2ε is compared with <∇L, u> from the simulated
backward pass, each loss coming from a whole simulated iteration on the emulated ranks, the
error relative to the larger of the two and of |∇L|/sqrt(n), <∇L, u>'s RMS over directions.
Where that relative error is above the caller's tolerance, the tensor is differenced again with the
fourth-order stencil at REFINED_STEP, and that more accurate difference decides
(docs/MODEL.md#gradient-check-simsp-verify).
"""

from dataclasses import dataclass, field
from functools import partial

import numpy as np

from simsp.scenario.config import Scenario
from simsp.model.params import init_params
from simsp.training.driver.compare import embedding_output_grad, gathered_grads
from simsp.training.driver.iteration import simulate_iteration

EPSILON = 1e-5  # float64 step: truncation eps^2 ~ 1e-10 and rounding 1e-16/eps ~ 1e-11 both tiny
EMBEDDING_OUTPUT = "embedding_output"
# The fourth-order stencil's step: its truncation h^4*|L^(5)|/30 against its rounding
# ~eps_mach*|L|/h balances at h ~ eps_mach^(1/5) (the same balance that gives the central
# difference's eps_mach^(1/3), Numerical Recipes §5.7); float64: 7.4e-4.
REFINED_STEP = float(np.finfo(np.float64).eps) ** (1 / 5)


def fd_epsilon(dtype) -> float:
    """Central-difference step for the numeric dtype: EPSILON in float64; in float32 the step
    eps_mach^(1/3) ~ 4.9e-3 that balances truncation (~eps^2) against rounding (~eps_mach/eps)
    (Numerical Recipes §5.7)."""
    if np.dtype(dtype) == np.float64:
        return EPSILON
    return float(np.finfo(dtype).eps) ** (1 / 3)


def rounding_bound(dtype, eps: float, loss: float, grad: np.ndarray, value_norm: float,
                   exact: float) -> float:
    """Largest |finite difference - <grad, u>| rounding and truncation explain (float32):
    theta +- eps*u is rounded by eps_mach*|theta|, which moves L by up to
    eps_mach*|grad|*|theta|; the loss itself is rounded by ~eps_mach*|L|; both are divided by
    the step. Truncation adds ~eps^2 relative to the directional derivative."""
    machine = float(np.finfo(dtype).eps)
    return machine * (float(np.linalg.norm(grad)) * value_norm + abs(loss)) / eps + \
        eps ** 2 * abs(exact)


def _direction(rng, shape) -> np.ndarray:
    u = rng.normal(size=shape)
    return u / np.linalg.norm(u)


def _loss(sc: Scenario, params: dict, delta=None) -> float:
    return simulate_iteration(sc, canonical=params, embedding_delta=delta).objective


def _finite_difference(sc, params, name: str, u: np.ndarray, eps: float = EPSILON) -> float:
    """Central difference of the loss along u, for a parameter or the embedding output."""
    if name == EMBEDDING_OUTPUT:
        return (_loss(sc, params, eps * u) - _loss(sc, params, -eps * u)) / (2 * eps)
    plus, minus = dict(params), dict(params)
    plus[name], minus[name] = params[name] + eps * u, params[name] - eps * u
    return (_loss(sc, plus) - _loss(sc, minus)) / (2 * eps)


def relative_error(numeric: float, exact: float, typical: float = 0.0) -> float:
    """|numeric − exact| relative to the largest of the two and `typical`, the directional
    derivative's RMS over random directions (1e-12 when all vanish)."""
    return abs(numeric - exact) / max(abs(numeric), abs(exact), typical, 1e-12)


def typical_derivative(grad: np.ndarray) -> float:
    """|grad| / sqrt(n): the RMS of <grad, u> over unit directions u uniform on the sphere
    (E[u uᵀ] = I/n), the size a draw's <grad, u> has unless u is nearly orthogonal to grad."""
    return float(np.linalg.norm(grad)) / float(np.sqrt(grad.size))


def fourth_order(central, h: float) -> float:
    """Richardson's extrapolation of the central differences `central(step)` at h and 2h:
    (4·D(h) − D(2h))/3 = (8[L(+h) − L(−h)] − [L(+2h) − L(−2h)]) / 12h, the five-point
    derivative, truncation h^4·L^(5)/30 (Abramowitz & Stegun 25.3.6)."""
    return (4 * central(h) - central(2 * h)) / 3


def checked_error(numeric: float, exact: float, central, refine_above: float | None,
                  typical: float = 0.0) -> tuple[float, float | None]:
    """(relative error of `exact` against the deciding difference, the first difference's
    error where the fourth-order difference `central` gives at REFINED_STEP decided instead,
    else None): refined when `numeric`'s error is above refine_above, its rounding floor
    ~eps_mach·|L|/eps being then comparable to the derivative checked."""
    first = relative_error(numeric, exact, typical)
    if refine_above is None or first <= refine_above:
        return first, None
    return relative_error(fourth_order(central, REFINED_STEP), exact, typical), first


@dataclass
class FdCheck:
    """A gradient check's figures per tensor: the deciding relative error, |error| /
    rounding_bound at the first step, and the first step's error of the re-differenced."""
    errors: dict = field(default_factory=dict)
    ratios: dict = field(default_factory=dict)
    refined: dict = field(default_factory=dict)


def gradient_check(sc: Scenario, names: list[str] | None = None, track=list,
                   refine_above: float | None = None) -> FdCheck:
    """Every chosen tensor's <grad, u> against the finite difference at the dtype's step
    fd_epsilon, re-differenced at fourth order where the error is above refine_above (None:
    never); `track` may wrap the list of names (a progress bar of tensors checked)."""
    dtype = np.dtype(sc.run.numeric_dtype)
    eps = fd_epsilon(dtype)
    params = init_params(sc.padded_model, sc.run.seed, dtype)
    run = simulate_iteration(sc, canonical=params)
    analytic = gathered_grads(run)
    analytic[EMBEDDING_OUTPUT] = embedding_output_grad(sc, run.results)
    rng = np.random.default_rng(sc.run.seed + 99)
    check = FdCheck()
    for name in track(names or list(analytic)):
        u = _direction(rng, analytic[name].shape)
        exact = float(np.sum(analytic[name] * u))
        numeric = _finite_difference(sc, params, name, u, eps)
        central = partial(_finite_difference, sc, params, name, u)  # step -> difference
        check.errors[name], first = checked_error(numeric, exact, central, refine_above,
                                                  typical_derivative(analytic[name]))
        if first is not None:
            check.refined[name] = first
        norm = float(np.linalg.norm(params[name])) if name in params else 1.0
        bound = rounding_bound(dtype, eps, run.loss, analytic[name], norm, exact)
        check.ratios[name] = abs(numeric - exact) / max(bound, np.finfo(dtype).tiny)
    return check

