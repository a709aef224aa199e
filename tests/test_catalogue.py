"""Issue 8's catalogue: one case per class of bad input a new user found, each giving exactly one
`error:` line naming the field (exit 2) within seconds, or the documented correct behaviour."""

import json
import os
from pathlib import Path
import subprocess
import sys
import time

import pytest

from inprocess import cli

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "scenarios"
HUGE = str(10**30)
CPU_SECONDS = 10  # "in seconds": a generous guard against a hang, not a speed target


def assert_error(argv: list[str], field: str) -> str:
    """Exit 2, nothing on stdout, exactly one `error: <field>: ...` line, in seconds."""
    start = time.process_time()
    rc, out, err = cli(argv)
    assert time.process_time() - start < CPU_SECONDS
    assert (rc, out) == (2, ""), (rc, out, err)
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith(f"error: {field}: ") or err.startswith(f"error: argument {field}: "), err
    return err


def scenario(tmp_path: Path, text: str) -> str:
    path = tmp_path / "s.toml"
    path.write_text(text)
    return str(path)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run with the current folder a fresh empty one, nested so '../..' stays inside tmp_path."""
    work = tmp_path / "a" / "b" / "work"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    return work


TINY_META = [str(SCENARIOS / "tiny.toml"), "--mode", "meta"]

# --- writes outside the output folder --------------------------------------------------------

@pytest.mark.parametrize("name,folder", [("/tmp/x", "tmp-x"), ("../../x", "x"), ("", "scenario"),
                                         ("a/../../b c", "a-..-..-b-c")])
def test_scenario_name_cannot_escape_reports(in_tmp, tmp_path, name, folder):
    path = scenario(tmp_path, f'[run]\nname = "{name}"\nmode = "meta"\n')
    rc, out, err = cli(["run", path])
    assert rc == 0, err
    assert sorted(p.name for p in (in_tmp / "reports").iterdir()) == [folder]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "s.toml"]
    assert [p.name for p in (tmp_path / "a" / "b").iterdir()] == ["work"]


def test_json_alone_writes_nothing(in_tmp):
    rc, out, _ = cli(["run", *TINY_META, "--json"])
    assert rc == 0 and json.loads(out)["ranks"]
    assert list(in_tmp.iterdir()) == []


def test_json_with_out_writes_there(in_tmp):
    rc, out, _ = cli(["run", *TINY_META, "--json", "--out", "here"])
    assert rc == 0 and (in_tmp / "here" / "metrics.json").exists()
    assert json.loads((in_tmp / "here" / "metrics.json").read_text()) == json.loads(out)


def test_variants_get_their_own_default_folder(in_tmp):
    for extra in ([], ["--data-parallel-size", "1", "--global-batch-size", "8"],
                  ["--recompute-granularity", "full"]):
        assert cli(["run", *TINY_META, *extra])[0] == 0
    assert sorted(p.name for p in (in_tmp / "reports").iterdir()) == [
        "tiny_gbs8_d1_meta", "tiny_meta", "tiny_rc-full_meta"]


@pytest.mark.parametrize("target", ["/proc/simsp-x", "/dev/null/x", "FILE", "FILE/below", ""])
def test_unwritable_out_is_one_error_before_simulating(in_tmp, target):
    (in_tmp / "FILE").write_text("not a folder")
    assert_error(["run", *TINY_META, "--out", target.replace("FILE", str(in_tmp / "FILE"))],
                 "--out")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_out_is_one_error(in_tmp):
    (in_tmp / "ro").mkdir(mode=0o500)
    assert_error(["run", *TINY_META, "--out", str(in_tmp / "ro")], "--out")


# --- hangs and unbounded memory: bounds before work ------------------------------------------

BOUNDS_CASES = {
    "layers 10**30": (["run", "--num-layers", HUGE, "--mode", "meta"], "model.num_layers"),
    "global batch 10**30": (["run", "--global-batch-size", HUGE, "--mode", "meta"],
                            "parallel.global_batch_size"),
    "d 100000 on 12500 nodes": (["run", "--mode", "meta", "--data-parallel-size", "100000",
                                 "--nodes", "12500"], "parallel.data_parallel_size"),
    "100000 nodes for one GPU": (["run", "--mode", "meta", "--nodes", "100000"], "cluster.nodes"),
    "seq length 10**30": (["run", "--seq-length", HUGE, "--mode", "meta"], "model.seq_length"),
    "hidden 10**30": (["layer", "--hidden-size", HUGE], "model.hidden_size"),
    "paper model in numeric mode": (["run", str(SCENARIOS / "paper-175b.toml"), "--mode",
                                     "numeric"], "run.mode"),
    "numeric memory is never forced": (["run", str(SCENARIOS / "paper-175b.toml"), "--mode",
                                        "numeric", "--force"], "run.mode"),
    "meta ledger beyond memory": (["run", str(SCENARIOS / "paper-1t.toml"),  # 4.2M layer-steps
                                   "--global-batch-size", "32768"], "work"),
    "meta memory is never forced": (["run", str(SCENARIOS / "paper-1t.toml"),
                                     "--global-batch-size", "32768", "--force"], "work"),
    "vocabulary of one token": (["verify", "--vocab-size", "1", "--json"], "model.vocab_size"),
}


@pytest.mark.parametrize("case", BOUNDS_CASES)
def test_bounds_before_work(case):
    argv, field = BOUNDS_CASES[case]
    assert_error(argv, field)


def test_time_limit_error_gives_estimate_and_limit():
    """Llama 3 8B without shortcuts over CP 128 (s 8192, t 2, 16 micro-batches): every pair of
    a CP ring's ranks per layer-step, ~16 minutes in about 6 GiB (a full run's memory, not its
    time, refuses 22B at 1,024 micro-batches: tests/test_estimate_truths.py)."""
    err = assert_error(["run", str(SCENARIOS / "llama3-8b.toml"), "--no-shortcuts",
                        "--context-parallel-size", "128", "--data-parallel-size", "1",
                        "--nodes", "32", "--seq-length", "8192", "--global-batch-size", "16"],
                       "work")
    assert "CPU seconds" in err and "limit of 600 s" in err and "--force" in err


def test_force_lifts_the_time_limit_only():
    from simsp.scenario.work import check_work
    from simsp.scenario.loading import load_scenario
    sc = load_scenario(SCENARIOS / "paper-22b.toml",
                       {("parallel", "global_batch_size"): 1024})
    check_work(sc, shortcuts=False, force=True)  # no error: the time limit is lifted


SCENARIO_FILE_CASES = {
    "nan bandwidth": ("[cluster]\nnvlink_bandwidth_GBps = nan\n", "cluster.nvlink_bandwidth_GBps"),
    "inf latency": ("[cluster]\nnvlink_latency_us = inf\n", "cluster.nvlink_latency_us"),
    "1e-300 bandwidth": ("[cluster]\nib_bandwidth_GBps = 1e-300\n", "cluster.ib_bandwidth_GBps"),
    "negative inf efficiency": ("[cluster]\nib_efficiency = -inf\n", "cluster.ib_efficiency"),
    "huge int in a file": (f"[model]\nnum_layers = {2**62}\n", "model.num_layers"),
}


@pytest.mark.parametrize("command", ["run", "layer"])
@pytest.mark.parametrize("case", SCENARIO_FILE_CASES)
def test_non_finite_or_absurd_file_values(tmp_path, in_tmp, case, command):
    text, field = SCENARIO_FILE_CASES[case]
    assert_error([command, scenario(tmp_path, text + '[run]\nmode = "meta"\n'), "--json"], field)


# --- the command line as a contract ----------------------------------------------------------

CLI_CASES = {
    "empty scenario": (["run", ""], "SCENARIO"),
    "empty --out": (["run", "--out", ""], "--out"),
    "repeated flag": (["layer", "--num-layers", "2", "--num-layers", "4"], "--num-layers"),
    "repeated flag with =": (["layer", "--seed=1", "--seed=2"], "--seed"),
    "repeated under two names": (["run", "--distributed-optimizer",
                                  "--use-distributed-optimizer"], "--distributed-optimizer"),
    "abbreviation": (["run", "--glob", "2"], "unrecognized arguments: --glob"),
    "abbreviated ring flag": (["ring", "--ranks", "8", "--siz", "1M"],
                              "unrecognized arguments: --siz"),
    "size with underscore": (["ring", "--ranks", "8", "--size", "1_024"], "--size"),
    "non-ASCII digits": (["ring", "--ranks", "8", "--size", "\u0661\u0660\u0662\u0664"], "--size"),
    "size 10**309": (["ring", "--ranks", "8", "--size", "1" + "0" * 309], "--size"),
    "size above 1 TiB": (["ring", "--ranks", "8", "--size", "2T"], "--size"),
    "world size not divisible": (["layer", "--world-size", "6", "--tensor-model-parallel-size",
                                  "4"], "--world-size"),
    "world size conflicts with d": (["layer", "--world-size", "8",
                                     "--tensor-model-parallel-size", "2",
                                     "--data-parallel-size", "2"], "--world-size"),
}


def _error_field_ok(err: str, field: str) -> bool:
    return err.startswith(f"error: {field}") or err.startswith(f"error: argument {field}:")


@pytest.mark.parametrize("case", CLI_CASES)
def test_command_line_contract(in_tmp, case):
    argv, field = CLI_CASES[case]
    rc, out, err = cli(argv)
    assert (rc, out) == (2, "") and err.count("\n") == 1 and _error_field_ok(err, field), err
    assert list(in_tmp.iterdir()) == []


def test_recompute_none_undoes_a_scenario(in_tmp):
    rc, out, _ = cli(["layer", str(SCENARIOS / "paper-22b.toml"), "--recompute-granularity",
                      "none", "--json"])
    assert rc == 0 and json.loads(out)["recompute_granularity"] == "none"


def test_world_size_derives_data_parallel_like_megatron(in_tmp):
    rc, out, _ = cli(["run", *TINY_META, "--world-size", "16", "--nodes", "2", "--json"])
    assert rc == 0
    assert {row["dp"] for row in json.loads(out)["ranks"]} == {0, 1, 2, 3}  # 16 / (2 * 2)


def test_megatron_distributed_optimizer_name(in_tmp):
    rc, out, _ = cli(["run", *TINY_META, "--use-distributed-optimizer", "--json"])
    rc_old, out_old, _ = cli(["run", *TINY_META, "--distributed-optimizer", "--json"])
    new, old = json.loads(out), json.loads(out_old)
    assert rc == rc_old == 0 and new.pop("command") != old.pop("command") and new == old


def test_version():
    rc, out, _ = cli(["--version"])
    assert rc == 0 and out.strip() == f"simsp {__import__('simsp').__version__}"


def test_every_flag_help_gives_meaning_and_default():
    rc, out, _ = cli(["run", "--help"])
    assert rc == 0 and "SCN_" not in out
    flat = " ".join(out.split())
    for needle in ("--hidden-size N hidden size h (elements); default: 64",
                   "--tensor-model-parallel-size N tensor-parallel size t (GPUs); default: 1",
                   "--recompute-granularity {none,selective,full}",
                   "--world-size N total GPUs"):
        assert needle in flat, needle


def test_ctrl_c_is_one_line_and_130(monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr("simsp.commands.layer.run", interrupted)
    assert cli(["layer"]) == (130, "", "interrupted\n")


def test_closed_pipe_exits_quietly(tmp_path):
    """`simsp ring ... | head -1`: no traceback, exit 141 (128 + SIGPIPE) or 0."""
    reader = subprocess.Popen([sys.executable, "-m", "simsp.cli", "ring", "--ranks", "8",
                               "--min-size", "8", "--max-size", "1G"], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    reader.stdout.readline()
    reader.stdout.close()
    err = reader.stderr.read().decode()
    assert reader.wait(timeout=120) in (0, 141) and err == "", err


def test_verify_float32_passes_with_float32_tolerances():
    rc, out, _ = cli(["verify", "--numeric-dtype", "float32", "--json"])
    report = json.loads(out)
    assert rc == 0 and report["passed"]
    assert report["fd_epsilon"] == pytest.approx(1.1920929e-07 ** (1 / 3))
    assert report["fd_bound_ratio"] <= 1.0


def test_json_is_strict_everywhere():
    """json.loads with NaN/Infinity refused parses every command's --json output."""
    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    for argv in (["layer", "--json"], ["ring", "--ranks", "4", "--size", "1M", "--json"]):
        rc, out, _ = cli(argv)
        assert rc == 0 and strict(out)


# --- the ring: bounded before it plans, fast where the flows have structure ---------------------

def test_ring_of_a_hundred_thousand_ranks_is_refused_before_planning():
    assert_error(["ring", "--ranks", "100000", "--size", "1M"], "--ranks")


def test_ring_of_512_ranks_on_64_nodes_runs():
    rc, out, _ = cli(["ring", "--ranks", "512", "--nodes", "64", "--size", "1G", "--json"])
    assert rc == 0 and json.loads(out)["ranks"] == 512


def test_readme_documents_every_bound():
    from simsp.scenario.limits import BOUNDS, _number
    readme = (REPO / "README.md").read_text()
    for field, bound in BOUNDS.items():
        assert f"| `{field}` | {_number(bound.low)} | {_number(bound.high)} |" in readme, field
