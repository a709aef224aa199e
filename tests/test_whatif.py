"""`simsp whatif`: variants against a baseline, each number against the rows it compares, the
page opened in headless Chromium (no console errors, every chart rendered)."""

import re

import pandas as pd
import pytest

from simsp.cli import main
from simsp.errors import UserError
from simsp.explore.whatif.variants import parse_variant
from simsp.report.html import _cells as html_cells, inline as html_inline
from tests.browser import page_verdict

SCENARIO = ("[model]\nnum_layers = 4\nhidden_size = 128\nnum_attention_heads = 4\nseq_length = 64\n"
            "vocab_size = 256\n[parallel]\ntensor_model_parallel_size = 2\n"
            "pipeline_model_parallel_size = 2\nglobal_batch_size = 8\n[run]\nmode = \"meta\"\n")


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    folder = tmp_path_factory.mktemp("whatif")
    scenario = folder / "base.toml"
    scenario.write_text(SCENARIO)
    args = ["whatif", str(scenario), "IB 2x=--ib-bandwidth-GBps 50",
            "2x GPUs=--world-size 8", "2x GPUs 2x batch=--world-size 8 --global-batch-size 16",
            "--workers", "0", "--quiet", "--out", str(folder / "out")]
    return folder / "out", args


def test_conclusions_and_vs_baseline_columns(page, capsys):
    out, args = page
    assert main(args) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in printed[:4]] == ["Baseline", "IB 2x", "2x GPUs",
                                                            "2x GPUs 2x batch"]
    printed = printed[1:]
    rows = pd.read_csv(out / "results.csv")
    base, doubled = rows.iloc[0], rows.iloc[2]
    assert (base["gpus"], doubled["gpus"], doubled["data_parallel_size"]) == (4, 8, 2)
    expected = doubled["iteration_time_s"] / base["iteration_time_s"] - 1
    assert f"2x GPUs: {expected:+.1%} iteration time" in printed[1]
    per_gpu = (doubled["tokens_per_s"] / 8) / (base["tokens_per_s"] / 4) - 1
    assert f"{per_gpu:+.1%} tokens/s per GPU" in printed[1]
    assert "d = 8/(t·p = 4) = 2 (was 1); global batch 8 kept" in printed[1]
    text = (out / "whatif.md").read_text()
    for heading in ("## Conclusions", "## Against the baseline", "## Where the time goes",
                    "## Ranking", "## Commands"):
        assert heading in text
    assert "--ib-bandwidth-GBps 50" in text


def test_page_renders_without_console_errors(page, tmp_path):
    out, args = page
    if not (out / "whatif.html").exists():
        assert main(args) == 0
    verdict, console = page_verdict(out / "whatif.html", tmp_path)
    assert console == [] and verdict["errors"] == []
    assert verdict["images"] == 3 and verdict["rendered"] == 3


def test_variant_flags_are_run_flags():
    assert parse_variant("IB 2x=--ib-bandwidth-GBps 50") == (
        "IB 2x", {("cluster", "ib_bandwidth_GBps"): 50.0})
    assert parse_variant("sp=--sequence-parallel --micro-batch-size 2")[1] == {
        ("parallel", "sequence_parallel"): True, ("parallel", "micro_batch_size"): 2}
    with pytest.raises(UserError, match="unknown flag '--bogus'"):
        parse_variant("x=--bogus 1")
    with pytest.raises(UserError, match="is not NAME=FLAGS"):
        parse_variant("--micro-batch-size 2")


def test_run_takes_the_link_flags_sweep_varies(capsys, tmp_path):
    assert main(["run", "--mode", "meta", "--ib-bandwidth-GBps", "50", "--json"]) == 0


def test_sweep_file_with_a_marked_baseline(capsys, tmp_path):
    (tmp_path / "base.toml").write_text(SCENARIO)
    sweep = tmp_path / "w.toml"
    sweep.write_text('base = "base.toml"\n[[variant]]\nname = "b2"\nmicro_batch_size = 2\n'
                     '[[variant]]\nname = "today"\nbaseline = true\n')
    assert main(["whatif", str(sweep), "--workers", "0", "--quiet", "--out",
                 str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("Baseline (today): model base; ") and printed[1].startswith("b2: ")
    assert "Baseline (today): model base; " in (tmp_path / "out" / "whatif.md").read_text()


def test_markup_in_a_variant_name_is_text_in_both_files(capsys, tmp_path):
    """`|`, `*`, `_` and `<` in a name: the markdown escapes them (a table row keeps its 10
    cells) and the page shows the name as typed, never as markup."""
    (tmp_path / "base.toml").write_text(SCENARIO)
    name = "a|b *x* y_z <i>"
    assert main(["whatif", str(tmp_path / "base.toml"), f"{name}=--micro-batch-size 2",
                 "--workers", "0", "--quiet", "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "whatif.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| a"))
    assert len(re.split(r"(?<!\\)\|", row.strip().strip("|"))) == 9
    page_text = (tmp_path / "out" / "whatif.html").read_text()
    shown = "a|b *x* y_z &lt;i&gt;"
    assert f"<td>{shown}</td>" in page_text
    assert "<em>x</em>" not in page_text and f"{shown}: <code>simsp run" in page_text


def test_html_cells_split_only_at_unescaped_pipes():
    assert html_cells(r"| a\|b | c |") == [r"a\|b", "c"]
    assert html_inline(r"a\|b \*x\* `y`") == "a|b *x* <code>y</code>"
