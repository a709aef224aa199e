"""--pipeline-model-parallel-layout (simsp/scenario/pipeline_layout.py, docs/pipeline-layout.md):
the string parsed as Megatron-LM's PipelineParallelLayerLayout.parse_str_to_list, the split it
gives, its refusals as one error line, and whole numeric iterations under uneven interleaved
layouts (an MTP depth, empty virtual stages) equal to the single-device reference."""

import pytest

from simsp.cli import main
from simsp.errors import UserError
from simsp.cluster.grid import RankGrid
from simsp.scenario.loading import load_scenario
from simsp.scenario.pipeline_layout import parse_layout
from simsp.scenario.pipeline_split import (model_chunks, pipeline_layer_counts,
                                           virtual_stage_layer_counts)
from simsp.training.driver.compare import compare_with_reference
from simsp.metrics.collect import collect
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
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


def test_the_report_names_the_layout():
    from simsp.metrics.layout import layout
    from simsp.report.run.summary_md import _header
    lay = layout(dsv3_like(pipeline_model_parallel_layout="Et|(tt|)*30,mL"))
    assert lay["stage_layers"] == [3] + [4] * 14 + [2]
    assert lay["pipeline_layout"] == "Et|(tt|)*30,mL"
    line = _header({"scenario": "x", "mode": "meta", "layout": lay})[2]
    assert "schedule interleaved (layers per stage 3 + 4 x 14 + 2, layout `Et|(tt|)*30,mL`)" \
        in line


def test_one_virtual_stage_per_rank_runs_1f1b():
    sc = dsv3_like(pipeline_model_parallel_layout="Et*3|(t*4|)*14,t*2,mL")
    assert sc.parallel.schedule_name == "1f1b" and model_chunks(sc.model, sc.parallel) == 1
    assert pipeline_layer_counts(sc.model, sc.parallel) == (3,) + (4,) * 14 + (2,)


LAYOUT = "parallel.pipeline_model_parallel_layout"


@pytest.mark.parametrize("layout, field, reason", [
    ("Et|(tt|)*29,mL", LAYOUT, "31 virtual stages are not divisible by"),
    ("tE|(tt|)*30,mL", LAYOUT, "first layer must be the embedding"),
    ("Et|(tt|)*30,Lm", LAYOUT, "last layer must be the loss"),
    ("Et|(tt|)*30,tmL", LAYOUT, "62 transformer layers"),
    ("Et|(tt|)*30,L", LAYOUT, "0 MTP layers m"),
    ("Et|(tt|)*30,Lx", LAYOUT, "invalid layer character 'x'"),
    ("Et*3|(tt|)*29,mL|", LAYOUT, "simsp needs the loss L in the last virtual stage"),
    ("Et*3|(tt|)*28,t|m|tL", LAYOUT, "placed before MTP"),
    ("Et*61|m|(|)*29,L", LAYOUT, "last virtual stage of its pipeline rank"),
    ("|Ett|(tt|)*29,tmL", LAYOUT, "embedding E in the first virtual stage"),
    ("Et*99999999999|L", LAYOUT, "unrolls to more than 1048576 symbols"),  # simsp's guard
])
def test_bad_layouts_are_refused_by_name(layout, field, reason):
    with pytest.raises(UserError) as refused:
        dsv3_like(pipeline_model_parallel_layout=layout)
    assert refused.value.field == field and reason in refused.value.reason


@pytest.mark.parametrize("parallel, field", [
    ({"decoder_first_pipeline_num_layers": 4}, "parallel.decoder_first_pipeline_num_layers"),
    ({"account_for_loss_in_pipeline_split": True},
     "parallel.account_for_loss_in_pipeline_split"),
    ({"num_layers_per_virtual_pipeline_stage": 2},
     "parallel.num_layers_per_virtual_pipeline_stage"),
    ({"schedule": "1f1b"}, "parallel.schedule"),
])
def test_other_split_flags_conflict_as_in_megatron(parallel, field):
    with pytest.raises(UserError) as refused:
        dsv3_like(pipeline_model_parallel_layout="Et|(tt|)*30,mL", **parallel)
    assert refused.value.field == field


def test_chunks_without_a_pipeline_are_refused():
    with pytest.raises(UserError) as refused:
        dsv3_like(pipeline_model_parallel_layout="Et*30|t*31,mL", pipeline_model_parallel_size=1)
    assert refused.value.field == LAYOUT and "pipeline_model_parallel_size=1" in refused.value.reason
    sc = dsv3_like(pipeline_model_parallel_layout="Et*61,mL", pipeline_model_parallel_size=1)
    assert sc.parallel.schedule_name == "1f1b" and pipeline_layer_counts(sc.model, sc.parallel) \
        == (61,)


def test_a_bad_layout_is_one_error_line(capsys):
    rc = main(["run", "--num-layers", "4", "--pipeline-model-parallel-size", "2",
               "--mode", "meta", "--pipeline-model-parallel-layout", "Et|t|t|ttL"])
    err = capsys.readouterr().err
    assert rc == 2 and err == f"error: {LAYOUT}: 5 transformer layers t, but num_layers=4\n"


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


def test_meta_shortcuts_keep_the_full_simulation_under_a_layout():
    """MoE, EP 2 over DP 2, PP 4 × 2 chunks with an empty chunk and EP overlap, meta mode: the
    shortcuts (docs/shortcuts.md) against the full simulation (Shortcuts(), the oracle)."""
    values = {("model", "num_layers"): 7, ("model", "hidden_size"): 256,
              ("model", "num_attention_heads"): 4, ("model", "seq_length"): 256,
              ("model", "vocab_size"): 512, ("model", "position_embedding_type"): "rope",
              ("model", "mtp_num_layers"): 1, ("model", "add_bias_linear"): False,
              ("model", "num_experts"): 8, ("model", "moe_router_topk"): 2,
              ("model", "moe_layer_freq"): "([0]*1+[1]*6)",
              ("parallel", "expert_model_parallel_size"): 2,
              ("parallel", "moe_token_dispatcher_type"): "alltoall",
              ("parallel", "overlap_moe_expert_parallel_comm"): True,
              ("parallel", "delay_wgrad_compute"): True,
              ("parallel", "pipeline_model_parallel_size"): 4,
              ("parallel", "data_parallel_size"): 2, ("parallel", "global_batch_size"): 16,
              ("parallel", "pipeline_model_parallel_layout"): "Et|t|t|t||tt|t|mL",
              ("cluster", "nodes"): 1, ("run", "mode"): "meta"}
    sc = load_scenario(None, values)
    fast, full = (collect(simulate_iteration(sc, s), s) for s in (Shortcuts.for_scale(sc),
                                                                  Shortcuts()))
    assert fast["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-12)
    assert fast["bubble_fraction"] == pytest.approx(full["bubble_fraction"], rel=1e-12)
    assert [r["peak_bytes"] for r in fast["ranks"]] == [r["peak_bytes"] for r in full["ranks"]]


def test_search_labels_a_held_layout_by_its_chunks():
    """`simsp search --pipeline-model-parallel-layout ...`: p 2 runs the 4-stage layout
    interleaved, p 4 as 1F1B, and the row names say so."""
    from simsp.explore.search.layouts import layout_label
    parallel = {"tensor_model_parallel_size": 1, "data_parallel_size": 2, "micro_batch_size": 1,
                "num_layers_per_virtual_pipeline_stage": None, "schedule": None,
                "sequence_parallel": False, "recompute_granularity": "none",
                "distributed_optimizer": False, "pipeline_model_parallel_layout": "Et|t|t|tL"}
    assert layout_label({**parallel, "pipeline_model_parallel_size": 2}, 4) == \
        "t1 p2 d2 b1, interleaved 2 chunks, no SP, no recompute"
    assert layout_label({**parallel, "pipeline_model_parallel_size": 4}, 4) == \
        "t1 p4 d2 b1, 1F1B, no SP, no recompute"
