"""The same sweep on an embedded LocalCluster, on a scheduler with two workers started here
(loopback only, reached by address as `--scheduler` would), and in-process: identical tables."""

import logging

from distributed import LocalCluster

from simsp.cli import main

SWEEP = ["sweep", "--mode", "meta", "--num-layers", "4", "--hidden-size", "64",
         "--tensor-model-parallel-size", "1,2", "--pipeline-model-parallel-size", "1,2,3",
         "--recompute-granularity", "none,full", "--global-batch-size", "4", "--quiet"]


def results(tmp_path, name: str, capsys, *executor) -> bytes:
    folder = tmp_path / name
    assert main([*SWEEP, "--out", str(folder), *executor]) == 0
    capsys.readouterr()
    return (folder / "results.csv").read_bytes() + (folder / "results.jsonl").read_bytes()


def test_scheduler_and_embedded_cluster_give_identical_tables(tmp_path, capsys):
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster:
        remote = results(tmp_path, "remote", capsys, "--scheduler", cluster.scheduler_address)
    embedded = results(tmp_path, "embedded", capsys, "--workers", "2")
    local = results(tmp_path, "local", capsys, "--workers", "0")
    assert remote == embedded == local
    assert remote.count(b"\n") == (1 + 12) + 12  # CSV header + 12 rows, then 12 JSON lines
    assert b"is not divisible by 3 stages" in remote  # p = 3 rows are errors, not the end


def test_unreachable_scheduler_is_one_error_line(capsys, tmp_path):
    code = main([*SWEEP, "--out", str(tmp_path), "--scheduler", "tcp://127.0.0.1:9"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --scheduler: cannot reach tcp://127.0.0.1:9")


def test_embedded_workers_run_without_the_statistical_profiler():
    from simsp.explore.evaluation.executor import Executor
    with Executor(workers=1) as executor:
        enabled = executor.client.run(
            lambda: __import__("dask").config.get("distributed.worker.profile.enabled"))
    assert list(enabled.values()) == [False]
