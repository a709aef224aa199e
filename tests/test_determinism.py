"""Same input, same bytes: repeated runs, meta vs numeric ledgers, and the `simsp layer` JSON."""

import json
import os
import subprocess
import sys

import pytest

from simsp.cli import main
from simsp.scenario.loading import load_scenario
from simsp.training.driver.layer_sim import simulate_layer
from simsp.training.driver.iteration import simulate_iteration

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def events_by_rank(ranks) -> list[list[tuple]]:
    """Each rank's full ledger event list as (time, key, category, delta, op) tuples."""
    return [[(e.time_s, e.key, e.category, e.delta_bytes, e.op) for e in r.ledger.events]
            for r in ranks]


def with_mode(overrides: dict, mode: str):
    return load_scenario(None, {**overrides, ("run", "mode"): mode})


LAYER_CASES = {
    "t1": {},
    "t1-full": {("parallel", "recompute_granularity"): "full"},
    "tp2": {("parallel", "tensor_model_parallel_size"): 2},
    "tp2-sp-selective": {("parallel", "tensor_model_parallel_size"): 2,
                         ("parallel", "sequence_parallel"): True,
                         ("parallel", "recompute_granularity"): "selective"},
    "tp4-sp-full": {("parallel", "tensor_model_parallel_size"): 4,
                    ("parallel", "sequence_parallel"): True,
                    ("parallel", "recompute_granularity"): "full"},
}

ITERATION_CASES = {
    "default": {},
    "tp2-sp-pp2-dp2-selective": {
        ("parallel", "tensor_model_parallel_size"): 2, ("parallel", "sequence_parallel"): True,
        ("parallel", "pipeline_model_parallel_size"): 2, ("parallel", "data_parallel_size"): 2,
        ("parallel", "global_batch_size"): 8, ("parallel", "recompute_granularity"): "selective"},
    "interleaved-tp2-full": {
        ("model", "num_layers"): 4, ("parallel", "pipeline_model_parallel_size"): 2,
        ("parallel", "num_layers_per_virtual_pipeline_stage"): 1,
        ("parallel", "global_batch_size"): 4, ("parallel", "tensor_model_parallel_size"): 2,
        ("parallel", "recompute_granularity"): "full"},
    "gpipe-pp2": {("parallel", "pipeline_model_parallel_size"): 2,
                  ("parallel", "schedule"): "gpipe", ("parallel", "global_batch_size"): 3},
}


@pytest.mark.parametrize("case", LAYER_CASES)
def test_meta_and_numeric_layer_ledgers_are_identical(case):
    numeric = simulate_layer(with_mode(LAYER_CASES[case], "numeric"))
    meta = simulate_layer(with_mode(LAYER_CASES[case], "meta"))
    assert numeric.records[0].out is not None and meta.records[0].out is None
    assert events_by_rank(meta.ranks) == events_by_rank(numeric.ranks)
    assert [r.flops for r in meta.ranks] == [r.flops for r in numeric.ranks]


@pytest.mark.parametrize("case", ITERATION_CASES)
def test_meta_and_numeric_iteration_ledgers_are_identical(case):
    numeric = simulate_iteration(with_mode(ITERATION_CASES[case], "numeric"))
    meta = simulate_iteration(with_mode(ITERATION_CASES[case], "meta"))
    assert numeric.loss is not None
    assert sorted(meta.inputs.world.ranks) == sorted(numeric.inputs.world.ranks)
    ranks = sorted(numeric.inputs.world.ranks)
    assert (events_by_rank([meta.inputs.world.ranks[r] for r in ranks])
            == events_by_rank([numeric.inputs.world.ranks[r] for r in ranks]))
    assert meta.results.end_s == numeric.results.end_s


def test_numeric_iteration_repeats_bit_for_bit():
    sc = load_scenario(os.path.join(REPO, "scenarios", "tiny.toml"))
    first, second = simulate_iteration(sc), simulate_iteration(sc)
    assert first.loss == second.loss
    assert (events_by_rank(first.inputs.world.ranks.values())
            == events_by_rank(second.inputs.world.ranks.values()))


def run_cli(capsys, argv) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["layer", "--json"],
    ["layer", "--json", "--tensor-model-parallel-size", "2", "--sequence-parallel",
     "--recompute-granularity", "selective"],
    ["layer", "--json", os.path.join(REPO, "scenarios", "paper-22b.toml")],
    ["verify", "--json"],
])
def test_same_command_twice_gives_identical_json(capsys, argv):
    first, second = run_cli(capsys, argv), run_cli(capsys, argv)
    assert first == second
    json.loads(first)


def test_layer_json_is_identical_across_processes_and_hash_seeds():
    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run([sys.executable, "-m", "simsp.cli", "layer", "--json",
                               "--tensor-model-parallel-size", "2", "--sequence-parallel"],
                              capture_output=True, cwd=REPO, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]


# --- `simsp layer --json`: the keys README.md names -----------------------------------------

def test_layer_json_has_the_issue_2_keys_with_their_types(capsys):
    report = json.loads(run_cli(capsys, ["layer", "--json", "--tensor-model-parallel-size", "2"]))
    for key in ("activation_bytes_per_rank", "saved_tensors", "formula_bytes",
                "peak_bytes_per_rank", "flops"):
        assert key in report, key
    per_rank = report["activation_bytes_per_rank"]
    assert isinstance(per_rank, list) and len(per_rank) == 2
    assert all(type(v) is int for v in per_rank)
    assert all(type(v) is int for v in report["peak_bytes_per_rank"])
    assert len(report["peak_bytes_per_rank"]) == 2
    assert all(peak >= act for peak, act in zip(report["peak_bytes_per_rank"], per_rank))
    assert type(report["formula_bytes"]) is int and report["formula_bytes"] == per_rank[0]
    assert set(report["flops"]) == {"forward", "backward", "recompute"}
    assert all(type(v) is int for v in report["flops"].values())
    items = report["saved_tensors"]
    assert all(set(item) == {"name", "bytes"} for item in items)
    assert all(type(item["name"]) is str and type(item["bytes"]) is int for item in items)
    assert sum(item["bytes"] for item in items) == per_rank[0]


# K22 §4's table (docs/MODEL.md#activation-memory), by the names in the docstrings of the
# layer and its blocks
REFERENCE_NAMES = {
    "ln1_input", "qkv_input", "q", "k", "softmax_output", "softmax_dropout_mask",
    "attention_dropout_output", "v", "proj_input", "attn_dropout_mask", "ln2_input",
    "fc1_input", "gelu_input", "fc2_input", "mlp_dropout_mask"}


@pytest.mark.parametrize("flags,names", [
    ([], REFERENCE_NAMES),
    (["--recompute-granularity", "selective"],
     REFERENCE_NAMES - {"softmax_output", "softmax_dropout_mask", "attention_dropout_output"}),
    (["--recompute-granularity", "full"], {"layer_input"}),
])
def test_layer_json_saved_tensor_names(capsys, flags, names):
    report = json.loads(run_cli(capsys, ["layer", "--json", *flags]))
    listed = [item["name"] for item in report["saved_tensors"]]
    assert sorted(listed) == sorted(names)


def test_layer_json_meta_mode_has_no_reference_error(capsys):
    report = json.loads(run_cli(capsys, ["layer", "--json", "--mode", "meta"]))
    assert "max_rel_err" not in report
    numeric = json.loads(run_cli(capsys, ["layer", "--json"]))
    assert numeric["max_rel_err"] < 1e-12
    for key in ("activation_bytes_per_rank", "saved_tensors", "formula_bytes",
                "peak_bytes_per_rank", "flops"):
        assert report[key] == numeric[key], key
