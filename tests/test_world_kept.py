"""The GPUs stay fixed unless the user varies them (docs/exploration.md): a sweep or what-if
over t, p or cp keeps the scenario's world size and derives d = world / (t·cp·p) (Megatron's
initialize_model_parallel); `run --world-size N` sets the nodes as `sweep --world-size` does.
Expected counts are worked by hand from scenarios/llama3-70b.toml (t 8, p 4, d 2, 8 nodes of 8:
64 GPUs)."""

import simsp.api
from simsp.explore.whatif.variants import variants_from_specs, whatif_configs
from simsp.scenario.loading import load_scenario

LLAMA = "scenarios/llama3-70b.toml"


def _layout(config) -> tuple:
    """(t, p, d, GPUs, nodes) of a configuration."""
    values = config.overrides()
    t, p, d = (values[("parallel", key)] for key in (
        "tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size"))
    return t, p, d, t * p * d, values[("cluster", "nodes")]


def test_a_t_sweep_keeps_64_gpus():
    """t 4 vs 8 on Llama 3 70B, simulated: 64 GPUs in both rows, d = 64/(4·4) = 4 and
    64/(8·4) = 2, the t 4 row's note says what changed."""
    frame = simsp.api.sweep(LLAMA, workers=0, tensor_model_parallel_size=[4, 8],
                            global_batch_size=16)
    assert list(frame["gpus"]) == [64, 64]
    assert list(frame["data_parallel_size"]) == [4, 2]
    assert list(frame["nodes"]) == [8, 8]
    assert frame["note"][0].startswith("64 GPUs on 8 node(s): d = 64/(t·p = 16) = 4 (was 2)")


def test_a_p_sweep_and_a_cp_sweep_keep_the_gpus():
    """p 2, 8 -> d = 64/(8·2) = 4, 64/(8·8) = 1; cp 2 -> d = 64/(8·2·4) = 1."""
    p_rows = simsp.api.build_configs(LLAMA, {"pipeline_model_parallel_size": "2,8",
                                             "num_layers_per_virtual_pipeline_stage": "none"})
    assert [_layout(c) for c in p_rows] == [(8, 2, 4, 64, 8), (8, 8, 1, 64, 8)]
    cp_row, = simsp.api.build_configs(LLAMA, {"context_parallel_size": 2})
    assert cp_row.overrides()[("parallel", "data_parallel_size")] == 1


def test_d_kept_where_it_cannot_be_derived_and_said_so():
    """t·p = 3·4 = 12 does not divide 64 GPUs: d stays 2 (3·4·2 = 24 GPUs) and the row's note
    says so."""
    row, = simsp.api.build_configs(LLAMA, {"tensor_model_parallel_size": 3})
    assert _layout(row)[:4] == (3, 4, 2, 24)
    assert row.error is None
    assert row.note == ("--tensor-model-parallel-size: tensor*pipeline = 3*4 = 12 does not "
                        "divide the scenario's 64 GPUs: d kept at 2 (24 GPUs)")


def test_given_d_nodes_or_world_win_over_the_kept_gpus():
    """The user varies the GPUs: d given (t 4 d 2: 32 GPUs), a world size (128: d 8)."""
    with_d, = simsp.api.build_configs(LLAMA, {"tensor_model_parallel_size": 4,
                                              "data_parallel_size": 2})
    assert _layout(with_d)[:4] == (4, 4, 2, 32)
    with_world, = simsp.api.build_configs(LLAMA, {"tensor_model_parallel_size": 4,
                                                  "world_size": 128})
    assert _layout(with_world) == (4, 4, 8, 128, 16)


def test_a_whatif_variant_over_t_keeps_the_gpus():
    configs = whatif_configs(variants_from_specs(LLAMA, ["t4=--tensor-model-parallel-size 4"]))
    assert [_layout(c) for c in configs] == [(8, 4, 2, 64, 8), (4, 4, 4, 64, 8)]


def test_run_world_size_sets_the_nodes():
    """128 GPUs of 8 per node: 16 nodes (the file says 8); --nodes given wins."""
    sc = load_scenario(LLAMA, world_size=128)
    assert (sc.parallel.data_parallel_size, sc.cluster.nodes) == (4, 16)
    sc = load_scenario(LLAMA, {("cluster", "nodes"): 20}, world_size=128)
    assert (sc.parallel.data_parallel_size, sc.cluster.nodes) == (4, 20)
    sc = load_scenario(LLAMA, {("cluster", "gpus_per_node"): 4}, world_size=128)
    assert sc.cluster.nodes == 32
