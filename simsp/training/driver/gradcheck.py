"""Finite-difference check of simsp's own parallel model: its gradients vs central differences.

For each parameter tensor (and the embedding output) a random unit direction u is drawn and
the directional derivative (L(θ+εu) − L(θ−εu)) / 2ε is compared with <∇L, u> from the simulated
backward pass, each loss coming from a whole simulated iteration on the emulated ranks.
"""

import numpy as np

from simsp.scenario.config import Scenario
from simsp.model.params import init_params
from simsp.training.driver.compare import embedding_output_grad, gathered_grads
from simsp.training.driver.iteration import simulate_iteration

EPSILON = 1e-5  # float64 step: truncation eps^2 ~ 1e-10 and rounding 1e-16/eps ~ 1e-11 both tiny
EMBEDDING_OUTPUT = "embedding_output"


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


def gradient_check_with_bounds(sc: Scenario, names: list[str] | None = None,
                               track=list) -> tuple[dict, dict]:
    """({name: relative error of <grad, u> vs the finite difference}, {name: |error| /
    rounding_bound}) for the chosen tensors, with the dtype's step fd_epsilon; `track` may wrap
    the list of names (a progress bar of tensors checked)."""
    dtype = np.dtype(sc.run.numeric_dtype)
    eps = fd_epsilon(dtype)
    params = init_params(sc.padded_model, sc.run.seed, dtype)
    run = simulate_iteration(sc, canonical=params)
    analytic = gathered_grads(run)
    analytic[EMBEDDING_OUTPUT] = embedding_output_grad(sc, run.results)
    rng = np.random.default_rng(sc.run.seed + 99)
    errors, ratios = {}, {}
    for name in track(names or list(analytic)):
        u = _direction(rng, analytic[name].shape)
        exact = float(np.sum(analytic[name] * u))
        numeric = _finite_difference(sc, params, name, u, eps)
        errors[name] = abs(numeric - exact) / max(abs(numeric), abs(exact), 1e-12)
        norm = float(np.linalg.norm(params[name])) if name in params else 1.0
        bound = rounding_bound(dtype, eps, run.loss, analytic[name], norm, exact)
        ratios[name] = abs(numeric - exact) / max(bound, np.finfo(dtype).tiny)
    return errors, ratios
