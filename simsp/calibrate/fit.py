"""Least-squares fit of link parameters to measured collective times, tier by tier.

For a fixed layout the engine's time is a sum over ring steps of the slowest hop's
latency + chunk / (bandwidth x efficiency): piecewise affine in (latency, 1/efficiency), affine
wherever the slowest hop of each step does not change. So we fit x = (1/efficiency, latency)
by Gauss-Newton on the relative errors, with a Jacobian taken by finite differences of the
engine itself (exact inside a piece; convergence in one step once the pieces settle).

Identifiability: within one tier every ring step pays (route latency + transfer_overhead_us),
so the per-hop latency and the per-step overhead are collinear (and so is any per-call launch
cost, which the model does not have: it is absorbed in the latency). We fit the tier's link
latency and hold transfer_overhead_us at the base value; the identifiable quantity is the
per-step latency, reported as well. Efficiency is bounded to (0, 1] and latency to >= 0 (the
config's checks); a parameter that reaches a bound is held there.

Cost: an evaluation of the engine can run step-by-step rings (engine/collectives/ring_alone.py: a ring whose
channels share a port), so the exact model is evaluated as few times as the fit allows. The fit
first runs on the closed form (engine/collectives/ring_timing.py, no simulation; exact where no link carries
two hops of a ring, an upper bound elsewhere), then polishes on the exact model from there: near
the answer and in its piece, that takes one Gauss-Newton step and a check. Every evaluation is
kept per parameter vector, so the Jacobian at the answer (standard errors) and the
identifiability test reuse what the iterations computed; the iteration stops when the step it
would take is below STEP_TOLERANCE, without evaluating it. `iterations` counts the exact steps.
"""

from dataclasses import dataclass

import numpy as np

from simsp.calibrate.layout import Measurement
from simsp.calibrate.link_model import link_values, predicted_times_s
from simsp.scenario.config import Cluster

TIER_PARAMETERS = {"intra": ("nvlink_efficiency", "nvlink_latency_us"),
                   "inter": ("ib_efficiency", "ib_latency_us")}
MAX_ITERATIONS = 60
RELATIVE_STEP = 1e-4  # finite-difference step, relative to the parameter (piecewise affine model)
AFFINE_TOLERANCE = 1e-10  # relative residual: a step's landing matches the affine model's
STEP_TOLERANCE = 1e-10  # relative to the variable: a smaller Gauss-Newton step is not taken


@dataclass(frozen=True)
class TierFit:
    """Result of fitting one tier: every link value afterwards, and what was fitted or held."""

    tier: str
    values: dict  # link field -> value after the fit
    fitted: tuple[str, ...]
    at_bound: tuple[str, ...]
    not_identifiable: tuple[str, ...]
    std_errors: dict  # fitted field -> 1-sigma standard error, from the residuals
    rms_relative_error: float
    iterations: int


def to_x(name: str, value: float) -> float:
    """Fit variable of a field: 1/efficiency for efficiencies (time is affine in it)."""
    return 1.0 / value if name.endswith("efficiency") else value


def from_x(name: str, x: float) -> float:
    """Field value of a fit variable."""
    return 1.0 / x if name.endswith("efficiency") else x


def lower_bound(name: str) -> float:
    """Bound of the fit variable: efficiency <= 1 means 1/efficiency >= 1; latency >= 0."""
    return 1.0 if name.endswith("efficiency") else 0.0


class TierProblem:
    """Relative residuals of a tier's measurements as a function of its free fit variables."""

    def __init__(self, base: Cluster, links: dict, measurements: list[Measurement],
                 names: tuple[str, ...], exact: bool = True):
        self.base, self.links, self.measurements, self.names = base, dict(links), measurements, names
        self.exact = exact  # the model: ring alone (exact) or its closed form (link_model)
        self.measured = np.concatenate([np.array(m.times_s) for m in measurements])  # (obs,)
        self.evaluated: dict[bytes, np.ndarray] = {}  # x.tobytes() -> residuals (obs,)

    def values(self, x: np.ndarray) -> dict:
        """Link fields with the free ones set from `x` (shape (len(names),))."""
        return {**self.links, **{n: from_x(n, float(v)) for n, v in zip(self.names, x)}}

    def predicted(self, x: np.ndarray) -> np.ndarray:
        """Engine times of every observation, shape (obs,)."""
        links = self.values(x)
        return np.concatenate([predicted_times_s(self.base, m, links, self.exact)
                               for m in self.measurements])

    def residuals(self, x: np.ndarray) -> np.ndarray:
        """(predicted - measured) / measured, shape (obs,); each x evaluated once."""
        key = np.asarray(x, dtype=float).tobytes()
        if key not in self.evaluated:
            self.evaluated[key] = self.predicted(x) / self.measured - 1.0
        return self.evaluated[key]

    def jacobian(self, x: np.ndarray, r: np.ndarray) -> np.ndarray:
        """d residuals / d x by forward differences, shape (obs, len(x))."""
        columns = []
        for j in range(len(x)):
            step = RELATIVE_STEP * max(abs(x[j]), 1e-2)
            moved = x.copy()
            moved[j] += step
            columns.append((self.residuals(moved) - r) / step)
        return np.stack(columns, axis=1)


def gauss_newton(problem: TierProblem, x: np.ndarray, free: np.ndarray) -> tuple:
    """Minimise |residuals|^2 over the `free` variables (bool mask, shape (k,)); a variable
    pushed past its bound is clipped and frozen there. Stops when the step is below tolerance
    (or cannot improve the fit). Returns (x, free, J, r, iterations)."""
    bounds = np.array([lower_bound(n) for n in problem.names])  # (k,)
    r = problem.residuals(x)
    for iteration in range(1, MAX_ITERATIONS + 1):
        J = problem.jacobian(x, r)  # (obs, k)
        delta = np.zeros_like(x)
        if free.any():
            delta[free] = np.linalg.lstsq(J[:, free], -r, rcond=None)[0]
        if np.all(np.abs(delta) <= STEP_TOLERANCE * (1 + np.abs(x))):
            break
        x_new, r_new = _damped_step(problem, x, delta, r, bounds)
        hit = free & (x_new <= bounds)
        free = free & ~hit
        stalled = np.array_equal(x_new, x)
        affine = np.array_equal(x_new, x + delta) and _affine_between(r, J, delta, r_new)
        x, r = x_new, r_new
        if affine and not hit.any():
            return x, free, J, r, iteration  # the least-squares point of the model's piece
        if stalled and not hit.any():
            break
    return x, free, problem.jacobian(x, r), r, iteration


def _affine_between(r: np.ndarray, J: np.ndarray, delta: np.ndarray, r_new: np.ndarray) -> bool:
    """Did the full step land where the affine model r + J delta said (to AFFINE_TOLERANCE)?
    Then the model is that affine piece from x to x + delta, x + delta is the piece's
    least-squares point and J its Jacobian there too: nothing is left to evaluate."""
    return bool(np.max(np.abs(r_new - (r + J @ delta))) <= AFFINE_TOLERANCE)


def _damped_step(problem: TierProblem, x, delta, r, bounds) -> tuple:
    """Take the Gauss-Newton step, halving it while it makes the fit worse; clip to bounds."""
    cost = float(r @ r)
    scale = 1.0
    while scale > 1e-6:
        trial = np.maximum(x + scale * delta, bounds)
        r_trial = problem.residuals(trial)
        if float(r_trial @ r_trial) <= cost:
            return trial, r_trial
        scale /= 2
    return x, r


def fit_tier(base: Cluster, links: dict, measurements: list[Measurement], tier: str) -> TierFit:
    """Fit the tier's efficiency and latency to its measurements, the other fields held: on
    the closed form from the base values, then on the exact model from there."""
    names = TIER_PARAMETERS[tier]
    x0 = np.array([to_x(n, links[n]) for n in names])  # (k,)
    closed = TierProblem(base, links, measurements, names, exact=False)
    start, _free, _J, _r, _it = gauss_newton(closed, x0, _identifiable(closed, x0))
    problem = TierProblem(base, links, measurements, names)
    identifiable = _identifiable(problem, start)
    x, free, J, r, iterations = gauss_newton(problem, start, identifiable.copy())
    at_bound = tuple(n for n, f, i in zip(names, free, identifiable) if i and not f)
    return TierFit(tier, problem.values(x), tuple(n for n, f in zip(names, free) if f), at_bound,
                   tuple(n for n, i in zip(names, identifiable) if not i),
                   _std_errors(names, x, free, J, r), float(np.sqrt(np.mean(r ** 2))), iterations)


def _identifiable(problem: TierProblem, x: np.ndarray) -> np.ndarray:
    """Which variables move the residuals at x (bool, shape (k,))."""
    return np.linalg.norm(problem.jacobian(x, problem.residuals(x)), axis=0) > 1e-9


def _std_errors(names, x: np.ndarray, free: np.ndarray, J: np.ndarray, r: np.ndarray) -> dict:
    """1-sigma errors of the fitted fields: s^2 (J^T J)^-1 with s^2 = |r|^2 / (obs - k), carried
    to efficiency by the delta method (d eff = d x / x^2)."""
    k = int(free.sum())
    if k == 0 or len(r) <= k:
        return {}
    covariance = float(r @ r) / (len(r) - k) * np.linalg.pinv(J[:, free].T @ J[:, free])  # (k, k)
    sigma_x = np.sqrt(np.diag(covariance))  # (k,)
    fitted = [(n, xv) for n, xv, f in zip(names, x, free) if f]
    return {n: float(s / xv ** 2 if n.endswith("efficiency") else s)
            for (n, xv), s in zip(fitted, sigma_x)}


def calibrate(base: Cluster, measurements: list[Measurement]) -> tuple[dict, list[TierFit]]:
    """Fit the intra-node tier on one-node runs, then the inter-node tier on multi-node runs
    with the NVLink values just fitted (or base's). Returns (final link values, tier fits)."""
    links, fits = link_values(base), []
    for tier in TIER_PARAMETERS:
        chosen = [m for m in measurements if m.tier == tier]
        if chosen:
            fits.append(fit_tier(base, links, chosen, tier))
            links = dict(fits[-1].values)
    return links, fits
