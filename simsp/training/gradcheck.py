"""Finite-difference check of simsp's own parallel model: its gradients vs central differences.

For each parameter tensor (and the embedding output) a random unit direction u is drawn and
the directional derivative (L(θ+εu) − L(θ−εu)) / 2ε is compared with <∇L, u> from the simulated
backward pass, each loss coming from a whole simulated iteration on the emulated ranks.
"""

import numpy as np

from simsp.config import Scenario
from simsp.model.params import init_params
from simsp.training.compare import embedding_output_grad, gathered_grads
from simsp.training.iteration import simulate_iteration

EPSILON = 1e-5
EMBEDDING_OUTPUT = "embedding_output"


def _direction(rng, shape) -> np.ndarray:
    u = rng.normal(size=shape)
    return u / np.linalg.norm(u)


def _loss(sc: Scenario, params: dict, delta=None) -> float:
    return simulate_iteration(sc, canonical=params, embedding_delta=delta).loss


def _finite_difference(sc, params, name: str, u: np.ndarray) -> float:
    """Central difference of the loss along u, for a parameter or the embedding output."""
    if name == EMBEDDING_OUTPUT:
        return (_loss(sc, params, EPSILON * u) - _loss(sc, params, -EPSILON * u)) / (2 * EPSILON)
    plus, minus = dict(params), dict(params)
    plus[name], minus[name] = params[name] + EPSILON * u, params[name] - EPSILON * u
    return (_loss(sc, plus) - _loss(sc, minus)) / (2 * EPSILON)


def gradient_check(sc: Scenario, names: list[str] | None = None, track=list) -> dict:
    """{name: relative error of <grad, u> vs the finite difference} for the chosen tensors;
    `track` may wrap the list of names (a progress bar of tensors checked)."""
    params = init_params(sc.padded_model, sc.run.seed, np.dtype(sc.run.numeric_dtype))
    run = simulate_iteration(sc, canonical=params)
    analytic = gathered_grads(run)
    analytic[EMBEDDING_OUTPUT] = embedding_output_grad(run)
    rng = np.random.default_rng(sc.run.seed + 99)
    errors = {}
    for name in track(names or list(analytic)):
        u = _direction(rng, analytic[name].shape)
        exact = float(np.sum(analytic[name] * u))
        numeric = _finite_difference(sc, params, name, u)
        errors[name] = abs(numeric - exact) / max(abs(numeric), abs(exact), 1e-12)
    return errors
