"""`simsp sweep`: grid expansion, sweep files, error and OOM rows, the table, cache and CLI."""

import json

import pandas as pd
import pytest

import simsp
from simsp.cli import main
from simsp.errors import UserError
from simsp.api import build_configs
from simsp.explore.configs.grid import base_values, parse_list
from simsp.explore.evaluation.evaluate import evaluate
from simsp.explore.configs.fields import by_key
from simsp.explore.evaluation.flatten import flatten_metrics
from simsp.units import GiB

TINY = {"mode": "meta", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "seq_length": 32, "vocab_size": 128}


def tiny_values(**changes) -> tuple:
    """Every field's value: the built-in defaults with a tiny meta-mode model."""
    values = base_values(None)
    table = by_key()
    for key, value in {**TINY, **changes}.items():
        values[table[key].path] = value
    return tuple(values.items())


def test_grid_is_the_cartesian_product_in_flag_order():
    configs = build_configs(None, {"tensor_model_parallel_size": "1,2",
                                   "recompute_granularity": "none,full"})
    got = [(c.overrides()[("parallel", "tensor_model_parallel_size")],
            c.overrides()[("parallel", "recompute_granularity")]) for c in configs]
    assert got == [(1, "none"), (1, "full"), (2, "none"), (2, "full")]
    assert configs[3].name == "--tensor-model-parallel-size 2 --recompute-granularity full"
    assert len({c.digest() for c in configs}) == 4


def test_comma_lists_are_typed_like_their_field():
    table = by_key()
    assert parse_list(table["ib_bandwidth_GBps"], "25,50") == [25.0, 50.0]
    assert parse_list(table["sequence_parallel"], "true,false") == [True, False]
    assert parse_list(table["global_batch_size"], "none,8") == [None, 8]
    with pytest.raises(UserError, match="--tensor-model-parallel-size: 'x' is not an integer"):
        parse_list(table["tensor_model_parallel_size"], "2,x")
    with pytest.raises(UserError, match="empty item"):
        parse_list(table["micro_batch_size"], "1,,2")


def test_invalid_configuration_is_a_row_with_its_error():
    row = evaluate(tiny_values(tensor_model_parallel_size=3))
    assert row == {"status": "error", "error": "error: parallel.tensor_model_parallel_size: "
                                               "num_attention_heads=4 is not divisible by 3"}


def test_out_of_memory_row_names_the_stage_and_bytes_over():
    """One layer whose softmax block alone needs 5as²b = 5·32·32768² bytes = 160 GiB."""
    row = evaluate(tiny_values(num_layers=1, hidden_size=256, num_attention_heads=32,
                               seq_length=32768, vocab_size=256))
    assert row["status"] == "oom" and row["oom"] and row["oom_stage"] == 0
    assert row["peak_bytes_max"] >= 5 * 32 * 32768**2
    assert row["oom_bytes_over"] == row["peak_bytes_max"] - 80 * GiB
    assert row["headroom_bytes"] == -row["oom_bytes_over"]


def test_metrics_flatten_generically():
    """Scalars as is, dicts dotted, per-stage lists numbered, per-rank maxima per stage."""
    metrics = {"a": 1.5, "layout": {"t": 2}, "bubble_per_stage": [0.1, 0.2],
               "exposed_s_per_stage": [{"tp": 1.0}, {"tp": 3.0, "dp": 2.0}],
               "ranks": [{"rank": 0, "pp": 0, "peak_bytes": 5, "oom": False},
                         {"rank": 1, "pp": 0, "peak_bytes": 7, "oom": False},
                         {"rank": 2, "pp": 1, "peak_bytes": 6, "oom": True}]}
    assert flatten_metrics(metrics) == {
        "a": 1.5, "layout.t": 2, "bubble_stage0": 0.1, "bubble_stage1": 0.2,
        "exposed_s_stage0.tp": 1.0, "exposed_s_stage1.tp": 3.0, "exposed_s_stage1.dp": 2.0,
        "exposed_s_max.tp": 3.0, "exposed_s_max.dp": 2.0,
        "peak_bytes_stage0": 7, "peak_bytes_stage1": 6, "peak_bytes_max": 7}


def test_row_has_the_named_columns_and_agrees_with_run_json(capsys, tmp_path):
    values = tiny_values(pipeline_model_parallel_size=2, global_batch_size=4)
    row = evaluate(values)
    args = ["run", "--mode", "meta", "--num-layers", "2", "--hidden-size", "64",
            "--num-attention-heads", "4", "--seq-length", "32", "--vocab-size", "128",
            "--pipeline-model-parallel-size", "2", "--global-batch-size", "4", "--json",
            "--out", str(tmp_path)]
    assert main(args) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert row["iteration_time_s"] == metrics["iteration_time_s"]
    assert row["mfu"] == metrics["mfu"] and row["hfu"] == metrics["hfu"]
    peaks = [max(r["peak_bytes"] for r in metrics["ranks"] if r["pp"] == pp) for pp in (0, 1)]
    assert [row["peak_bytes_stage0"], row["peak_bytes_stage1"]] == peaks
    assert row["peak_bytes_max"] == max(peaks)
    assert row["tflops_per_gpu"] == pytest.approx(
        metrics["model_flops"] / metrics["iteration_time_s"] / 2 / 1e12, rel=1e-12)


def write_sweep_file(folder, body: str):
    path = folder / "s.toml"
    path.write_text(body)
    return path


def test_sweep_file_variants_and_their_changes_as_flags(tmp_path):
    scenario = tmp_path / "base.toml"
    scenario.write_text("[model]\nnum_layers = 4\n[parallel]\ntensor_model_parallel_size = 2\n"
                        "sequence_parallel = true\n[run]\nmode = \"meta\"\n")
    sweep_file = write_sweep_file(tmp_path, 'base = "base.toml"\n[[variant]]\nname = "first"\n'
                                  '[[variant]]\nname = "no sp"\nsequence_parallel = false\n'
                                  'micro_batch_size = 2\nglobal_batch_size = "none"\n')
    frame = simsp.sweep(sweep_file, workers=0)
    assert list(frame["variant"]) == ["first", "no sp"]
    assert list(frame["changes"]) == ["", "--no-sequence-parallel --micro-batch-size 2"]
    assert list(frame["name"]) == ["base", "base"] and list(frame["num_layers"]) == [4, 4]


def test_sweep_file_with_an_unknown_field_is_a_user_error(tmp_path):
    sweep_file = write_sweep_file(tmp_path, '[[variant]]\nname = "x"\nbogus = 1\n')
    with pytest.raises(UserError, match=r"variant\[0\].bogus: unknown scenario field"):
        build_configs(sweep_file)


def test_cache_resumes_only_what_is_missing(tmp_path, monkeypatch):
    lists = {"micro_batch_size": "1,2", "tensor_model_parallel_size": "1,2"}
    first = simsp.sweep(None, out=tmp_path, workers=0, **{**lists, "mode": "meta"})
    csv = (tmp_path / "results.csv").read_bytes()
    cached = sorted((tmp_path / "cache").iterdir())
    assert len(cached) == 4
    cached[0].unlink()
    calls = []
    import simsp.explore.evaluation.executor as executor
    monkeypatch.setattr(executor, "evaluate", lambda values: calls.append(1) or evaluate(values))
    again = simsp.sweep(None, out=tmp_path, workers=0, **{**lists, "mode": "meta"})
    assert len(calls) == 1
    pd.testing.assert_frame_equal(first, again)
    assert (tmp_path / "results.csv").read_bytes() == csv


def test_cli_sweep_writes_rows_errors_and_report(capsys, tmp_path):
    args = ["sweep", "--mode", "meta", "--num-layers", "2", "--tensor-model-parallel-size",
            "1,2,3", "--sequence-parallel", "--workers", "0", "--quiet", "--out", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    frame = pd.read_csv(tmp_path / "results.csv")
    assert list(frame["status"]) == ["error", "ok", "error"]
    assert "sequence_parallel: needs tensor_model_parallel_size > 1" in frame["error"][0]
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [row["index"] for row in rows] == [0, 1, 2]
    for name in ("report.md", "top.png", "pareto.png", "memory.png", "exposed.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "not divisible by 3" in out


def test_cli_sweep_bad_list_is_one_error_line(capsys, tmp_path):
    assert main(["sweep", "--micro-batch-size", "1,two", "--workers", "0",
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --micro-batch-size: 'two' is not an integer"]
