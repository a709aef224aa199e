"""Exploration that answers: GPUs as an axis (d derived as Megatron does), headroom against a
memory reserve, each row's `simsp run` command reproducing it, reports that survive failures."""

import json
import shlex

import pandas as pd

import simsp
from simsp.cli import main
from simsp.units import GiB

TINY = ["--mode", "meta", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads",
        "4", "--seq-length", "32", "--vocab-size", "128"]


def test_world_size_derives_d_and_nodes_and_the_gpus_column(capsys, tmp_path):
    """t2 p2: 8 GPUs give d = 2 on one node, 32 give d = 8 on 4 nodes; B = 8 is kept."""
    args = ["sweep", *TINY, "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size",
            "2", "--global-batch-size", "8", "--world-size", "8,32", "--workers", "0", "--quiet",
            "--out", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    frame = pd.read_csv(tmp_path / "results.csv")
    assert list(frame["gpus"]) == [8, 32] and list(frame["data_parallel_size"]) == [2, 8]
    assert list(frame["nodes"]) == [1, 4]
    assert "32 GPUs on 4 node(s): d = 32/(t·p = 4) = 8 (was 1); global batch 8 as given (8 → 1 micro-batches per pipeline)" in out
    assert "| GPUs |" in (tmp_path / "report.md").read_text()


def test_world_size_64_128_doubles_d(capsys, tmp_path):
    """The trial's own lists: t8 p2 with --world-size 64,128 gives d = 4 then 8, 8 then 16
    nodes, the GPUs column saying so."""
    frame = simsp.sweep(None, workers=0, mode="meta", num_layers=4, hidden_size=64,
                        num_attention_heads=8, tensor_model_parallel_size=8,
                        pipeline_model_parallel_size=2, global_batch_size=64,
                        world_size="64,128")
    assert list(frame["gpus"]) == [64, 128] and list(frame["data_parallel_size"]) == [4, 8]
    assert list(frame["nodes"]) == [8, 16]


def test_more_nodes_alone_use_every_gpu(tmp_path):
    """--nodes 1,2 with t2 p2 d1 on 8-GPU nodes: Megatron's world is every launched GPU."""
    frame = simsp.sweep(None, workers=0, mode="meta", tensor_model_parallel_size=2,
                        pipeline_model_parallel_size=2, global_batch_size=8, nodes="1,2")
    assert list(frame["gpus"]) == [8, 16] and list(frame["data_parallel_size"]) == [2, 4]
    assert "micro-batches per pipeline" in frame["note"][1]


def test_each_rows_command_reproduces_it(capsys, tmp_path):
    scenario = tmp_path / "s.toml"
    scenario.write_text("[model]\nnum_layers = 4\nhidden_size = 64\n[parallel]\n"
                        "distributed_optimizer = true\ndata_parallel_size = 2\n[run]\nmode = \"meta\"\n")
    frame = simsp.sweep(scenario, out=tmp_path / "out", workers=0,
                        distributed_optimizer="true,false", ib_bandwidth_GBps="25,50",
                        add_bias_linear="true,false")
    commands = list(frame["command"])
    assert "--use-distributed-optimizer" not in commands[0]  # the scenario's own value
    assert all(" false" not in c and " none" not in c for c in commands)
    assert sum("--disable-bias-linear" in c for c in commands) == 4  # run's own switch
    for row in frame.to_dict("records"):
        argv = shlex.split(row["command"])
        assert argv[:2] == ["simsp", "run"]
        assert main(argv[1:] + ["--json"]) == 0
        metrics = json.loads(capsys.readouterr().out)
        assert metrics["iteration_time_s"] == row["iteration_time_s"]
        assert max(r["peak_bytes"] for r in metrics["ranks"]) == row["peak_bytes_max"]


def test_headroom_is_capacity_less_reserve_less_peak():
    # one A100, no communicator: CUDA context 723 MiB + cuBLAS 8.125 + cuBLASLt 1 MiB + the
    # 2 GiB fragmentation allowance (docs/non_tensor_memory.md)
    reserve = (723 + 9.125 + 2048) * 2**20
    frame = simsp.sweep(None, workers=0, mode="meta", micro_batch_size="1,2")
    for row in frame.to_dict("records"):
        assert row["memory_reserve_bytes"] == reserve
        assert row["headroom_bytes"] == 80 * GiB - reserve - row["peak_bytes_max"]
        assert row["fits"] is True or row["fits"] == True  # noqa: E712  (numpy bool)


def test_all_failed_sweep_writes_a_report(capsys, tmp_path):
    assert main(["sweep", "--tensor-model-parallel-size", "3,5", "--workers", "0", "--quiet",
                 "--out", str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "2 configurations: 0 fit, 0 out of memory, 2 invalid" in report
    assert "not divisible by 3" in report


def test_search_winner_leaves_the_reserve_and_the_report_explains(capsys, tmp_path):
    """Peaks of 0.1 to 0.4 GiB: a 79.7 GiB reserve leaves 0.3 GiB, and some layouts out."""
    args = ["search", "--gpus", "4", "--num-layers", "4", "--hidden-size", "1024",
            "--num-attention-heads", "16", "--seq-length", "256", "--vocab-size", "1024",
            "--global-batch-size", "4", "--top", "2", "--memory-reserve", "79.7", "--workers",
            "0", "--quiet", "--out", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    frame = pd.read_csv(tmp_path / "results.csv")
    winner = frame.sort_values("iteration_time_s")
    winner = winner[winner["fits"]].iloc[0]
    assert winner["headroom_bytes"] >= 0
    assert frame["fits"].sum() < len(frame)  # the reserve left some out
    report = (tmp_path / "report.md").read_text()
    for line in ("limits: bubble", "best rejected:", "Reproduce the best", "simsp run"):
        assert line in report and (line in out or line in ("Reproduce the best", "simsp run"))
    assert main(shlex.split(winner["command"])[1:] + ["--json"]) == 0  # the winner's command
    assert json.loads(capsys.readouterr().out)["iteration_time_s"] == winner["iteration_time_s"]


def test_search_with_no_layout_says_why(capsys, tmp_path):
    args = ["search", "--gpus", "100", *TINY[2:], "--global-batch-size", "4", "--workers", "0",
            "--quiet", "--out", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "0 layouts" in out and "why none: Megatron needs t·p·d = 100" in out


def test_a_second_sweep_writes_beside_the_first(capsys, tmp_path, monkeypatch):
    """Same scenario, other values: a new folder; the same sweep again: its own folder back."""
    monkeypatch.chdir(tmp_path)
    sweep = ["sweep", *TINY, "--workers", "0", "--quiet", "--micro-batch-size"]
    assert main([*sweep, "1,2"]) == 0
    assert main([*sweep, "1,4"]) == 0
    assert main([*sweep, "1,2"]) == 0
    folders = sorted(p.name for p in (tmp_path / "reports").iterdir())
    assert folders == ["sweep-default-micro-batch-size", "sweep-default-micro-batch-size-2"]
    first = pd.read_csv(tmp_path / "reports" / folders[0] / "results.csv")
    assert list(first["micro_batch_size"]) == [1, 2]


def test_a_world_size_t_p_misses_is_its_own_error_row():
    """3 GPUs for t2 p2: that row alone is invalid (the 4-GPU row has the same fields)."""
    frame = simsp.sweep(None, workers=0, mode="meta", tensor_model_parallel_size=2,
                        pipeline_model_parallel_size=2, global_batch_size=4, world_size="3,4")
    assert list(frame["status"]) == ["error", "ok"]
    assert frame["error"][0] == "error: --world-size: 3 is not divisible by tensor*pipeline = 2*2 = 4"


def test_world_size_divides_by_t_cp_p():
    """t 8, cp 2, p 1 on 16 GPUs is one replica (d = 1, t·cp·p·d = 16), not d = 2; 24 GPUs
    are no whole number of replicas. As a sweep (t 2, cp 2): 8 GPUs give d 2, 6 an error row."""
    from simsp.explore.configs.world import CP, D, GPN, NODES, P, T, derive_world
    values = {T: 8, P: 1, CP: 2, D: 4, GPN: 8, NODES: 1, ("parallel", "global_batch_size"): 8,
              ("parallel", "micro_batch_size"): 1}
    merged, error, note = derive_world(values, values, 16, set())
    assert error is None and merged[D] == 1 and merged[NODES] == 2
    assert note.startswith("16 GPUs on 2 node(s): d = 16/(t·cp·p = 16) = 1 (was 4)")
    _, error, _ = derive_world(values, values, 24, set())
    assert error == "error: --world-size: 24 is not divisible by tensor*context*pipeline = 8*2*1 = 16"
    frame = simsp.sweep(None, workers=0, mode="meta", num_layers=2, hidden_size=64,
                        num_attention_heads=4, seq_length=32, vocab_size=128,
                        attention_backend="flash", tensor_model_parallel_size=2,
                        context_parallel_size=2,
                        pipeline_model_parallel_size=1, global_batch_size=4, world_size="6,8")
    assert list(frame["status"]) == ["error", "ok"]
    assert list(frame["data_parallel_size"])[1] == 2 and list(frame["gpus"])[1] == 8
