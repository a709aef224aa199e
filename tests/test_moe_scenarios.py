"""The bundled MoE scenarios against their model cards, and Megatron's FLOPs of the simulated
model (simsp/model/flops.py megatron_flops) against the independent counts of
test_moe_flops.py's architectures and the dense formula of analytic.py."""

from pathlib import Path

import contextlib
from dataclasses import replace
import io

import pytest

from simsp import analytic
from simsp.cli import main
from simsp.scenario.loading import load_scenario
from simsp.model.blocks.moe.flops import moe_model_flops
from simsp.model.flops import megatron_flops
from simsp.model.param_counts import parameter_counts
from test_moe_params import DEEPSEEK_V3, MIXTRAL, QWEN3

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
# scenario: (architecture, published total and active in billions, whether the card rounds
# the active count (else it truncates it: the count lies in [active, active + last digit)))
PUBLISHED = {
    "mixtral-8x7b": (MIXTRAL, 46.7, 12.9, True),  # Mistral AI, arXiv 2401.04088
    "qwen3-30b-a3b": (QWEN3, 30.5, 3.3, False),  # Qwen3 card: "3.3B activated" (3.35B here)
    "deepseek-v3": (DEEPSEEK_V3, 671, 37, False),  # arXiv 2412.19437: "37B" (37.55B here)
}


def _last_digit(value: float) -> float:
    """The unit of a published figure's last printed digit: 46.7 -> 0.1, 671 -> 1."""
    text = f"{value:g}"
    return 10.0 ** -len(text.split(".")[1]) if "." in text else 1.0


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_total_and_active(name):
    """Totals to the card's rounding; actives to its printed digits (Qwen3 and DeepSeek print
    them truncated). Both include the embedding and the untied output layer; DeepSeek-V3's
    671B excludes its multi-token-prediction module, as simsp's model does."""
    _, total, active, rounded = PUBLISHED[name]
    counts = parameter_counts(load_scenario(SCENARIOS / f"{name}.toml").model)
    assert abs(counts["total"] / 1e9 - total) <= _last_digit(total) / 2
    unit = _last_digit(active)
    if rounded:
        assert abs(counts["active"] / 1e9 - active) <= unit / 2
    else:
        assert active <= counts["active"] / 1e9 < active + unit


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_scenario_counts_equal_the_independent_architecture_count(name):
    """The simulated shapes count what moe_params.py's formula counts, less what simsp leaves
    out of DeepSeek-V3's layers: nothing (the formula has no router bias either)."""
    from simsp.model.blocks.moe.params import parameter_counts as formula_counts
    arch = PUBLISHED[name][0]
    counts = parameter_counts(load_scenario(SCENARIOS / f"{name}.toml").model)
    assert (counts["total"], counts["active"]) == formula_counts(arch)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_flops_equal_the_architecture_count(name):
    """Without DeepSeek-V3's multi-token prediction depth (its terms: tests/test_mtp.py)."""
    sc = load_scenario(SCENARIOS / f"{name}.toml")
    arch, B, v = PUBLISHED[name][0], sc.parallel.global_batch, sc.padded_vocab_size
    expected = moe_model_flops(arch, B, sc.model.seq_length, v)
    model = replace(sc.model, mtp_num_layers=None)
    assert megatron_flops(model, B, v) == pytest.approx(expected, rel=1e-12)


def test_dense_model_differs_from_the_dense_formula_by_the_causal_half():
    """Without experts megatron_flops is analytic.py's dense Megatron formula less half the
    core attention: today's training.py halves B·s² for the causal mask, the dense formula
    (kept for the dense models' results) counts the full 12·B·s²·L·a·d."""
    sc = load_scenario(SCENARIOS / "llama3-70b.toml")
    m, p = sc.model, sc.parallel
    half_core = 6 * p.global_batch * m.seq_length ** 2 * m.num_layers * \
        m.num_attention_heads * m.head_dim
    assert megatron_flops(m, p.global_batch, sc.padded_vocab_size) == \
        pytest.approx(analytic.megatron_model_flops(m, p) - half_core, rel=1e-12)


def test_moe_layer_freq_pattern_places_dense_layers():
    """Megatron's pattern: the first layer dense, the rest MoE, in the model and its FLOPs."""
    from simsp.scenario.config import Model
    m = Model(num_layers=3, num_experts=4, add_bias_linear=False,
              moe_layer_freq="([0]*1+[1]*2)")
    assert [m.is_moe_layer(i) for i in range(3)] == [False, True, True]
    every = Model(num_layers=3, num_experts=4, add_bias_linear=False)
    h, f = m.hidden_size, m.ffn
    # one MLP of f (dense) instead of top-2 experts of f: 6·h·2·f·(1 − 2) per token
    assert megatron_flops(m, 1, 128) - megatron_flops(every, 1, 128) == \
        -6 * h * 2 * f * m.seq_length


@pytest.mark.parametrize("text", ["[2]*3", "__import__('os')", "[1]*2", "[0]*3+1"])
def test_bad_moe_layer_freq_is_one_error_line(text):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["run", "--num-experts", "4", "--disable-bias-linear", "--num-layers", "3",
                     "--moe-layer-freq", text, "--json"])
    assert code == 2
    assert err.getvalue().startswith("error: model.moe_layer_freq: ")
    assert err.getvalue().count("\n") == 1


def test_moe_run_reports_total_and_active_parameters():
    """A MoE run's --json carries the counts of param_counts (E 4, top-2, GeLU experts of 2hf:
    the active count drops two of them per layer)."""
    from simsp.api import run
    metrics = run(None, num_experts=4, moe_router_topk=2, add_bias_linear=False, mode="meta",
                  tensor_model_parallel_size=2, sequence_parallel=True)
    counts = metrics["parameters"]
    h, f, L = 64, 256, 2
    assert counts["total"] - counts["active"] == L * 2 * 2 * h * f
