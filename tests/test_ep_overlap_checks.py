"""--overlap-moe-expert-parallel-comm and --delay-wgrad-compute: Megatron-Core's own refusals
(megatron/core/transformer/transformer_config.py __post_init__), each naming the field, the
command line's one error: line; what Megatron accepts loads (flex, the delayed weight
gradients)."""

import pytest

from inprocess import cli
from simsp.errors import UserError
from simsp.scenario.loading import load_scenario

MOE = "scenarios/moe-tiny-cp.toml"  # EP 2, the alltoall dispatcher, PP 1
OVERLAP = {"overlap_moe_expert_parallel_comm": True}


def _refused(parallel: dict, model: dict | None = None) -> UserError:
    """The error loading the MoE scenario with these overrides raises."""
    overrides = {("parallel", k): v for k, v in parallel.items()}
    overrides.update({("model", k): v for k, v in (model or {}).items()})
    with pytest.raises(UserError) as caught:
        load_scenario(MOE, overrides)
    return caught.value


@pytest.mark.parametrize("parallel,model,words", [
    ({"delay_wgrad_compute": True}, None, "needs overlap_moe_expert_parallel_comm"),
    ({**OVERLAP, "moe_token_dispatcher_type": "allgather"}, None, "alltoall or flex"),
    ({**OVERLAP, "recompute_granularity": "full"}, None, "recompute_granularity full"),
    ({**OVERLAP, "recompute_granularity": "selective", "recompute_modules": "moe"}, None,
     "moe in recompute_modules"),
    ({**OVERLAP, "pipeline_model_parallel_size": 2, "context_parallel_size": 1}, None,
     "virtual pipeline stages"),
    ({**OVERLAP, "expert_model_parallel_size": 1, "expert_tensor_parallel_size": None}, None,
     "expert_model_parallel_size > 1"),
    ({**OVERLAP, "schedule": "zb-h1"}, None, "not the zb-h1 schedule")])  # simsp's: no W steps
def test_megatrons_refusals_name_the_field(parallel, model, words):
    err = _refused(parallel, model)
    field = "parallel.delay_wgrad_compute" if "delay_wgrad_compute" in parallel and \
        len(parallel) == 1 else "parallel.overlap_moe_expert_parallel_comm"
    assert err.field == field
    assert words in err.reason


def test_command_line_prints_one_error_line():
    rc, out, err = cli(["run", MOE, "--delay-wgrad-compute"])
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("error: parallel.delay_wgrad_compute")


def test_what_megatron_accepts_loads():
    """PP 1, and PP 2 with virtual stages (4 layers, 1 per chunk): the overlap is accepted
    (training/pipeline/combined_1f1b.py runs it)."""
    overrides = {("parallel", k): v for k, v in OVERLAP.items()}
    assert load_scenario(MOE, overrides).parallel.overlap_moe_expert_parallel_comm
    overrides.update({("parallel", "pipeline_model_parallel_size"): 2,
                      ("parallel", "context_parallel_size"): 1,
                      ("parallel", "num_layers_per_virtual_pipeline_stage"): 1,
                      ("parallel", "global_batch_size"): 8, ("model", "num_layers"): 4})
    assert load_scenario(MOE, overrides).parallel.schedule_name == "interleaved"
    flex = {**overrides, ("parallel", "moe_token_dispatcher_type"): "flex",
            ("parallel", "moe_enable_deepep"): True, ("parallel", "delay_wgrad_compute"): True}
    loaded = load_scenario(MOE, flex).parallel  # Megatron: "alltoall/flex token dispatcher"
    assert loaded.moe_token_dispatcher_type == "flex" and loaded.delay_wgrad_compute
