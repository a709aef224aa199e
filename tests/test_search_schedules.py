"""`simsp search` with the split-backward schedules (zb-h1, zb-h2, zbv, dualpipev, dualpipe):
their time bound equals the published closed forms at equal step times and stays below the
simulated iteration on random small layouts; sweep refuses a schedule as run does; the bundled
schedule what-if."""

import os

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from simsp.cli import main
from simsp.errors import UserError
from simsp.explore.configs.sweep_file import load_sweep_file
from simsp.explore.configs.fields import by_key
from simsp.explore.configs.grid import base_values
from simsp.explore.evaluation.evaluate import simulate_metrics
from simsp.explore.search.layouts import enumerate_layouts, search_base
from simsp.explore.search.bounds import (memory_lower_bound, split_schedule_time,
                                         time_lower_bound)
from simsp.scenario.loading import load_scenario

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPLIT = ("zb-h1", "zb-h2", "zbv", "dualpipev", "dualpipe")


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 12), (8, 16)])
def test_zero_bubble_bound_is_the_papers_at_equal_times(p, m):
    """ZB §2: ZB-H1's stage 0 idles (p−1)(F+B−W) beside its m(F+B+W) of work; stage p − 1 of
    ZB-H2 starts after p − 1 forwards and then never idles (m ≥ 2p − 1): both 3m + p − 1 at
    F = B = W = 1; with F = 2, B = 3, W = 1 ZB-H1 is 6m + (p − 1)·4."""
    assert split_schedule_time("zb-h1", p, m, 1, (1.0, 1.0, 1.0)) == pytest.approx(
        3 * m + p - 1, abs=1e-12)
    assert split_schedule_time("zb-h1", p, m, 1, (2.0, 3.0, 1.0)) == pytest.approx(
        6 * m + (p - 1) * 4, abs=1e-12)
    if m >= 2 * p - 1:
        assert split_schedule_time("zb-h2", p, m, 1, (1.0, 1.0, 1.0)) == pytest.approx(
            3 * m + p - 1, abs=1e-12)


@pytest.mark.parametrize("pp, m", [(4, 8), (4, 12), (8, 16), (8, 24)])
def test_dualpipe_bound_is_table_2_at_equal_times(pp, m):
    """DeepSeek-V3 Table 2: every rank does m chunk forwards and backwards (3m units at
    F = B = W = 1) and idles (PP/2 − 1)(F&B + B − 3W), Table 2's B the whole backward (2) and
    F&B = F + B + W = 3 (the run does not overlap a pair's halves and sends their outputs
    after the pair): 3m + PP − 2."""
    assert split_schedule_time("dualpipe", pp, m, 2, (1.0, 1.0, 1.0)) == pytest.approx(
        3 * m + pp - 2, abs=1e-12)


@pytest.mark.parametrize("n, m", [(2, 4), (2, 8), (4, 8), (4, 12), (8, 16)])
def test_dualpipev_bound_is_table_2_at_equal_times(n, m):
    """DualPipeV on n ranks (2n stages) runs its op lists as DualPipe does, a pair's and a full
    backward's outputs sent after the op (dualpipev.py): every rank does 2m chunk forwards and
    backwards (6m units) and idles Table 2's (PP/2 − 1)(F&B + B − 3W) with PP = 2n: 6m + 2(n − 1)."""
    assert split_schedule_time("dualpipev", n, m, 2, (1.0, 1.0, 1.0)) == pytest.approx(
        6 * m + 2 * (n - 1), abs=1e-12)


def layout(schedule: str, pp: int, layers: int, tp: int, sp: bool, recompute: str, b: int,
           m: int) -> dict:
    """A meta-mode tiny GPT on t·p GPUs (d 1) with the given schedule."""
    values = base_values(None)
    table = by_key()
    fields = {"mode": "meta", "num_layers": layers, "hidden_size": 128,
              "num_attention_heads": 4, "seq_length": 64, "vocab_size": 256,
              "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
              "sequence_parallel": sp, "recompute_granularity": recompute,
              "micro_batch_size": b, "global_batch_size": b * m, "schedule": schedule}
    for key, value in fields.items():
        values[table[key].path] = value
    values[("cluster", "nodes")] = 1
    return values


@settings(max_examples=5, suppress_health_check=[HealthCheck.too_slow])
@given(pp=st.sampled_from([2, 4]), chunks=st.sampled_from([1, 2]), tp=st.sampled_from([1, 2]),
       sp=st.booleans(), recompute=st.sampled_from(["none", "selective", "full"]),
       b=st.sampled_from([1, 2]), m=st.sampled_from([4, 8, 10]))
@pytest.mark.parametrize("schedule", SPLIT)
def test_bounds_hold_on_random_small_layouts(schedule, pp, chunks, tp, sp, recompute, b, m):
    """Time and memory lower bounds never above the simulation, for each schedule, and a time
    bound on every layout (where DualPipe's or DualPipeV's pairs overlap their TP collectives,
    the pairs' compute: tests/test_pair_bound.py)."""
    values = layout(schedule, pp, 2 * pp * chunks, tp, sp and tp > 1, recompute, b, m)
    try:
        sc = load_scenario(None, values)
    except UserError:
        assume(False)
    metrics = simulate_metrics(values)
    stage0 = max(r["peak_bytes"] for r in metrics["ranks"] if r["pp"] == 0)
    time_bound = time_lower_bound(sc)
    assert time_bound <= metrics["iteration_time_s"]
    assert time_bound > 0  # overlapped pairs too: their compute (pair_bound.py)
    assert 0 < memory_lower_bound(sc) <= stage0


def test_sweep_refuses_a_schedule_as_run_does(capsys, tmp_path):
    """ZB-V and DualPipeV need 2p to divide the layers: tiny's 4 layers on p = 4 do not, and
    each sweep row carries run's own `error:` line."""
    args = [os.path.join(REPO, "scenarios", "tiny.toml"), "--schedule", "zbv", "--pipeline-model-parallel-size", "4",
            "--data-parallel-size", "1"]
    assert main(["run", *args, "--json", "--quiet"]) == 2
    refusal = capsys.readouterr().err.strip()
    assert refusal == ("error: parallel.schedule: zbv needs num_layers=4 divisible by 2 x 4 "
                       "stages (two chunks)")
    sweep = ["sweep", *args[:2], "zbv,dualpipev", *args[3:], "--workers", "0", "--quiet",
             "--out", str(tmp_path)]
    assert main(sweep) == 0
    out = capsys.readouterr().out
    assert f"--schedule zbv: {refusal}" in out
    assert "--schedule dualpipev: error: parallel.schedule: dualpipev needs num_layers=4" in out


def test_the_bundled_schedule_what_if_compares_four_schedules_on_one_layout():
    """sweeps/schedules.toml: 1F1B (the baseline), interleaved with 2 chunks of 4 layers,
    ZB-H1 and DualPipe, each Llama 2 7B on t1 p4 d2 with 32 / (1·2) = 16 micro-batches."""
    variants = load_sweep_file(os.path.join(REPO, "sweeps", "schedules.toml"))
    scenarios = [load_scenario(None, values) for _, values, _, _ in variants]
    assert [name for name, *_ in variants] == ["1F1B", "interleaved, 2 chunks", "ZB-H1",
                                               "DualPipe"]
    assert [sc.parallel.schedule_name for sc in scenarios] == ["1f1b", "interleaved", "zb-h1",
                                                               "dualpipe"]
    for sc in scenarios:
        p = sc.parallel
        assert (p.tp, p.pp, p.dp, p.num_micro_batches, sc.model.num_layers) == (1, 4, 2, 16, 32)


def test_search_restricted_to_named_schedules():
    """`--schedule gpipe,dualpipe` on 2 GPUs, B = 2, 2 layers: only p = 2 layouts pipeline, b 1
    or 2 (m 2 or 1) x 3 recomputes, GPipe each (6); DualPipe needs m >= 2p = 4: none."""
    values = layout("1f1b", 1, 2, 1, False, "none", 1, 2)
    layouts = enumerate_layouts(search_base(values), 2, 2,
                                allowed={"schedule": ["gpipe", "dualpipe"]})
    names = [config.name for config in layouts.configs]
    assert len(names) == 6 and layouts.invalid == 0
    assert all(", GPipe, " in name and name.startswith("t1 p2 d1 b") for name in names)
