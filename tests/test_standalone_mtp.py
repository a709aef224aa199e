"""Megatron's standalone MTP (`m|L` in --pipeline-model-parallel-layout; simsp/training/
mtp_stage.py, docs/pipeline-layout.md): where each module is built, by hand from Megatron's
gpt_model.py / transformer_block.py; whole numeric iterations equal to the single-device
reference; the embedding group's copies equal after the iteration; meta mode's shortcuts
against the full simulation; the refusals as one error line."""

import numpy as np
import pytest

from simsp.cli import main
from simsp.cluster.grid import RankGrid
from simsp.errors import UserError
from simsp.metrics.collect import collect
from simsp.model.params import param_shapes
from simsp.scenario.loading import load_scenario, with_overrides
from simsp.shortcuts.bucket_counts import stage_buckets
from simsp.training.driver.compare import compare_with_reference
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
from simsp.training.pipeline.plan import stage_param_names, stage_plans
from test_mtp import BASE, MOE_EP
from test_pipeline_layout import LAYOUT, dsv3_like

MEGATRON_DSV3 = "Et*3|(tt|)*29,m|L"  # Megatron's own DeepSeek-V3 example (PP 16, VPP 2)


def test_each_module_sits_where_megatron_builds_it():
    """Megatron's example: the depth (and its copy of the word table) on rank 14's chunk 1
    (virtual stage 30), the final norm with layer 60 on rank 13's chunk 1 (stage 29), the
    untied output layer alone on rank 15's chunk 1, the embedding on rank 0."""
    sc = with_overrides(dsv3_like(pipeline_model_parallel_layout=MEGATRON_DSV3),
                        model={"untie_embeddings_and_output_weights": True})
    plans = stage_plans(sc, RankGrid(1, 16, 1))
    assert (plans[14].mtp_stage, plans[14].norm_stage) == (30, 29)
    assert plans[14].chunk_ranges == (range(29, 31), range(61, 61))
    assert plans[13].chunk_ranges == (range(27, 29), range(59, 61))
    shapes = param_shapes(sc.padded_model)
    held = {pp: set(stage_param_names(shapes, plans[pp])) for pp in (0, 13, 14, 15)}
    depth = {n for n in shapes if n.startswith("mtp.")}
    assert depth and depth | {"embedding.word"} <= held[14]
    assert held[14] - depth == {n for n in shapes if n.startswith(("layers.29.", "layers.30."))} \
        | {"embedding.word"}
    assert held[15] - {n for n in shapes if n.startswith(("layers.31.", "layers.32."))} \
        == {"output.weight"}
    assert {"final_ln.gamma"} <= held[13]
    assert not any(n.startswith("final_ln") for n in held[14] | held[15])
    assert "embedding.word" in held[0] and not depth & (held[0] | held[13] | held[15])


NUMERIC = {  # BASE: two MTP depths, untied, RMSNorm, RoPE, float64
    # an empty stage between the depths and the loss passes their concatenation on
    "pp4 1f1b": ({("parallel", "pipeline_model_parallel_size"): 4}, "Ett|mm||L"),
    # an empty stage on rank 2's chunk 0; the depths on rank 1's chunk 1, TP 2 with SP
    "pp3 x2 interleaved, tp2 sp": ({("parallel", "pipeline_model_parallel_size"): 3,
                                    ("parallel", "tensor_model_parallel_size"): 2,
                                    ("parallel", "sequence_parallel"): True,
                                    ("parallel", "global_batch_size"): 3}, "Et|t||t|mm|L"),
    # tied: the loss stage's copy joins the embedding group; the final norm and the depths on
    # one chunk; TP 2 without SP (p2p scatter/gather of the longer tensors)
    "pp3 tied, tp2, dp2": ({("parallel", "pipeline_model_parallel_size"): 3,
                            ("parallel", "tensor_model_parallel_size"): 2,
                            ("parallel", "data_parallel_size"): 2,
                            ("parallel", "global_batch_size"): 4, ("cluster", "nodes"): 2,
                            ("model", "untie_embeddings_and_output_weights"): False},
                           "Et|tmm|L"),
    # a MoE depth, EP 2 over TP 2 with SP, DP 2, Megatron's EP-overlapped interleaved 1F1B
    # with delayed weight gradients
    "pp3 x2 moe ep overlap": ({**MOE_EP, ("parallel", "overlap_moe_expert_parallel_comm"): True,
                               ("parallel", "delay_wgrad_compute"): True,
                               ("model", "moe_layer_freq"): "([0]*1+[1]*3)",
                               ("model", "mtp_num_layers"): 1,
                               ("parallel", "pipeline_model_parallel_size"): 3,
                               ("parallel", "global_batch_size"): 6, ("cluster", "nodes"): 2},
                              "Et|t|t|t|m|L"),
}


@pytest.mark.parametrize("name", sorted(NUMERIC))
def test_every_gradient_matches_the_single_device_reference(name):
    extra, layout = NUMERIC[name]
    sc = load_scenario(None, {**BASE, **extra, ("model", "num_layers"): layout.count("t"),
                              ("parallel", "pipeline_model_parallel_layout"): layout})
    chunks = (layout.count("|") + 1) // sc.parallel.pp
    assert sc.parallel.schedule_name == ("interleaved" if chunks > 1 else "1f1b")
    run = simulate_iteration(sc)
    errors = compare_with_reference(run)
    assert max(errors.values()) < 1e-13, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    assert {"loss", "mtp.0.eh_proj.weight", "final_ln.gamma", "embedding.word"} <= set(errors)
    copies = [state.grads["embedding.word"].data for rank, state in run.states.items()
              if "embedding.word" in state.grads and run.inputs.plans[rank].tp == 0]
    tied = not sc.model.untie_embeddings_and_output_weights
    assert len(copies) == sc.parallel.dp * (3 if tied else 2)  # first, MTP (, loss) stages
    assert all(np.array_equal(copy, copies[0]) for copy in copies)  # one all-reduced sum


def test_meta_shortcuts_keep_the_full_simulation():
    """MoE with EP 2 over DP 2, PP 4 x 2, the depth on rank 2's chunk 1, the distributed
    optimizer: the shortcuts (docs/shortcuts.md) against the full simulation (Shortcuts(), the
    oracle); the buckets the work estimate counts against those the ranks build."""
    values = {("model", "num_layers"): 6, ("model", "hidden_size"): 256,
              ("model", "num_attention_heads"): 4, ("model", "seq_length"): 256,
              ("model", "vocab_size"): 512, ("model", "position_embedding_type"): "rope",
              ("model", "mtp_num_layers"): 1, ("model", "add_bias_linear"): False,
              ("model", "num_experts"): 8, ("model", "moe_router_topk"): 2,
              ("model", "moe_layer_freq"): "([0]*1+[1]*5)",
              ("parallel", "expert_model_parallel_size"): 2,
              ("parallel", "moe_token_dispatcher_type"): "alltoall",
              ("parallel", "pipeline_model_parallel_size"): 4,
              ("parallel", "data_parallel_size"): 2, ("parallel", "global_batch_size"): 16,
              ("parallel", "distributed_optimizer"): True,
              ("parallel", "pipeline_model_parallel_layout"): "Et|t|t|t|t|t|m|L",
              ("cluster", "nodes"): 1, ("run", "mode"): "meta"}
    sc = load_scenario(None, values)
    runs = [simulate_iteration(sc, s) for s in (Shortcuts.for_scale(sc), Shortcuts())]
    fast, full = (collect(run, s) for run, s in zip(runs, (Shortcuts.for_scale(sc), Shortcuts())))
    assert fast["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-12)
    assert [r["peak_bytes"] for r in fast["ranks"]] == [r["peak_bytes"] for r in full["ranks"]]
    # one bucket per chunk past stage 0's first, one more on the MTP stage for its table copy
    plans = runs[1].inputs.plans
    built = {plans[rank].pp: len(state.ddp_buckets.buckets)
             for rank, state in runs[1].states.items()}
    assert built == {stage: stage_buckets(sc, stage) for stage in range(4)}
    assert (built[1], built[2], built[3]) == (2, 3, 2)


@pytest.mark.parametrize("layout, pp, depths, reason", [
    ("Et|t|m|L", 2, 1, "not be on the first pipeline rank"),  # rank 0's chunk 1
    ("Et|tm|m|L", 4, 2, "all MTP layers must be in one virtual stage"),
])
def test_megatron_refusals(layout, pp, depths, reason):
    with pytest.raises(UserError) as refused:
        load_scenario(None, {**BASE, ("model", "mtp_num_layers"): depths,
                             ("model", "num_layers"): layout.count("t"),
                             ("parallel", "pipeline_model_parallel_size"): pp,
                             ("parallel", "global_batch_size"): pp,
                             ("parallel", "pipeline_model_parallel_layout"): layout})
    assert refused.value.field == LAYOUT and reason in refused.value.reason


def test_a_refusal_is_one_error_line(capsys):
    rc = main(["run", "--num-layers", "2", "--pipeline-model-parallel-size", "2",
               "--mtp-num-layers", "1", "--position-embedding-type", "rope",
               "--global-batch-size", "2", "--mode", "meta",
               "--pipeline-model-parallel-layout", "Et|t|m|L"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith(f"error: {LAYOUT}: MTP must not")
