"""`simsp search`: layout enumeration (hand-counted), the bounds as lower bounds of the
simulation, and the command's output (brute force vs branch and bound:
tests/test_search_exhaustive.py)."""

import pytest

from simsp.cli import main
from simsp.explore.configs.grid import base_values
from simsp.explore.evaluation.evaluate import evaluate, simulate_metrics
from simsp.explore.search.explain import limits, why_lost
from simsp.explore.configs.fields import by_key
from simsp.explore.search.layouts import enumerate_layouts, search_base
from simsp.explore.search.bounds import (memory_lower_bound, memory_verdict, scenario_of,
                                         time_lower_bound)

TINY = {"mode": "meta", "num_layers": 4, "hidden_size": 128, "num_attention_heads": 4,
        "seq_length": 64, "vocab_size": 256}


def base(**changes) -> dict:
    values = base_values(None)
    table = by_key()
    for key, value in {**TINY, **changes}.items():
        values[table[key].path] = value
    return values


def test_layouts_on_two_gpus_hand_counted():
    """N = 2, B = 2. (t,p,d) = (1,1,2): b 1, 3 recomputes x 2 dist-opt = 6; (1,2,1): b 1 or 2,
    each 1F1B, ZB-H1 and ZB-H2 x 3 recomputes = 18, plus with 4 layers (2 a stage) ZB-V on
    both (6 more) and b 1 (m = 2) may interleave 2 chunks of 1 layer: 3 more (DualPipe(V)
    needs m >= 2p = 4); (2,1,1): b 1 or 2, SP on/off x 3 = 12. Total 36 with 2 layers, 45
    with 4."""
    two = enumerate_layouts(base(num_layers=2), gpus=2, batch=2)
    four = enumerate_layouts(base(num_layers=4), gpus=2, batch=2).configs
    assert (len(two.configs), two.invalid, len(four)) == (36, 0, 45)
    assert len({c.digest() for c in four}) == 45
    interleaved = [c.name for c in four if "interleaved" in c.name]
    assert interleaved == ["t1 p2 d1 b1, interleaved 2 chunks, no SP, no recompute",
                           "t1 p2 d1 b1, interleaved 2 chunks, no SP, selective recompute",
                           "t1 p2 d1 b1, interleaved 2 chunks, no SP, full recompute"]


def test_every_layout_uses_all_gpus():
    for config in enumerate_layouts(base(), gpus=8, batch=8).configs:
        p = scenario_of(config).parallel
        assert p.tp * p.pp * p.dp == 8 and p.global_batch == 8


def test_scenario_parallel_fields_do_not_leak_into_layouts():
    """A scenario's block recompute made two thirds of the layouts invalid (none and selective
    cannot take a recompute method): the search starts from Megatron's defaults, and a kept
    or given field applies only where Megatron allows it. 105 layouts of 1F1B and interleaving,
    plus the split-backward schedules (6 layouts a schedule for each (t, p, d, b) with t·d = 2,
    3 with t = d = 1): t1 p2 d2 b1 and b2 (m 2, 1) ZB-H1, ZB-H2, ZB-V: 36; t2 p2 d1 b1 (m 4)
    those and DualPipeV, DualPipe, b2 and b4 three each: 66; t1 p4 d1 (1 layer a stage, m at
    most 4 < 2p) ZB-H1 and ZB-H2 for b 1, 2, 4: 18. 225 in all."""
    scenario = base(recompute_granularity="full", recompute_method="block",
                    recompute_num_layers=1, overlap_grad_reduce=True)
    plain = enumerate_layouts(search_base(scenario), gpus=4, batch=4)
    assert plain.invalid == 0 and len(plain.configs) == 225
    assert {scenario_of(c).parallel.recompute_method for c in plain.configs} == {None}
    fixed = {"recompute_method": "block", "recompute_num_layers": 1}
    kept = enumerate_layouts(search_base(scenario), 4, 4, fixed)
    assert kept.invalid == 0 and len(kept.configs) == 225
    methods = {(scenario_of(c).parallel.recompute_granularity,
                scenario_of(c).parallel.recompute_method) for c in kept.configs}
    assert methods == {("none", None), ("selective", None), ("full", "block")}


def sample_layouts(gpus=4, batch=4, step=7):
    return enumerate_layouts(base(), gpus=gpus, batch=batch).configs[::step]


@pytest.mark.parametrize("config", sample_layouts(), ids=lambda c: c.name)
def test_bounds_are_lower_bounds_of_the_simulation(config):
    sc = scenario_of(config)
    metrics = simulate_metrics(config.overrides())
    stage0 = max(r["peak_bytes"] for r in metrics["ranks"] if r["pp"] == 0)
    assert memory_lower_bound(sc) <= stage0
    assert time_lower_bound(sc) <= metrics["iteration_time_s"]


def test_memory_screen_prunes_only_layouts_that_run_out_of_memory():
    """A 20-layer h = 6144 model on 2 GPUs: t = 1 layouts need ~170 GiB of weights and states."""
    big = base(num_layers=20, hidden_size=6144, num_attention_heads=48, seq_length=256,
               vocab_size=1024)
    configs = enumerate_layouts(big, gpus=2, batch=2).configs
    pruned = [c for c in configs if memory_verdict(scenario_of(c))]
    assert pruned and len(pruned) < len(configs)
    for config in pruned[::5]:
        assert evaluate(config.values)["status"] == "oom", config.name


def test_cli_search_explains_the_top_and_the_pruning(capsys, tmp_path):
    args = ["search", "--gpus", "4", "--num-layers", "4", "--hidden-size",
            "128", "--seq-length", "64", "--vocab-size", "256", "--global-batch-size", "4",
            "--top", "3", "--workers", "0", "--quiet", "--out", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "screened out 0 whose memory lower bound" in out and "time lower bound" in out
    assert "both bounds held" in out
    assert "top 3:" in out and out.count("limits: bubble") == 3
    assert (tmp_path / "report.md").exists() and (tmp_path / "results.csv").exists()


@pytest.mark.parametrize("flag, value", [("--gpus", "0"), ("--top", "0")])
def test_cli_search_rejects_bad_counts(capsys, tmp_path, flag, value):
    args = ["search", "--workers", "0", "--out", str(tmp_path), flag, value]
    args += ["--gpus", "4"] if flag != "--gpus" else []  # a flag given twice is its own error
    assert main(args) == 2
    assert capsys.readouterr().err.strip() == f"error: {flag}: must be a positive integer, got 0"


def test_explanations_from_a_hand_made_row():
    """Bubble seconds = T × f (f the idle share): 12 × 0.25 = 3 s against the best's
    10 × 0.2 = 2 s; waits are shown, not counted twice."""
    best = {"status": "ok", "iteration_time_s": 10.0, "bubble_fraction": 0.2,
            "exposed_tp_comm_s": 1.0, "exposed_pp_wait_s": 0.5, "headroom_bytes": 2 * 2**30}
    row = {**best, "iteration_time_s": 12.0, "bubble_fraction": 0.25, "exposed_tp_comm_s": 0.5}
    assert limits(row) == ("bubble 3.000 s (25.0%), tp_comm 500.000 ms, pp_wait 500.000 ms "
                           "(in the bubble); headroom 2.0 GiB; largest loss: bubble")
    # bubble 3 s vs 2 s: +1 s; tp_comm −0.5 s; the rest +1.5 s of the +2 s
    assert why_lost(row, best) == ("+20.0% time vs the best: compute and rest +1.500 s, "
                                   "bubble +1.000 s, tp_comm -500.000 ms")
    oom = {**row, "status": "oom", "oom_stage": 3, "oom_bytes_over": 1.5 * 2**30}
    assert why_lost(oom, best) == "OOM on stage 3 by 1.50 GiB (would take 12.000 s)"


def test_compute_is_not_a_loss():
    """The exposure breakdown's `compute` kind is the work itself, never listed as a loss."""
    row = {"status": "ok", "iteration_time_s": 2.0, "bubble_fraction": 0.0,
           "exposed_compute_s": 1.5, "exposed_dp_comm_s": 0.25, "headroom_bytes": 0}
    assert limits(row) == ("bubble 0.000 us (0.0%), dp_comm 250.000 ms; headroom 0.0 GiB; "
                           "largest loss: dp_comm")


def test_cli_exhaustive_simulates_every_layout(capsys, tmp_path):
    args = ["search", "--gpus", "2", "--num-layers", "2", "--hidden-size", "64", "--seq-length",
            "32", "--vocab-size", "128", "--global-batch-size", "2", "--exhaustive", "--workers",
            "0", "--quiet", "--out", str(tmp_path)]
    assert main(args) == 0
    assert "exhaustive: simulated all 36 valid layouts" in capsys.readouterr().out  # hand-counted above
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 36
