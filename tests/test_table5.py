"""End-to-end iteration time of the paper scenarios vs K22 Table 5, and MFU/HFU as K22 computes
them (K22 Table 5, docs/MODEL.md#paper-layouts: the 22B and 175B rows are the calibration rows)."""

import functools
from pathlib import Path

import pytest

from simsp import analytic
from simsp.scenario.loading import load_scenario
from simsp.metrics.collect import collect
from simsp.training.driver.iteration import Shortcuts, simulate_iteration

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
FULL_RECOMPUTE = {("parallel", "recompute_granularity"): "full",
                  ("parallel", "sequence_parallel"): False}
# model -> (full recompute s, present work s, MFU, HFU) from K22 Table 5
TABLE5 = {"22b": (1.42, 1.10, 0.415, 0.437), "175b": (18.13, 13.75, 0.514, 0.528)}
# The error each row achieves (simsp / published - 1), pinned: a mechanism that moves one by more
# than MARGIN must update it here and say why in its commit (a 5% slower GEMM moves each ~+4%).
# NCCL's protocol choice and base latency (engine/collectives/nccl_tuning.py) moved them from -5.44, -3.85,
# -5.13, -3.37%; later rounds (the gradient scaling kernel, ...) to -4.97, -3.39, -4.36, -2.75%;
# Megatron's gradient-buffer zeroing and gradient norm each iteration and the word embedding's
# dense gradient (docs/hardware.md §6, "The t = 1 rows taken apart") by +12.7 ms (22B) and
# +20.5 ms (175B) to these.
ACHIEVED = {("22b", "present"): -0.0381, ("22b", "full"): -0.0250,
            ("175b", "present"): -0.0421, ("175b", "full"): -0.0264}
MARGIN = 0.01


def metrics_of(sc):
    shortcuts = Shortcuts.for_scale(sc)
    return collect(simulate_iteration(sc, shortcuts), shortcuts)


@functools.lru_cache(maxsize=None)
def paper_run(model: str, variant: str):
    """(scenario, metrics) of a paper scenario, simulated once per test session."""
    overrides = FULL_RECOMPUTE if variant == "full" else {}
    sc = load_scenario(SCENARIOS / f"paper-{model}.toml", overrides)
    return sc, metrics_of(sc)


@pytest.mark.parametrize("model", sorted(TABLE5))
@pytest.mark.parametrize("variant", ["present", "full"])
def test_iteration_time_error_against_table5_is_the_achieved_one(model, variant):
    full_s, present_s, _, _ = TABLE5[model]
    published = full_s if variant == "full" else present_s
    measured = paper_run(model, variant)[1]["iteration_time_s"]
    error = measured / published - 1
    assert abs(error - ACHIEVED[model, variant]) <= MARGIN, (error, ACHIEVED[model, variant])


@pytest.mark.parametrize("model", sorted(TABLE5))
@pytest.mark.parametrize("variant", ["present", "full"])
def test_first_stage_activations_equal_the_formula_on_paper_layouts(model, variant):
    """Stage 0's ledger peak vs K22's first-stage formula with its embedding/head terms."""
    sc, metrics = paper_run(model, variant)
    measured = metrics["ranks"][0]["activation_peak_bytes"]
    # exact to the byte since the interleaved peak counts chunk 0's 2p embedding masks (0.02%
    # and 0.35% under on 175B, present and full recompute, with 2p − 1)
    assert measured == analytic.first_stage_activation_bytes(sc)


@pytest.mark.parametrize("model", sorted(TABLE5))
def test_mfu_and_hfu_formulas_reproduce_the_published_percentages(model):
    """K22's own iteration time through our MFU/HFU formulas gives K22's own MFU/HFU."""
    sc = load_scenario(SCENARIOS / f"paper-{model}.toml")
    _, present_s, mfu, hfu = TABLE5[model]
    gpu_seconds = present_s * sc.parallel.world_size * 312e12
    assert analytic.model_flops(sc.model, sc.parallel) / gpu_seconds == pytest.approx(mfu, abs=0.002)
    assert analytic.hardware_flops(sc.model, sc.parallel) / gpu_seconds == pytest.approx(hfu, abs=0.002)


def test_reported_mfu_uses_the_simulated_time():
    sc = load_scenario(SCENARIOS / "paper-22b.toml")
    m = metrics_of(sc)
    gpu_seconds = m["iteration_time_s"] * sc.parallel.world_size * 312e12
    assert m["mfu"] == pytest.approx(m["model_flops"] / gpu_seconds, rel=1e-12)
    assert m["hfu"] == pytest.approx(m["hardware_flops"] / gpu_seconds, rel=1e-12)
    assert m["tokens_per_s"] == pytest.approx(4 * 2048 / m["iteration_time_s"], rel=1e-12)
