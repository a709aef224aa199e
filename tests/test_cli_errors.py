"""Bad input at the command line: one `error:` line naming the field, exit 2, no traceback."""

import contextlib
import io
from pathlib import Path
import shutil
import subprocess
import sys

import pytest

from inprocess import cli


REPO = Path(__file__).resolve().parents[1]


def assert_one_error_line(rc, out, err, field):
    assert rc == 2, (rc, err)
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("error: "), err
    assert field in err, (field, err)
    assert "Traceback" not in err


def toml(tmp_path, text: str, name: str = "bad.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# --- impossible combinations given as flags -------------------------------------------------

FLAG_CASES = {
    "h not divisible by heads": (["--hidden-size", "66"], "model.hidden_size"),
    "heads not divisible by TP": (["--num-attention-heads", "2", "--tensor-model-parallel-size",
                                   "4"], "parallel.tensor_model_parallel_size"),
    "FFN not divisible by TP": (["--ffn-hidden-size", "130", "--tensor-model-parallel-size", "4"],
                                "parallel.tensor_model_parallel_size"),
    "vocab padding multiple not positive": (["--make-vocab-size-divisible-by", "0"],
                                            "model.make_vocab_size_divisible_by"),
    "sequence not divisible by TP under SP": (["--seq-length", "30", "--tensor-model-parallel-size",
                                               "4", "--sequence-parallel"],
                                              "parallel.sequence_parallel"),
    "SP without TP > 1": (["--sequence-parallel"], "parallel.sequence_parallel"),
    "layers not divisible by stages": (["--num-layers", "3", "--pipeline-model-parallel-size",
                                        "2"], "parallel.pipeline_model_parallel_size"),
    "stage layers not divisible by chunk size": (
        ["--num-layers", "4", "--pipeline-model-parallel-size", "2",
         "--num-layers-per-virtual-pipeline-stage", "3", "--global-batch-size", "2"],
        "parallel.num_layers_per_virtual_pipeline_stage"),
    "interleaved without virtual stages": (["--schedule", "interleaved",
                                            "--pipeline-model-parallel-size", "2"],
                                           "parallel.schedule"),
    "interleaved on one stage": (["--num-layers-per-virtual-pipeline-stage", "1"],
                                 "parallel.schedule"),
    "virtual stages without interleaving": (["--schedule", "1f1b",
                                             "--pipeline-model-parallel-size", "2",
                                             "--num-layers-per-virtual-pipeline-stage", "1"],
                                            "parallel.num_layers_per_virtual_pipeline_stage"),
    "interleaved micro-batches not a multiple of p": (
        ["--schedule", "interleaved", "--pipeline-model-parallel-size", "2", "--num-layers", "4",
         "--num-layers-per-virtual-pipeline-stage", "1", "--global-batch-size", "3"],
        "parallel.global_batch_size"),
    "global batch not divisible by b*d": (["--global-batch-size", "3", "--micro-batch-size", "2"],
                                          "parallel.global_batch_size"),
    "more GPUs than the cluster": (["--pipeline-model-parallel-size", "2",
                                    "--data-parallel-size", "8"], "cluster.nodes"),
    "more GPUs than two nodes": (["--tensor-model-parallel-size", "4", "--data-parallel-size",
                                  "8", "--nodes", "2", "--global-batch-size", "8"],
                                 "cluster.nodes"),
    "hidden dropout 1": (["--hidden-dropout", "1.0"], "model.hidden_dropout"),
    "attention dropout negative": (["--attention-dropout=-0.1"], "model.attention_dropout"),
    "dropout NaN": (["--hidden-dropout", "nan"], "model.hidden_dropout"),
    "conflicting SP switches": (["--sequence-parallel", "--no-sequence-parallel"],
                                "--sequence-parallel"),
    "distributed optimizer in numeric mode": (["--distributed-optimizer"],
                                              "parallel.distributed_optimizer"),
}


@pytest.mark.parametrize("case", FLAG_CASES)
def test_impossible_combination_is_one_error_line(capsys, case):
    flags, field = FLAG_CASES[case]
    assert_one_error_line(*cli(["layer", *flags]), field)


NON_POSITIVE = {
    "--num-layers": "model.num_layers", "--hidden-size": "model.hidden_size",
    "--num-attention-heads": "model.num_attention_heads", "--seq-length": "model.seq_length",
    "--vocab-size": "model.vocab_size", "--ffn-hidden-size": "model.ffn_hidden_size",
    "--micro-batch-size": "parallel.micro_batch_size",
    "--global-batch-size": "parallel.global_batch_size",
    "--tensor-model-parallel-size": "parallel.tensor_model_parallel_size",
    "--pipeline-model-parallel-size": "parallel.pipeline_model_parallel_size",
    "--data-parallel-size": "parallel.data_parallel_size",
    "--num-layers-per-virtual-pipeline-stage": "parallel.num_layers_per_virtual_pipeline_stage",
    "--nodes": "cluster.nodes", "--gpus-per-node": "cluster.gpus_per_node",
}


@pytest.mark.parametrize("value", ["0", "-2"])
@pytest.mark.parametrize("flag", NON_POSITIVE)
def test_non_positive_size_is_one_error_line(capsys, flag, value):
    assert_one_error_line(*cli(["layer", f"{flag}={value}"]), NON_POSITIVE[flag])


# --- argparse: unknown flags, bad choices, bad values -----------------------------------------

ARGPARSE_CASES = {
    "unknown flag": (["layer", "--hiden-size", "64"], "--hiden-size"),
    "unknown flag on verify": (["verify", "--tensor-parallel", "2"], "--tensor-parallel"),
    "bad schedule choice": (["layer", "--schedule", "zigzag"], "--schedule"),
    "bad recompute choice": (["layer", "--recompute-granularity", "some"],
                             "--recompute-granularity"),
    "bad mode choice": (["layer", "--mode", "fast"], "--mode"),
    "bad dtype choice": (["verify", "--numeric-dtype", "float16"], "--numeric-dtype"),
    "not an integer": (["layer", "--hidden-size", "sixty-four"], "--hidden-size"),
    "float for an integer flag": (["layer", "--num-layers", "2.5"], "--num-layers"),
    "not a number": (["layer", "--hidden-dropout", "high"], "--hidden-dropout"),
    "unknown command": (["train"], "command"),
    "two scenario files": (["layer", "a.toml", "b.toml"], "b.toml"),
}


@pytest.mark.parametrize("case", ARGPARSE_CASES)
def test_argparse_errors_are_one_error_line(capsys, case):
    argv, field = ARGPARSE_CASES[case]
    assert_one_error_line(*cli(argv), field)


def test_verify_refuses_meta_mode(capsys):
    assert_one_error_line(*cli(["verify", "--mode", "meta"]), "run.mode")


# --- the newest surfaces: DP gradient precision and buckets, CP types, the benchmarks ---------

CP = ["scenarios/llama-tiny-cp.toml", "--mode", "meta"]
HCP = [*CP, "--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes"]
DISTOPT = ["--mode", "meta", "--use-distributed-optimizer"]
SURFACE_CASES = {
    "bf16 reduce under FSDP": (["--mode", "meta", "--grad-reduce-in-bf16", "--use-torch-fsdp2"],
                               "parallel.grad_reduce_in_bf16"),
    "bf16 reduce with a value": (["--grad-reduce-in-bf16=yes"], "--grad-reduce-in-bf16"),
    "bucket cap not a number": (["--bucket-cap-mb", "abc"], "--bucket-cap-mb"),
    "bucket cap zero": ([*DISTOPT, "--bucket-cap-mb", "0"], "parallel.bucket_cap_mb"),
    "bucket cap negative": ([*DISTOPT, "--bucket-cap-mb=-5"], "parallel.bucket_cap_mb"),
    "bucket cap NaN": ([*DISTOPT, "--bucket-cap-mb", "nan"], "parallel.bucket_cap_mb"),
    "bucket cap huge": ([*DISTOPT, "--bucket-cap-mb", "1e300"], "parallel.bucket_cap_mb"),
    "bucket cap without the distributed optimizer": (["--mode", "meta", "--bucket-cap-mb", "100"],
                                                     "parallel.bucket_cap_mb"),
    "bucket cap beside Megatron's bucket size": (
        [*DISTOPT, "--bucket-cap-mb", "100", "--ddp-bucket-size", "1000"], "parallel.bucket_cap_mb"),
    "CP type unknown": ([*CP, "--cp-comm-type", "ring"], "--cp-comm-type"),
    "a2a+p2p without sizes": ([*CP, "--cp-comm-type", "a2a+p2p"],
                              "parallel.hierarchical_context_parallel_sizes"),
    "hierarchical sizes not integers": ([*HCP, "x", "y"],
                                        "parallel.hierarchical_context_parallel_sizes"),
    "hierarchical size zero": ([*HCP, "0", "2"], "parallel.hierarchical_context_parallel_sizes"),
    "hierarchical sizes negative": ([*HCP, "-1", "-2"],
                                    "parallel.hierarchical_context_parallel_sizes"),
    "hierarchical sizes huge": ([*HCP, "99999999999999999999", "1"],
                                "parallel.hierarchical_context_parallel_sizes"),
    "hierarchical sizes three levels": ([*HCP, "1", "1", "2"],
                                        "parallel.hierarchical_context_parallel_sizes"),
    "hierarchical sizes not cp": ([*CP, "--hierarchical-context-parallel-sizes", "3"],
                                  "parallel.hierarchical_context_parallel_sizes"),
    "hierarchical sizes empty": ([*HCP, ""], "--hierarchical-context-parallel-sizes"),
}


@pytest.mark.parametrize("case", SURFACE_CASES)
def test_newest_flags_bad_values_are_one_error_line(capsys, case):
    flags, field = SURFACE_CASES[case]
    assert_one_error_line(*cli(["layer", *flags]), field)


@pytest.mark.parametrize("line, field", [
    ("hierarchical_context_parallel_sizes = 2", "parallel.hierarchical_context_parallel_sizes"),
    ("hierarchical_context_parallel_sizes = [true, 2]",
     "parallel.hierarchical_context_parallel_sizes"),
    ('bucket_cap_mb = "1"', "parallel.bucket_cap_mb"),
    ("grad_reduce_in_bf16 = 1", "parallel.grad_reduce_in_bf16"),
])
def test_newest_fields_bad_types_in_a_file_are_one_error_line(capsys, tmp_path, line, field):
    text = (REPO / "scenarios" / "llama-tiny-cp.toml").read_text()
    path = toml(tmp_path, text.replace("[parallel]", f"[parallel]\n{line}", 1))
    assert_one_error_line(*cli(["layer", path, "--mode", "meta"]), field)


@pytest.mark.parametrize("argv, field", [
    (["validate", "--only", "nosuch"], "--only"),
    (["validate", "--only", "table4,,memory"], "--only"),
    (["hardware", "nosuch"], "cluster.gpu"),
    (["hardware", "/"], "/: is a folder"),
])
def test_validate_and_hardware_bad_names_are_one_error_line(capsys, argv, field):
    assert_one_error_line(*cli(argv), field)


def benchmark(script: str, argv: list[str]) -> tuple[int, str, str]:
    """benchmarks/SCRIPT.py's command line in this process (its arguments are checked before
    anything is measured)."""
    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    import bench_args
    main = __import__(script).main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            bench_args.run_main(main, argv)
            rc = 0
        except SystemExit as exc:
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("script, argv, field", [
    ("scale", ["--cap", "0"], "--cap"), ("scale", ["--cap", "nan"], "--cap"),
    ("scale", ["--cap", "inf"], "--cap"), ("scale", ["--cap=-5"], "--cap"),
    ("scale", ["--cap", "abc"], "--cap"), ("scale", ["--only", "nosuch"], "--only"),
    ("scale", ["--only", "mtp-deep", "mtp-deep"], "--only"),
    ("scale", ["--json", "/nonexistent-folder/x.json"], "--json"),
    ("scale", ["--cap", "1", "--cap", "2"], "--cap"),
    ("estimate_constants", ["--repeat", "0"], "--repeat"),
    ("estimate_constants", ["--repeat", "1e9"], "--repeat"),
    ("estimate_constants", ["--only", "start", "start"], "--only"),
    ("estimate_constants", ["--from-json", "/nonexistent.json"], "/nonexistent.json"),
    ("estimate_constants", ["--from-json", "BAD"], "--from-json"),
    ("estimate_constants", ["--from-json", "NORUNS"], "--from-json"),
    ("estimate_constants", ["--from-json", "NORUNS", "--json", "NORUNS"], "--json"),
])
def test_benchmark_arguments_are_one_error_line(tmp_path, script, argv, field):
    """scale.py's and estimate_constants.py's bad arguments stop before any measurement (a
    NaN cap crashed the first point's timeout, a bad --json path the end of an hour's run)."""
    files = {"BAD": "not json", "NORUNS": '{"runs": [1, 2]}'}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    argv = [str(tmp_path / word) if word in files else word for word in argv]
    assert_one_error_line(*benchmark(script, argv), field)


# --- scenario files ---------------------------------------------------------------------------

TOML_CASES = {
    "unknown key": ("[model]\nhiden_size = 64\n", "model.hiden_size"),
    "unknown key in run": ("[run]\nseeds = 3\n", "run.seeds"),
    "unknown section": ("[modle]\nhidden_size = 64\n", "modle"),
    "top-level key": ("hidden_size = 64\n", "hidden_size"),
    "section that is not a table": ("model = 3\n", "model"),
    "nested table": ("[model.extra]\nx = 1\n", "model.extra"),
    "malformed": ("[model\nhidden_size = 64\n", "scenario"),
    "malformed value": ("[model]\nhidden_size = \n", "scenario"),
    "duplicate key": ("[model]\nhidden_size = 64\nhidden_size = 32\n", "scenario"),
    "string for an int": ('[model]\nhidden_size = "64"\n', "model.hidden_size"),
    "bool for an int": ("[model]\nnum_layers = true\n", "model.num_layers"),
    "float for an int": ("[parallel]\nmicro_batch_size = 2.0\n", "parallel.micro_batch_size"),
    "int for a bool": ("[parallel]\nsequence_parallel = 1\n", "parallel.sequence_parallel"),
    "string for a float": ('[model]\nhidden_dropout = "0.1"\n', "model.hidden_dropout"),
    "bool for a float": ("[model]\nattention_dropout = false\n", "model.attention_dropout"),
    "int for a string": ("[run]\nmode = 1\n", "run.mode"),
    "array for an int": ("[model]\nseq_length = [32]\n", "model.seq_length"),
    "dropout out of range": ("[model]\nhidden_dropout = 1.5\n", "model.hidden_dropout"),
    "zero size": ("[model]\nseq_length = 0\n", "model.seq_length"),
    "zero bandwidth": ("[cluster]\nnvlink_bandwidth_GBps = 0\n", "cluster.nvlink_bandwidth_GBps"),
    "negative latency": ("[cluster]\nib_latency_us = -1.0\n", "cluster.ib_latency_us"),
    "unknown GPU": ('[cluster]\ngpu = "H100"\n', "cluster.gpu"),
    "bad schedule": ('[parallel]\nschedule = "zigzag"\n', "parallel.schedule"),
    "bad recompute": ('[parallel]\nrecompute_granularity = "some"\n',
                      "parallel.recompute_granularity"),
    "bad mode": ('[run]\nmode = "fast"\n', "run.mode"),
    "bad dtype": ('[run]\nnumeric_dtype = "float16"\n', "run.numeric_dtype"),
    "layers vs stages": ("[model]\nnum_layers = 3\n[parallel]\npipeline_model_parallel_size = 2\n",
                         "parallel.pipeline_model_parallel_size"),
}


@pytest.mark.parametrize("case", TOML_CASES)
def test_bad_scenario_file_is_one_error_line(capsys, tmp_path, case):
    text, field = TOML_CASES[case]
    assert_one_error_line(*cli(["layer", toml(tmp_path, text)]), field)


def test_missing_scenario_file(capsys, tmp_path):
    rc, out, err = cli(["layer", str(tmp_path / "nowhere.toml")])
    assert_one_error_line(rc, out, err, "scenario")
    assert "nowhere.toml" in err and "not found" in err


def test_scenario_path_that_is_a_directory(capsys, tmp_path):
    assert_one_error_line(*cli(["verify", str(tmp_path)]), "scenario")


def test_flag_overrides_a_bad_file_value_but_not_a_bad_key(capsys, tmp_path):
    path = toml(tmp_path, "[model]\nhidden_size = 66\n")
    assert cli(["layer", path, "--hidden-size", "64", "--mode", "meta"])[0] == 0
    path = toml(tmp_path, "[model]\nhiden_size = 64\n", "typo.toml")
    assert_one_error_line(*cli(["layer", path, "--hidden-size", "64"]),
                          "model.hiden_size")


def test_non_utf8_scenario_file(capsys, tmp_path):
    path = tmp_path / "binary.toml"
    path.write_bytes(b"\xff\xfe[model]\n")
    assert_one_error_line(*cli(["layer", str(path)]), "scenario")


def test_negative_seed(capsys):
    assert_one_error_line(*cli(["layer", "--seed=-1"]), "run.seed")


# --- through a real process: no traceback ----------------------------------------------------

def run_process(argv) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.mark.parametrize("args,field", [
    (["layer", "--hidden-size", "66"], "model.hidden_size"),
    (["layer", "--schedule", "zigzag"], "--schedule"),
    (["verify", "--sequence-parallel"], "parallel.sequence_parallel"),
])
def test_python_dash_m_exits_2_with_one_line(args, field):
    done = run_process([sys.executable, "-m", "simsp.cli", *args])
    assert_one_error_line(done.returncode, done.stdout, done.stderr, field)


def test_console_script_exits_2_with_one_line(tmp_path):
    script = shutil.which("simsp")
    if script is None:
        pytest.skip("the simsp console script is not installed")
    done = run_process([script, "layer", toml(tmp_path, '[model]\nnum_layers = "2"\n')])
    assert_one_error_line(done.returncode, done.stdout, done.stderr, "model.num_layers")
    done = run_process([script, "verify", "--hiden-size", "64"])
    assert_one_error_line(done.returncode, done.stdout, done.stderr, "--hiden-size")
