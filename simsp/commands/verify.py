"""`simsp verify`: the small GPT's gradients on the emulated ranks vs finite differences and vs
the single-device reference, in numeric mode."""

from simsp.scenario.work import check_work
from simsp.errors import UserError
from simsp.scenario.flags import add_scenario_arguments
from simsp.scenario.outside import scenario_from_args
from simsp.progress import track
import numpy as np

from simsp.jsonout import dumps
from simsp.model.params import param_shapes

# Directional derivatives <g, u>, float64: the error of the central difference at ε = 1e-5
# relative to max(|difference|, |<g, u>|, |g|/sqrt(n)), or, where that is above this, of the
# fourth-order difference at gradcheck.REFINED_STEP (7.4e-4), whose rounding floor is ~50
# times lower (docs/MODEL.md#gradient-check-simsp-verify).
FD_TOLERANCE = 1e-5
REFERENCE_TOLERANCE = 1e-10  # same math in another order: rounding only
# Sums in another order over n <= 1024 terms differ by at most n*eps_mach (Higham, Accuracy and
# Stability of Numerical Algorithms §4.2): the reference tolerance in a dtype whose rounding
# exceeds float64's; for float64 REFERENCE_TOLERANCE (above 1024*eps64) stays.
SUMMATION_TERMS = 1024
# Whole iterations per checked tensor: the central difference's L(θ ± εu), and the fourth-order
# stencil's L(θ ± hu), L(θ ± 2hu) where it re-differences (gradcheck.fourth_order)
CENTRAL_ITERATIONS, REFINED_ITERATIONS = 2, 4


def tolerances(dtype) -> dict:
    """float64: relative errors 1e-5 (finite differences, re-differenced at fourth order above
    it) and 1e-10 (reference). float32: every finite difference within its rounding bound
    (ratio <= 1, gradcheck.rounding_bound) and the reference within SUMMATION_TERMS *
    eps_mach."""
    if np.dtype(dtype) == np.float64:
        return {"finite_difference": FD_TOLERANCE, "reference": REFERENCE_TOLERANCE}
    reference = max(REFERENCE_TOLERANCE, SUMMATION_TERMS * float(np.finfo(dtype).eps))
    return {"finite_difference_bound_ratio": 1.0, "reference": reference}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("verify", help="gradient check of the parallel numeric GPT")
    add_scenario_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(handler=run)


def checked_tensors(sc) -> int:
    """Tensors verify checks: every parameter of the padded model (the names the gathered
    gradients carry, training/driver/compare.py) and the embedding output."""
    return len(param_shapes(sc.padded_model)) + 1


def _iterations(sc) -> tuple[int, int]:
    """(fewest, most) whole iterations verify simulates: under FP8 one (the reference errors);
    else one for the gradients, one against the reference and CENTRAL_ITERATIONS per checked
    tensor, and, in float64, REFINED_ITERATIONS more per tensor re-differenced (any may be)."""
    if sc.parallel.fp8_format is not None:
        return 1, 1
    tensors = checked_tensors(sc)
    fewest = 2 + CENTRAL_ITERATIONS * tensors
    refined = "finite_difference" in tolerances(sc.run.numeric_dtype)
    return fewest, fewest + (REFINED_ITERATIONS * tensors if refined else 0)


def _worst_case(sc) -> str:
    """check_work's account of the most iterations where it exceeds the fewest (else "")."""
    fewest, most = _iterations(sc)
    if most == fewest:
        return ""
    return (f"{CENTRAL_ITERATIONS + REFINED_ITERATIONS} per checked tensor ({CENTRAL_ITERATIONS} "
            f"for its central difference, {REFINED_ITERATIONS} more if it is re-differenced at "
            f"fourth order) x {checked_tensors(sc)} tensors, + 2 for the gradients and the "
            f"reference; {fewest} if none is re-differenced")


def _reference_errors(sc) -> dict:
    """Every gradient of one simulated iteration against the single-device reference (the
    verify machinery is imported here, when a verify runs, not when the CLI is built)."""
    from simsp.training.driver.compare import compare_with_reference
    from simsp.training.driver.iteration import simulate_iteration
    return compare_with_reference(simulate_iteration(sc))


def fp8_report(sc) -> dict:
    """Under FP8 (emulated rounding, simsp/model/fp8.py) the error FP8 introduces: every
    gradient against the FP64 single-device reference, measured, not checked (finite differences
    of a rounded function say nothing)."""
    ref = _reference_errors(sc)
    return {"scenario": sc.run.name, "fp8_format": sc.parallel.fp8_format,
            "checked": [n for n in ref if n != "loss"],
            "max_rel_err_vs_reference": max(ref.values()), "reference_errors": ref,
            "passed": True}


def verify_report(sc, quiet: bool = True) -> dict:
    """Finite-difference and reference errors for every parameter and the input embeddings."""
    if sc.parallel.fp8_format is not None:
        return fp8_report(sc)
    from simsp.training.driver.gradcheck import REFINED_STEP, fd_epsilon, gradient_check
    limits = tolerances(sc.run.numeric_dtype)
    check = gradient_check(sc, track=lambda names: track(names, "gradient check", "param", quiet),
                           refine_above=limits.get("finite_difference"))
    fd, ratios = check.errors, check.ratios
    ref = _reference_errors(sc)
    worst_fd, worst_ref = max(fd.values()), max(ref.values())
    fd_ok = max(ratios.values()) <= 1.0 if "finite_difference_bound_ratio" in limits else \
        worst_fd <= limits["finite_difference"]
    return {
        "scenario": sc.run.name,
        "max_rel_err": worst_fd,
        "checked": list(fd),
        "max_rel_err_vs_reference": worst_ref,
        "fd_errors": fd,
        "reference_errors": ref,
        "fd_epsilon": fd_epsilon(sc.run.numeric_dtype),
        "fd_refined": check.refined,
        "fd_refined_step": REFINED_STEP,
        "fd_bound_ratio": max(ratios.values()),
        "tolerance": limits,
        "passed": bool(fd_ok and worst_ref <= limits["reference"]),
    }


def run(args) -> int:
    sc = scenario_from_args(args)
    if sc.run.mode != "numeric":
        raise UserError("run.mode", "verify needs numeric mode (--mode numeric)")
    check_work(sc, iterations=_iterations(sc)[1], force=args.force, worst_case=_worst_case(sc))
    report = verify_report(sc, getattr(args, "quiet", False))
    if args.json:
        print(dumps(report, indent=2))
    elif "fp8_format" in report:
        _print_fp8(sc, report)
    else:
        p = sc.parallel
        cp = f" cp={p.cp}" if p.cp > 1 else ""
        print(f"verify: t={p.tp}{cp} p={p.pp} d={p.dp} SP={p.sequence_parallel} "
              f"recompute={p.recompute_granularity} schedule={p.schedule_name}")
        print(f"{'tensor':<32}{'vs finite diff':>16}{'vs reference':>16}")
        refined = report["fd_refined"]
        for name in report["checked"]:
            mark = "*" if name in refined else " "
            print(f"{name:<32}{report['fd_errors'][name]:>15.2e}{mark}"
                  f"{report['reference_errors'].get(name, float('nan')):>16.2e}")
        if refined:
            firsts = ", ".join(f"{name} {err:.2e}" for name, err in refined.items())
            print(f"* fourth-order difference at step {report['fd_refined_step']:.1e}: the "
                  f"step-{report['fd_epsilon']:.0e} error was above {FD_TOLERANCE:.0e} "
                  f"({firsts})")
        print(f"loss vs reference: {report['reference_errors']['loss']:.2e}")
        print(f"worst: {report['max_rel_err']:.2e} (finite differences), "
              f"{report['max_rel_err_vs_reference']:.2e} (reference): "
              f"{'PASS' if report['passed'] else 'FAIL'}")
    return 0 if report["passed"] else 1


def _print_fp8(sc, report: dict) -> None:
    """The FP8 error per tensor against the FP64 reference."""
    print(f"verify: FP8 {report['fp8_format']} emulated (E4M3 activations and weights"
          f"{', E5M2 gradients' if report['fp8_format'] == 'hybrid' else ', E4M3 gradients'}; "
          f"per-tensor current scaling) against the FP64 single-device reference")
    print(f"{'tensor':<32}{'vs reference':>16}")
    for name in report["checked"]:
        print(f"{name:<32}{report['reference_errors'][name]:>16.2e}")
    print(f"loss vs reference: {report['reference_errors']['loss']:.2e}")
    print(f"worst: {report['max_rel_err_vs_reference']:.2e}: the error FP8 introduces "
          f"(measured, not checked against a tolerance)")
