"""`simsp whatif`'s honesty: the "where the time goes" parts partition the iteration on
pipelined, context-parallel, MoE, offloading and FSDP scenarios; the page states its baseline;
--baseline-flags changes the baseline (and the variants built on it) as `simsp run` would; a
variant that does not fit is flagged as a memory risk."""

import json
from pathlib import Path

import pytest

from simsp.cli import main
from simsp.report.whatif.comparison import KINDS, OPTIONAL_KINDS, exposure
from simsp.units import GiB

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
PIPELINED = ("[model]\nnum_layers = 4\nhidden_size = 128\nnum_attention_heads = 4\n"
             "seq_length = 64\nvocab_size = 256\n[parallel]\ntensor_model_parallel_size = 2\n"
             "pipeline_model_parallel_size = 2\nglobal_batch_size = 8\n[run]\nmode = \"meta\"\n")


def _whatif(tmp_path, scenario, *variants, extra=()) -> tuple[list[dict], str, str]:
    """The rows of results.jsonl, the printed lines and whatif.md of one `simsp whatif`."""
    out = tmp_path / "out"
    assert main(["whatif", str(scenario), *variants, *extra, "--workers", "0", "--quiet",
                 "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return rows, out, (out / "whatif.md").read_text()


CASES = {  # scenario, variants: each scenario's optional kind of time shows up
    "pipelined and offload": (None, [
        "interleaved=--num-layers-per-virtual-pipeline-stage 1", "mb 2=--micro-batch-size 2",
        "offload=--pipeline-model-parallel-size 1 --cpu-offloading --cpu-offloading-num-layers 1"]),
    "context parallel": (SCENARIOS / "llama-tiny-cp.toml", ["ib slow=--ib-bandwidth-GBps 1"]),
    "moe": (SCENARIOS / "moe-tiny-cp.toml", ["a2a=--moe-token-dispatcher-type alltoall"]),
    "fsdp": (SCENARIOS / "llama-tiny.toml", ["fsdp=--use-megatron-fsdp",
                                             "fsdp2=--use-torch-fsdp2"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_parts_add_up_to_the_iteration(case, tmp_path):
    """Each row's parts (compute, bubble, every communication kind, optimizer, of its busiest
    stage) sum to its iteration time to 1e-9, and the page's table shows the same parts."""
    scenario, variants = CASES[case]
    if scenario is None:
        scenario = tmp_path / "pipelined.toml"
        scenario.write_text(PIPELINED)
    rows, _, text = _whatif(tmp_path, scenario, *variants)
    assert len(rows) == 1 + len(variants) and all(r["status"] != "error" for r in rows)
    for row in rows:
        parts = exposure(row)
        assert set(parts) == set(KINDS + OPTIONAL_KINDS)
        assert abs(sum(parts.values()) - row["iteration_time_s"]) < 1e-9, (row["variant"], parts)
    assert "the parts partition the iteration" in text


def test_a_pipelined_baseline_has_its_bubble_counted_once(tmp_path):
    """p = 2: the busiest stage's bubble is its own wait (stage 1 waits at the start for
    stage 0's first micro-batch), never T − T/(1 + f) added beside the other stage's parts."""
    scenario = tmp_path / "pipelined.toml"
    scenario.write_text(PIPELINED)
    rows, _, _ = _whatif(tmp_path, scenario, "mb 2=--micro-batch-size 2")
    base = rows[0]
    waits = [base[f"exposed_s_stage{s}.pp_wait"] for s in (0, 1)]
    stage = waits.index(min(waits))
    parts = exposure(base)
    assert parts["bubble"] == min(waits) > 0
    assert parts["compute"] == base[f"exposed_s_stage{stage}.compute"]


def test_the_page_states_its_baseline_and_the_flags_change_it(tmp_path, capsys):
    """--baseline-flags: the baseline runs with run's flags (its command shows them) and so do
    the variants; the first printed line and the page name the model, the layout, the GPUs,
    the GPU and system, and the precision."""
    rows, out, text = _whatif(tmp_path, SCENARIOS / "llama-tiny.toml", "mb 2=--micro-batch-size 2",
                              extra=["--baseline-flags=--use-megatron-fsdp --system dgx-h100"])
    base, variant = rows
    assert base["use_megatron_fsdp"] and variant["use_megatron_fsdp"]
    assert base["gpu"] == "h100-sxm-80gb" and base["system"] == "dgx-h100"
    assert base["command"].endswith("--use-megatron-fsdp --system dgx-h100")
    assert variant["use_megatron_fsdp"] and variant["micro_batch_size"] == 2
    first = capsys.readouterr().out.splitlines()[0]
    layout = (f"layout t={base['tensor_model_parallel_size']} "
              f"p={base['pipeline_model_parallel_size']} d={base['data_parallel_size']} cp=1 ep=1")
    for words in ("Baseline: model llama-tiny", layout, "Megatron-FSDP",
                  f"{base['gpus']} GPUs", "h100-sxm-80gb in a dgx-h100 system", "BF16"):
        assert words in first, words
    assert "Baseline: baseline" not in text
    assert first.split(";")[0] in text


def test_baseline_flags_refuse_a_misspelt_flag(tmp_path, capsys):
    assert main(["whatif", str(SCENARIOS / "llama-tiny.toml"), "a=--micro-batch-size 2",
                 "--baseline-flags=--micro-batch-sise 2", "--workers", "0", "--quiet",
                 "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --baseline-flags: unrecognized arguments: --micro-batch-sise 2 "
        "(did you mean --micro-batch-size?)")


def test_a_variant_that_does_not_fit_is_a_memory_risk(tmp_path, capsys):
    """A reserve that leaves 6 MiB of the 80 GiB: the baseline (peak under 6 MiB) fits, the
    micro-batch 8 variant (over) is a MEMORY RISK with headroom = capacity − reserve − peak."""
    scenario = tmp_path / "pipelined.toml"
    scenario.write_text(PIPELINED)
    left = 6 * 2**20
    rows, _, text = _whatif(tmp_path, scenario, "mb 8=--micro-batch-size 8",
                            extra=["--memory-reserve", repr(80 - left / GiB)])
    base, big = rows
    assert base["peak_bytes_max"] < left < big["peak_bytes_max"]
    lines = capsys.readouterr().out.splitlines()
    over = (big["peak_bytes_max"] - left) / 2**20
    assert "; MEMORY RISK: does not fit (short of the reserve: peak " in lines[1]
    assert f"headroom -{over:.2f} MiB after the 79.99 GiB reserve)." in lines[1]
    assert "memory: fits, peak " in lines[0] and "MEMORY RISK" not in lines[0]
    assert "MEMORY RISK" in text

