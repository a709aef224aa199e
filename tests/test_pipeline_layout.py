"""--pipeline-model-parallel-layout (simsp/scenario/pipeline_layout.py, docs/pipeline-layout.md):
the string parsed as Megatron-LM's PipelineParallelLayerLayout.parse_str_to_list, the split it
gives, its refusals as one error line, and whole numeric iterations under uneven interleaved
layouts (an MTP depth, empty virtual stages) equal to the single-device reference."""

import pytest

from simsp.cli import main
from simsp.cluster.grid import RankGrid
from simsp.scenario.loading import load_scenario
from simsp.scenario.pipeline_layout import parse_layout
from simsp.scenario.pipeline_split import (model_chunks, pipeline_layer_counts,
                                           virtual_stage_layer_counts)
from simsp.training.driver.compare import compare_with_reference
from simsp.training.driver.iteration import simulate_iteration
from simsp.training.pipeline.plan import stage_plans
from test_mtp import BASE, MOE_EP


@pytest.mark.parametrize("text, stages", [
    # Megatron's own example (its docstring and docs/user-guide/features/pipeline_parallel_layout.md)
    ("Et*3|(tt|)*29,m|L", ["Ettt"] + ["tt"] * 29 + ["m", "L"]),
    ("Et|(tt|)*30,mL", ["Et"] + ["tt"] * 30 + ["mL"]),
    ("E(t|)*2,L", ["Et", "t", "L"]),  # (...)*n unrolled before x*n
    ("Et||t|L", ["Et", "", "t", "L"]),  # an empty stage (Megatron: allowed)
    ("E,t,t|t*2,L", ["Ett", "ttL"]),  # commas are cosmetic
])
def test_the_string_unrolls_as_megatron_parses_it(text, stages):
    assert list(parse_layout(text)) == stages


def dsv3_like(**parallel):
    """DeepSeek-V3's split shape (61 layers, one MTP depth, PP 16) in meta mode."""
    values = {("model", "num_layers"): 61, ("model", "mtp_num_layers"): 1,
              ("model", "position_embedding_type"): "rope", ("model", "seq_length"): 8,
              ("model", "hidden_size"): 16, ("model", "num_attention_heads"): 2,
              ("model", "vocab_size"): 64, ("parallel", "pipeline_model_parallel_size"): 16,
              ("parallel", "global_batch_size"): 16, ("run", "mode"): "meta",
              ("cluster", "nodes"): 2}
    values.update({("parallel", k): v for k, v in parallel.items()})
    return load_scenario(None, values)


def test_the_layout_gives_each_virtual_stage_and_rank_its_layers():
    """'Et|(tt|)*30,mL' by hand: virtual stage k = chunk·16 + rank; rank 0 holds stages 0 and
    16 (1 + 2 layers), ranks 1-14 two stages of 2, rank 15 stages 15 and 31 (2 + 0)."""
    sc = dsv3_like(pipeline_model_parallel_layout="Et|(tt|)*30,mL")
    m, p = sc.model, sc.parallel
    assert virtual_stage_layer_counts(m, p) == (1,) + (2,) * 30 + (0,)
    assert pipeline_layer_counts(m, p) == (3,) + (4,) * 14 + (2,)
    assert model_chunks(m, p) == 2 and p.schedule_name == "interleaved"
    plans = stage_plans(sc, RankGrid(1, 16, 1))
    assert plans[0].chunk_ranges == (range(0, 1), range(31, 33))
    assert plans[15].chunk_ranges == (range(29, 31), range(61, 61))


def test_one_virtual_stage_per_rank_runs_1f1b():
    sc = dsv3_like(pipeline_model_parallel_layout="Et*3|(t*4|)*14,t*2,mL")
    assert sc.parallel.schedule_name == "1f1b" and model_chunks(sc.model, sc.parallel) == 1
    assert pipeline_layer_counts(sc.model, sc.parallel) == (3,) + (4,) * 14 + (2,)


@pytest.mark.parametrize("flags, reason", [
    (["--pipeline-model-parallel-layout", "Et|(tt|)*29,mL"], "not divisible by"),
    (["--pipeline-model-parallel-layout", "tE|(tt|)*30,mL"], "first layer must be the embedding"),
    (["--pipeline-model-parallel-layout", "Et|(tt|)*30,Lm"], "last layer must be the loss"),
    (["--pipeline-model-parallel-layout", "Et|(tt|)*30,tmL"], "62 transformer layers"),
    (["--pipeline-model-parallel-layout", "Et|(tt|)*30,L"], "0 MTP layers m"),
    (["--pipeline-model-parallel-layout", "Et|(tt|)*30,Lx"], "invalid layer character 'x'"),
    (["--pipeline-model-parallel-layout", "Et*3|(tt|)*29,m|L"], "not supported by simsp yet"),
    (["--pipeline-model-parallel-layout", "Et*3|(tt|)*28,t|m|tL"], "placed before MTP"),
    (["--pipeline-model-parallel-layout", "Et*61|m|(|)*29,L"],
     "last virtual stage of its pipeline rank"),
    (["--pipeline-model-parallel-layout", "Et|(tt|)*30,mL", "--schedule", "1f1b"],
     "runs interleaved"),
])
def test_bad_layouts_are_one_error_line(flags, reason, capsys):
    rc = main(["run", "--num-layers", "61", "--mtp-num-layers", "1", "--position-embedding-type",
               "rope", "--pipeline-model-parallel-size", "16", "--global-batch-size", "16",
               "--mode", "meta", *flags])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith("error: parallel.pipeline_model_parallel_layout:") or \
        err.startswith("error: parallel.schedule:"), err
    assert reason in err, err


@pytest.mark.parametrize("flag", ["--decoder-first-pipeline-num-layers 4",
                                  "--account-for-loss-in-pipeline-split",
                                  "--num-layers-per-virtual-pipeline-stage 2"])
def test_other_split_flags_conflict_as_in_megatron(flag, capsys):
    rc = main(["run", "--num-layers", "4", "--pipeline-model-parallel-size", "2",
               "--global-batch-size", "4", "--mode", "meta",
               "--pipeline-model-parallel-layout", "Et|t|t|tL", *flag.split()])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "cannot be set with pipeline_model_parallel_layout" \
        in err, err


NUMERIC = {
    # an empty virtual stage on rank 1's chunk 0, the MTP depth with the loss and no layer
    "dense, empty stages": ({}, "Et||tt|mL"),
    # MoE depths, EP 2, TP 2 with SP, DP 2, Megatron's EP-overlapped interleaved 1F1B
    "moe ep overlap, uneven": ({**MOE_EP, ("parallel", "overlap_moe_expert_parallel_comm"): True,
                                ("parallel", "delay_wgrad_compute"): True,
                                ("model", "moe_layer_freq"): "([0]*1+[1]*3)"}, "Ett|t|t|mL"),
}


@pytest.mark.parametrize("name", sorted(NUMERIC))
def test_every_gradient_matches_the_single_device_reference(name):
    extra, layout = NUMERIC[name]
    sc = load_scenario(None, {**BASE, ("model", "mtp_num_layers"): 1,
                              ("parallel", "pipeline_model_parallel_size"): 2, **extra,
                              ("model", "num_layers"): layout.count("t"),
                              ("parallel", "pipeline_model_parallel_layout"): layout})
    assert sc.parallel.schedule_name == "interleaved"
    errors = compare_with_reference(simulate_iteration(sc))
    assert max(errors.values()) <= 1e-10, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    assert "mtp.0.eh_proj.weight" in errors and "layers.0.ln1.gamma" in errors
