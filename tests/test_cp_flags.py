"""--context-parallel-size, --cp-comm-type and --hierarchical-context-parallel-sizes: Megatron-LM's
names, its shape rules, and one `error:` line for a layout it refuses (docs/context-parallel.md)."""

import subprocess
import sys

import pytest

from simsp.scenario.loading import load_scenario
from simsp.errors import UserError

TINY = "scenarios/tiny.toml"  # s = 32, a = 4, G = 4, t = 2, p = 2, d = 2


def _error(overrides: dict, world_size: int | None = None) -> UserError:
    with pytest.raises(UserError) as caught:
        load_scenario(TINY, {("parallel", k): v for k, v in overrides.items()},
                      world_size=world_size)
    return caught.value


def test_cp_one_is_the_default_layout():
    sc = load_scenario(TINY, {("parallel", "context_parallel_size"): 1,
                              ("parallel", "cp_comm_type"): "a2a"})
    assert (sc.parallel.cp, sc.parallel.world_size) == (1, 8)


@pytest.mark.parametrize("cp", [3, 5])
def test_sequence_must_split_into_2cp_chunks(cp):
    assert "2*context_parallel_size" in str(_error({"context_parallel_size": cp}))


HCP = "parallel.hierarchical_context_parallel_sizes"


@pytest.mark.parametrize("overrides, reason", [
    ({"cp_comm_type": "a2a+p2p"}, "must be set when cp_comm_type is a2a+p2p"),
    ({"context_parallel_size": 4, "hierarchical_context_parallel_sizes": "2 3"}, "2 x 3 = 6 is not"),
    ({"context_parallel_size": 2, "hierarchical_context_parallel_sizes": "2 x"}, "positive integers"),
    ({"context_parallel_size": 4, "cp_comm_type": "a2a+p2p",
      "hierarchical_context_parallel_sizes": "4"}, "takes two sizes"),
    ({"context_parallel_size": 4, "cp_comm_type": "a2a+p2p",  # 2 heads per TP rank
      "hierarchical_context_parallel_sizes": "4 1"}, "not divisible"),
])
def test_hierarchical_sizes_follow_megatron_checks(overrides, reason):
    err = _error(overrides)
    assert err.field == HCP and reason in str(err), str(err)


def test_hierarchical_sizes_from_a_toml_list(tmp_path):
    path = tmp_path / "hcp.toml"
    path.write_text(open("scenarios/llama-tiny-cp.toml").read().replace(
        "context_parallel_size = 2", 'context_parallel_size = 4\ncp_comm_type = "a2a+p2p"\n'
        "hierarchical_context_parallel_sizes = [2, 2]").replace("data_parallel_size = 2",
                                                             "data_parallel_size = 1"))
    sc = load_scenario(path, {("model", "num_attention_heads"): 8,
                              ("model", "num_query_groups"): 4})
    assert sc.parallel.hcp_sizes == (2, 2) and sc.parallel.world_size == 16


def test_a2a_needs_heads_divisible_by_cp():
    # t = 2 leaves 2 heads per TP rank: cp = 4 cannot split them
    err = _error({"context_parallel_size": 4, "cp_comm_type": "a2a"})
    assert err.field == "parallel.cp_comm_type" and "not divisible" in str(err)


def test_world_size_divides_by_t_cp_p():
    err = _error({"context_parallel_size": 2}, world_size=6)
    assert "tensor*context*pipeline = 2*2*2 = 8" in str(err)


def test_cp_needs_flash_attention_as_megatron_does():
    err = _error({"context_parallel_size": 2})  # tiny.toml: the unfused core
    assert err.field == "parallel.context_parallel_size" and "FlashAttention" in str(err)


def test_the_cp_scenario_loads_with_attention_dropout_too():
    sc = load_scenario("scenarios/llama-tiny-cp.toml", {("model", "attention_dropout"): 0.1})
    assert (sc.parallel.cp, sc.parallel.world_size, sc.model.attention_dropout) == (2, 16, 0.1)


def test_cli_gives_one_error_line_and_exit_2(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "simsp.cli", "run", TINY, "--cp-comm-type",
                           "a2a+p2p", "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 2 and not out.exists()
    assert done.stderr.splitlines() == [
        f"error: {HCP}: must be set when cp_comm_type is a2a+p2p (--hierarchical-context-"
        "parallel-sizes A P, A·P = context_parallel_size)"]
