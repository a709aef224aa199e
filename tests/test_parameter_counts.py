"""Every model's run reports its parameters (metrics.json `parameters`, the summary's
"Parameters:" line), against closed forms written here from the architectures' definitions:
GPT (N21 Eq. 2 plus the final layer norm) and Llama (GQA, SwiGLU, RMSNorm, untied)."""

import json
from pathlib import Path

from simsp.cli import main
from simsp.model.param_counts import parameter_counts
from simsp.scenario.loading import load_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def gpt_parameters(L: int, h: int, v: int, s: int) -> int:
    """N21 Eq. 2: 12Lh² + 13Lh + vh + sh (QKV and projection 4h² + 4h, MLP 8h² + 5h, two
    layer norms 4h per layer; tied word embedding, learned positions), plus the final norm 2h."""
    return 12 * L * h * h + 13 * L * h + v * h + s * h + 2 * h


def llama_parameters(L: int, h: int, v: int, a: int, g: int, f: int) -> int:
    """Per layer: Q h·h, K and V 2·h·(g·h/a), output h·h, SwiGLU 3·h·f, two RMSNorms 2h; the
    word embedding and the untied output layer v·h each; the final RMSNorm h."""
    d = h // a
    layer = h * h + 2 * h * g * d + h * h + 3 * h * f + 2 * h
    return L * layer + 2 * v * h + h


def _run_json(capsys, *args) -> dict:
    """`simsp run ARGS --mode meta --json`'s metrics."""
    assert main(["run", *args, "--mode", "meta", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_gpt_run_reports_n21s_count(capsys):
    metrics = _run_json(capsys, str(SCENARIOS / "tiny.toml"))
    expected = gpt_parameters(L=4, h=64, v=128, s=32)
    assert metrics["parameters"] == {"total": expected, "active": expected, "embedding": 128 * 64}
    other = _run_json(capsys, "--num-layers", "2", "--hidden-size", "96",
                      "--num-attention-heads", "4", "--seq-length", "48", "--vocab-size", "200",
                      "--global-batch-size", "8")
    assert other["parameters"]["total"] == gpt_parameters(L=2, h=96, v=200, s=48)


def test_a_llama_run_reports_its_count_and_the_summary_prints_it(capsys, tmp_path):
    metrics = _run_json(capsys, str(SCENARIOS / "llama-tiny.toml"))
    expected = llama_parameters(L=3, h=32, v=96, a=4, g=2, f=48)
    assert metrics["parameters"]["total"] == metrics["parameters"]["active"] == expected
    assert main(["run", str(SCENARIOS / "llama-tiny.toml"), "--mode", "meta", "--quiet",
                 "--trace", "none", "--out", str(tmp_path)]) == 0
    summary = (tmp_path / "summary.md").read_text()
    assert f"Parameters: {expected:,} total (all active per token), embedding and output layer " \
           f"{2 * 96 * 32:,}." in summary


def test_llama3_8b_is_meta_s_8_03_billion():
    """The bundled Llama 3 8B: the closed form, and Hugging Face's 8,030,261,248."""
    counts = parameter_counts(load_scenario(SCENARIOS / "llama3-8b.toml", {}).model)
    assert counts["total"] == llama_parameters(L=32, h=4096, v=128256, a=32, g=8, f=14336) \
        == 8_030_261_248


def test_the_summary_names_the_mfu_to_quote(capsys, tmp_path):
    """At s = 2048 on a 32-wide model, attention dominates: the counted MFU (causal tiles only)
    is below the formula's, and the summary says which to quote."""
    assert main(["run", str(SCENARIOS / "llama-tiny.toml"), "--seq-length", "2048", "--mode",
                 "meta", "--quiet", "--trace", "none", "--out", str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["mfu_counted"] < 0.7 * metrics["mfu"]
    summary = (tmp_path / "summary.md").read_text()
    assert f"MFU to quote: {100 * metrics['mfu']:.1f}%, by the Megatron formula" in summary
