"""simsp's Python API: real signatures and docstrings, the same numbers as the command line,
and the examples/ script run as a plain script (no __main__ guard) on two Dask workers."""

import inspect
import json
import subprocess
import sys
from pathlib import Path

import simsp
from simsp.cli import main
from simsp.explore.results.headroom import DEFAULT_MEMORY_RESERVE_GIB

ROOT = Path(__file__).resolve().parent.parent


def test_signatures_and_docstrings_are_real():
    for function, names in ((simsp.run, {"scenario", "world_size"}),
                            (simsp.sweep, {"source", "out", "workers", "world_size",
                                           "memory_reserve_gib"}),
                            (simsp.search, {"scenario", "gpus", "top", "objective",
                                            "exhaustive"})):
        assert names <= set(inspect.signature(function).parameters), function.__name__
        assert "Main" in function.__doc__ or "Columns" in function.__doc__
    assert simsp.RESERVE_GIB == DEFAULT_MEMORY_RESERVE_GIB


def test_run_equals_the_command_line(capsys):
    metrics = simsp.run(mode="meta", num_layers=4, pipeline_model_parallel_size=2,
                        global_batch_size=4)
    assert main(["run", "--mode", "meta", "--num-layers", "4", "--pipeline-model-parallel-size",
                 "2", "--global-batch-size", "4", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert metrics["iteration_time_s"] == printed["iteration_time_s"]
    assert metrics["mfu"] == printed["mfu"]


def test_example_script_runs_as_a_plain_script_on_dask(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "explore.py"), "--workers",
                           "2"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reproduce the winner: simsp run" in done.stdout
    assert done.stdout.count("--world-size 8") == 2  # both IB rows of the 8-GPU what-if


def test_search_out_writes_what_the_command_writes(tmp_path, capsys):
    """simsp.search(out=...) writes the command's results.csv, results.jsonl and report.md,
    byte for byte (the same layouts, simulated in this process)."""
    flags = {"num_layers": 4, "hidden_size": 128, "seq_length": 64, "vocab_size": 256}
    simsp.search(gpus=4, global_batch_size=4, top=3, out=tmp_path / "api", workers=0,
                 quiet=True, **flags)
    argv = ["search", "--gpus", "4", "--global-batch-size", "4", "--top", "3", "--workers",
            "0", "--quiet", "--out", str(tmp_path / "cli")]
    for name, value in flags.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    assert main(argv) == 0
    capsys.readouterr()
    for name in ("results.csv", "results.jsonl", "report.md"):
        api, cli = (tmp_path / side / name for side in ("api", "cli"))
        assert api.read_bytes() == cli.read_bytes(), name
