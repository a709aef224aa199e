"""`simsp run`: the JSON contract of issue #5, the report files, determinism, OOM as a result."""

import json
from pathlib import Path

from simsp.cli import main

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
RANK_KEYS = {"rank", "tp", "pp", "dp", "peak_bytes", "activation_peak_bytes", "weights_bytes",
             "gradients_bytes", "optimizer_bytes", "oom"}


def run_json(capsys, *argv) -> dict:
    assert main(["run", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_keys_and_report_files(capsys, tmp_path):
    metrics = run_json(capsys, str(SCENARIOS / "tiny.toml"), "--out", str(tmp_path))
    for key in ("iteration_time_s", "tokens_per_s", "mfu", "hfu", "bubble_fraction", "ranks"):
        assert key in metrics
    assert len(metrics["ranks"]) == 8  # t 2 × p 2 × d 2
    assert all(RANK_KEYS <= set(row) and isinstance(row["oom"], bool) for row in metrics["ranks"])
    assert {p.name for p in tmp_path.iterdir()} >= {"summary.md", "metrics.json", "trace.json"}
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics


def test_same_input_same_bytes(capsys, tmp_path):
    for folder in ("a", "b"):
        main(["run", str(SCENARIOS / "paper-22b.toml"), "--out", str(tmp_path / folder)])
    capsys.readouterr()
    for name in ("summary.md", "metrics.json", "trace.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_out_of_memory_is_a_reported_result(capsys, tmp_path):
    """The 22B layout at micro-batch 16 does not fit in 80 GiB: exit 0, verdict per rank."""
    metrics = run_json(capsys, str(SCENARIOS / "paper-22b.toml"), "--micro-batch-size", "16",
                       "--global-batch-size", "16", "--out", str(tmp_path))
    assert metrics["oom"] and all(row["oom"] for row in metrics["ranks"])
    detail = metrics["ranks"][0]["oom_detail"]
    assert detail["bytes_in_use"] + detail["bytes_asked"] > detail["capacity_bytes"]


def test_full_simulation_flag_matches_the_shortcuts(capsys, tmp_path):
    args = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8",
            "--seq-length", "128", "--tensor-model-parallel-size", "2", "--sequence-parallel",
            "--pipeline-model-parallel-size", "2", "--global-batch-size", "4", "--mode", "meta",
            "--out", str(tmp_path)]
    fast, full = run_json(capsys, *args), run_json(capsys, *args, "--no-shortcuts")
    assert abs(fast["iteration_time_s"] / full["iteration_time_s"] - 1) < 0.01
    assert [r["peak_bytes"] for r in fast["ranks"]] == [r["peak_bytes"] for r in full["ranks"]]
