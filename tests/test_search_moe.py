"""Search over expert layouts: the expert options counted by hand, the bundled Mixtral layout
bounded below its own `run`, a Mixtral search that finds it (or better) with EP > 1, and a
`why none:` line whenever nothing is simulated or nothing fits."""

import json

import pandas as pd
import pytest

from simsp.explore.search.bounds import memory_lower_bound, time_lower_bound
from simsp.explore.search.layouts import expert_options
from simsp.scenario.loading import load_scenario
from tests.inprocess import cli

MIXTRAL = "scenarios/mixtral-8x7b.toml"
TINY = ["--mode", "meta", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads",
        "4", "--seq-length", "32", "--vocab-size", "128"]


def _sizes(options: list) -> list:
    return [(o["expert_model_parallel_size"], o["moe_token_dispatcher_type"],
             o["moe_grouped_gemm"]) for o in options]


def test_expert_options_counted_by_hand():
    """4 experts, t 1: EP 1 keeps its tokens (one dispatcher) with grouped GEMM off/on (2);
    EP 2: 2 dispatchers x 2 (4); EP 4: one expert per rank, so grouped GEMM is moot (2)."""
    options = expert_options(4, 1, {})
    assert len(options) == 8
    assert _sizes(options)[:3] == [(1, "allgather", False), (1, "allgather", True),
                                   (2, "alltoall", False)]
    assert {o["expert_tensor_parallel_size"] for o in options} == {None}
    assert len(expert_options(4, 2, {})) == 4 + 4 + 2  # t 2: EP 1 already crosses ranks (ETP 2)
    restricted = expert_options(4, 1, {"expert_model_parallel_size": [2],
                                       "moe_grouped_gemm": [True]})
    assert _sizes(restricted) == [(2, "alltoall", True), (2, "allgather", True)]
    assert _sizes(expert_options(None, 8, {})) == [(1, "allgather", False)]  # dense: defaults


@pytest.fixture(scope="module")
def bundled() -> dict:
    """`simsp run --json` of the bundled Mixtral scenario."""
    rc, out, _ = cli(["run", MIXTRAL, "--json"])
    assert rc == 0
    return json.loads(out)


def test_bundled_mixtral_bounds_are_below_its_run(bundled):
    """The bundled layout (t1 p4 d16 EP 8) on 64 H100s: both bounds at most what `run` gives
    (the old bound, EP reset to 1, put all 8 experts on each rank: 105 GiB against 50.7)."""
    stage0_peak = max(rank["peak_bytes"] for rank in bundled["ranks"] if rank["pp"] == 0)
    sc = load_scenario(MIXTRAL)
    assert 0.9 * stage0_peak < memory_lower_bound(sc) <= stage0_peak
    assert 0.8 * bundled["iteration_time_s"] < time_lower_bound(sc) <= bundled["iteration_time_s"]


def test_mixtral_search_finds_the_bundled_layout_or_better_with_ep(bundled, tmp_path):
    """EP free, the rest restricted to the bundled layout's values (to keep the test short):
    EP 1 is screened out by memory (all 8 experts on a rank), and the winner of EP 2, 4, 8 fits,
    has EP > 1 and is no slower than `run` of the bundled scenario; every bound held."""
    rc, out, err = cli(["search", MIXTRAL, "--gpus", "64", "--top", "1",
                        "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size",
                        "4", "--micro-batch-size", "1", "--recompute-granularity", "none",
                        "--schedule", "1f1b", "--distributed-optimizer", "true",
                        "--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm", "true",
                        "--workers", "0", "--quiet", "--out", str(tmp_path)])
    assert rc == 0, err
    frame = pd.read_csv(tmp_path / "results.csv")
    assert sorted(frame["expert_model_parallel_size"]) == [2, 4, 8]
    assert "screened out 1 whose memory lower bound" in out
    winner = frame[frame["fits"]].sort_values("iteration_time_s").iloc[0]
    assert winner["expert_model_parallel_size"] > 1
    assert winner["iteration_time_s"] <= bundled["iteration_time_s"] * (1 + 1e-9)
    assert "every simulated layout checked: both bounds held" in out
    assert " ep8 " in out.split("top 1:")[1].splitlines()[1]


def test_every_layout_rejected_says_why_per_field(tmp_path):
    """A dense model with EP 2 asked for: every layout rejected, one line per field, counted."""
    rc, out, _ = cli(["search", "--gpus", "4", *TINY, "--global-batch-size", "4",
                      "--expert-model-parallel-size", "2", "--workers", "0", "--quiet",
                      "--out", str(tmp_path)])
    assert rc == 0
    assert "why none: the config checks rejected every layout:" in out
    lines = out.split("why none: the config checks rejected every layout:\n")[1].splitlines()
    assert lines[0].startswith("  ") and "x parallel.expert_model_parallel_size (e.g." in lines[0]
    assert "needs num_experts" in lines[0]


def test_nothing_fits_says_why(tmp_path):
    """8 layers of h 8192 on 1 GPU (8·12·8192² = 6.4B parameters at 2 + 4 + 12 bytes: 108 GiB
    before any activation) cannot fit an 80 GiB GPU: the 3 layouts (t1 p1 d1 b1 under no,
    selective and full recompute) all screened out, and said so."""
    rc, out, _ = cli(["search", "--gpus", "1", "--mode", "meta", "--num-layers", "8",
                      "--hidden-size", "8192", "--num-attention-heads", "64", "--seq-length",
                      "256", "--vocab-size", "1024", "--global-batch-size", "1",
                      "--workers", "0", "--quiet", "--out", str(tmp_path)])
    assert rc == 0
    assert "simulated 0" in out
    assert "why none: all 3 valid layouts need more memory than capacity less the reserve" in out


def test_a_held_list_is_varied_where_it_matters():
    """2 GPUs, B = 2, flash attention, 2 layers, no recompute, b 1: cp 1 gives (t,p,d) =
    (1,1,2) x dist-opt on/off (2), (1,2,1) with 1F1B, ZB-H1 and ZB-H2 (3; one layer a stage and
    m = 2 leave out the two-chunk ones), (2,1,1) x SP on/off (2) = 7 layouts, each once (the CP
    type does not matter there); cp 2 gives t1 p1 d1 (1) once per type, p2p and a2a: 7 + 2 = 9,
    the cp 2 ones named by their type."""
    from simsp.explore.configs.grid import base_values
    from simsp.explore.configs.fields import by_key
    from simsp.explore.search.layouts import enumerate_layouts, search_base
    values, table = base_values(None), by_key()
    for key, value in {"mode": "meta", "num_layers": 2, "hidden_size": 64,
                       "num_attention_heads": 4, "seq_length": 64, "vocab_size": 128,
                       "attention_backend": "flash"}.items():
        values[table[key].path] = value
    layouts = enumerate_layouts(search_base(values), 2, 2,
                                {"context_parallel_size": (1, 2), "cp_comm_type": ("p2p", "a2a")},
                                allowed={"recompute_granularity": ["none"],
                                         "micro_batch_size": [1]})
    names = [config.name for config in layouts.configs]
    assert len(names) == 9 and layouts.invalid == 0
    assert [name for name in names if "cp2" in name] == [
        "t1 cp2 p1 d1 b1, 1F1B, no SP, no recompute, cp_comm_type p2p",
        "t1 cp2 p1 d1 b1, 1F1B, no SP, no recompute, cp_comm_type a2a"]
    assert not any("cp_comm_type" in name for name in names if "cp2" not in name)
