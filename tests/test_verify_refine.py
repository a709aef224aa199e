"""verify's finite-difference criterion where the central difference meets its rounding floor
(training/driver/gradcheck.py checked_error, docs/MODEL.md#gradient-check-simsp-verify): a small
directional derivative beside an O(1) loss is re-differenced at fourth order, which a real
gradient error still fails; the stencil against closed forms."""

import math

import numpy as np
import pytest

from simsp.cli import main
from simsp.commands import verify
from simsp.commands.verify import FD_TOLERANCE
from simsp.scenario.loading import load_scenario
from simsp.training.driver import gradcheck
from simsp.training.driver.gradcheck import (EPSILON, REFINED_STEP, checked_error, fourth_order,
                                             gradient_check, relative_error, typical_derivative)

EPS64 = float(np.finfo(np.float64).eps)


def central_of(loss):
    """step -> the central difference of the scalar function `loss` at 0."""
    return lambda h: (loss(h) - loss(-h)) / (2 * h)


def test_fourth_order_is_exact_on_quartics_and_its_error_is_the_five_point_term():
    """Exact on a quartic up to rounding; on exp at 0 its error is −h⁴/30·f⁽⁵⁾(0) = −h⁴/30
    (Abramowitz & Stegun 25.3.6) to O(h⁶)."""
    quartic = central_of(lambda x: 2 * (0.7 + x) ** 4 - 3 * (0.7 + x) ** 3 + (0.7 + x))
    slope = 8 * 0.7 ** 3 - 9 * 0.7 ** 2 + 1  # d/dx at 0.7, by hand
    assert fourth_order(quartic, REFINED_STEP) == pytest.approx(slope, rel=1e-12, abs=1e-12)
    h = 1e-2  # rounding ~1e-14 far below the h^4/30 = 3.3e-10 truncation
    assert fourth_order(central_of(math.exp), h) - 1.0 == pytest.approx(-h ** 4 / 30, rel=1e-3)


def test_refined_step_balances_the_stencils_truncation_and_rounding():
    assert REFINED_STEP == pytest.approx(EPS64 ** 0.2) == pytest.approx(7.4e-4, rel=0.01)


# L(t) = fl(L0 + g·t + c·t³): an O(1) loss, a directional derivative g 4e6 times smaller, a
# cubic term the central difference truncates at c·ε² (6e-7 of g) and the stencil removes.
L0, G, C = 6.1, 1.6e-6, 0.01


def rounded_loss(t: float) -> float:
    return L0 + (G * t + C * t ** 3)


def test_a_derivative_at_the_rounding_floor_is_re_differenced_and_passes():
    central = central_of(rounded_loss)
    numeric = central(EPSILON)
    error, first = checked_error(numeric, G, central, FD_TOLERANCE)
    assert first == abs(numeric - G) / G > FD_TOLERANCE  # rounding of L0: ~1e-15/1e-5
    # the stencil's rounding: 18 values each within eps/2·|L0|, over 12h
    assert error <= 0.75 * EPS64 * L0 / REFINED_STEP / G < FD_TOLERANCE


@pytest.mark.parametrize("wrong", [1e-4, -1e-3, 1.0])
def test_a_wrong_gradient_still_fails_after_refinement(wrong):
    central = central_of(rounded_loss)
    error, first = checked_error(central(EPSILON), G * (1 + wrong), central, FD_TOLERANCE)
    assert first is not None and error == pytest.approx(abs(wrong) / (1 + max(wrong, 0)),
                                                        rel=0.05)


def test_no_refinement_below_the_tolerance_nor_without_one():
    def never(h):
        raise AssertionError("re-differenced")
    assert checked_error(1.0, 1.0 + 1e-7, never, FD_TOLERANCE) == (pytest.approx(1e-7), None)
    assert checked_error(1.0, 2.0, never, None) == (0.5, None)


def test_typical_derivative_is_the_rms_over_random_directions():
    """E[<g, u>²] = |g|²/n for u uniform on the unit sphere: 20000 draws within 5% (the mean
    of <g, u>² has relative spread ~sqrt(2/20000) = 1%)."""
    rng = np.random.default_rng(5)
    grad = rng.normal(size=(4, 4)) * np.arange(16).reshape(4, 4)  # (4, 4), uneven entries
    u = rng.normal(size=(20000, 16))
    u /= np.linalg.norm(u, axis=1, keepdims=True)  # (20000, 16) unit rows
    rms = float(np.sqrt(np.mean((u @ grad.ravel()) ** 2)))
    assert typical_derivative(grad) == pytest.approx(rms, rel=0.05)
    assert typical_derivative(grad) == pytest.approx(np.linalg.norm(grad) / 4, rel=1e-15)


def test_a_draw_nearly_orthogonal_to_the_gradient_is_judged_at_the_typical_size():
    """<g, u> = G by chance 60 times below its RMS 1e-4: the rounding of the difference is
    small beside the RMS, so no refinement; an error of 1e-3 of the RMS still fails."""
    central = central_of(rounded_loss)
    numeric = central(EPSILON)
    assert relative_error(numeric, G, 1e-4) == pytest.approx(abs(numeric - G) / 1e-4)
    error, first = checked_error(numeric, G, central, FD_TOLERANCE, typical=1e-4)
    assert first is None and error < FD_TOLERANCE
    error, first = checked_error(numeric, G + 1e-7, central, FD_TOLERANCE, typical=1e-4)
    assert first is not None and error == pytest.approx(1e-3, rel=0.01)


def test_gradient_check_re_differences_a_tensor_whose_first_difference_is_off(monkeypatch):
    """The default model, one tensor, its step-1e-5 difference 1% off (a rounding floor
    stand-in): recorded as refined, decided by the true fourth-order difference."""
    real = gradcheck._finite_difference

    def floored(sc, params, name, u, eps):
        return real(sc, params, name, u, eps) * (1 + (1e-2 if eps == EPSILON else 0.0))
    monkeypatch.setattr(gradcheck, "_finite_difference", floored)
    name = "layers.1.ln2.beta"
    check = gradient_check(load_scenario(), names=[name], refine_above=FD_TOLERANCE)
    assert set(check.refined) == {name} and check.refined[name] > FD_TOLERANCE
    assert check.errors[name] < 1e-7


def test_the_table_marks_a_re_differenced_tensor(monkeypatch, capsys):
    report = {"scenario": "default", "checked": ["a", "b"], "fd_errors": {"a": 1e-8, "b": 2e-7},
              "reference_errors": {"a": 1e-16, "b": 2e-16, "loss": 3e-16},
              "max_rel_err": 2e-7, "max_rel_err_vs_reference": 2e-16, "fd_epsilon": EPSILON,
              "fd_refined": {"b": 5.66e-5}, "fd_refined_step": REFINED_STEP, "passed": True}
    monkeypatch.setattr(verify, "verify_report", lambda sc, quiet: report)
    monkeypatch.setattr(verify, "check_work", lambda sc, **work: None)
    assert main(["verify", "--force"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("a ") and lines[2].rstrip().endswith("1.00e-16")
    assert "2.00e-07*" in lines[3]
    assert lines[4] == ("* fourth-order difference at step 7.4e-04: the step-1e-05 error was "
                        "above 1e-05 (b 5.66e-05)")
