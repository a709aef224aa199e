"""benchmarks/estimate_constants.py measures every constant of the work estimate
(simsp/scenario/work_constants.py) from the counts each multiplies: every CPU-second and byte
constant is in one of its groups, and the counts it reads off the estimate (one evaluation with a
unit symbol in each constant's place) give back run's estimate at the constants' values."""

import sys
from pathlib import Path

import pytest

import simsp.scenario.work_constants as constants
from simsp.scenario.loading import load_scenario
from simsp.scenario.work import meta_bytes, numeric_seconds
from simsp.shortcuts.record_counts import dp_ring_records
from simsp.shortcuts.work_counts import run_ranks, run_seconds
from simsp.training.driver.iteration import Shortcuts

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from estimate_constants import INVERSE, constant_names, counts, current_values  # noqa: E402

LIMITS = {"TIME_LIMIT_S", "MEMORY_LIMIT_BYTES"}  # the limits, chosen, not measured


def test_every_constant_is_measured_by_a_group():
    """A constant added to work_constants.py without a measuring run fails here."""
    defined = {name for name in vars(constants) if name.isupper()} - LIMITS
    measured = {name.partition("[")[0] for name in constant_names()}
    assert measured == defined
    per_key = {name.partition("[")[2].rstrip("]") for name in constant_names()
               if name.startswith("EP_SECONDS_PER_RANK_PAIR[")}
    assert per_key == set(constants.EP_SECONDS_PER_RANK_PAIR)


@pytest.mark.parametrize("scenario, overrides", [
    ("scenarios/tiny.toml", {("run", "mode"): "meta"}),
    ("scenarios/llama3-8b.toml", {("model", "mtp_num_layers"): 2}),
    ("scenarios/moe-tiny-cp.toml", {("run", "mode"): "meta"}),
    ("scenarios/mixtral-8x7b.toml", {}),
])
def test_counts_times_values_give_the_estimate(scenario, overrides):
    """Σ count × value over the constants equals run_seconds and meta_bytes (to rounding, with
    the shortcuts and without), and the constants are left as they were."""
    sc = load_scenario(scenario, overrides)
    shortcuts = Shortcuts.for_scale(sc)
    values = current_values()
    before = current_values(raw=True)
    for how, estimate in (("run", run_seconds(sc, shortcuts)),
                          ("bytes", meta_bytes(sc, shortcuts.representative,
                                               run_ranks(sc, shortcuts)))):
        terms = counts(sc, shortcuts, how)[how]
        assert sum(n * values[name] for name, n in terms.items()) == pytest.approx(estimate,
                                                                                  rel=1e-12)
    full = Shortcuts()  # --no-shortcuts: every rank, full_bytes' terms, the DP rings' records
    terms = counts(sc, full, "full-bytes")["full-bytes"]
    assert sum(n * values[name] for name, n in terms.items()) == pytest.approx(
        meta_bytes(sc, False, run_ranks(sc, full), records=dp_ring_records(sc, full)),
        rel=1e-12)
    assert current_values(raw=True) == before


def test_numeric_counts_fit_the_reciprocal_of_the_flop_rate():
    """numeric_seconds divides FLOPs by NUMERIC_FLOPS_PER_SECOND: its count is the FLOPs, fitted
    as seconds per FLOP (INVERSE)."""
    sc = load_scenario("scenarios/tiny.toml")
    terms = counts(sc, Shortcuts.for_scale(sc), "numeric")["numeric"]
    values = current_values()
    assert "NUMERIC_FLOPS_PER_SECOND" in INVERSE
    assert values["NUMERIC_FLOPS_PER_SECOND"] == 1 / constants.NUMERIC_FLOPS_PER_SECOND
    assert sum(n * values[name] for name, n in terms.items()) == pytest.approx(
        numeric_seconds(sc), rel=1e-12)
