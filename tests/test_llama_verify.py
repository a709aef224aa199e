"""`simsp verify` on tiny numeric scenarios of each Llama-class variant and on the combined
scenarios/llama-tiny.toml: every parameter's gradient against finite differences and the
single-device reference, at the GPT layer's tolerances (1e-5 and 1e-10, float64); interleaved
uneven splits against the reference alone."""

from pathlib import Path

import pytest

from simsp.commands.verify import verify_report
from simsp.scenario.loading import load_scenario
from simsp.training.driver.compare import compare_with_reference
from simsp.training.driver.iteration import simulate_iteration

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
BASE = {("model", "num_layers"): 1,  # the default GPT otherwise: h 64, a 4, s 32, v 128
        ("parallel", "tensor_model_parallel_size"): 2, ("parallel", "sequence_parallel"): True}
SERIAL = {("parallel", "tensor_model_parallel_size"): 1, ("parallel", "sequence_parallel"): False}
VARIANTS = {
    "gqa": {("model", "group_query_attention"): True, ("model", "num_query_groups"): 2},
    "mqa_t1": {("model", "group_query_attention"): True, ("model", "num_query_groups"): 1,
               ("parallel", "tensor_model_parallel_size"): 1,
               ("parallel", "sequence_parallel"): False},
    "kv_channels": {("model", "kv_channels"): 12},
    "swiglu": {("model", "swiglu"): True, ("model", "ffn_hidden_size"): 96},
    "rmsnorm": {("model", "normalization"): "RMSNorm", ("model", "norm_epsilon"): 1e-6},
    "rope": {("model", "position_embedding_type"): "rope", ("model", "rotary_percent"): 0.5},
    "no_position": {("model", "position_embedding_type"): "none"},
    "untied_p2": {("model", "untie_embeddings_and_output_weights"): True,
                  ("model", "num_layers"): 2, ("parallel", "pipeline_model_parallel_size"): 2},
    "no_bias": {("model", "add_bias_linear"): False},
    "flash_dropout": {("model", "attention_backend"): "flash"},
    "uneven_last": {("model", "num_layers"): 3, ("parallel", "pipeline_model_parallel_size"): 2,
                    ("parallel", "decoder_last_pipeline_num_layers"): 1, **SERIAL},
    "recompute_modules": {("parallel", "recompute_granularity"): "selective",
                          ("parallel", "recompute_modules"): "core_attn mlp layernorm"},
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_verifies(name):
    report = verify_report(load_scenario(None, {**BASE, **VARIANTS[name]}))
    assert report["passed"], (name, report["max_rel_err"], report["max_rel_err_vs_reference"])


# Interleaved uneven splits: only where the layers run changes, not the model, whose reference
# gradients the finite differences above check (uneven_last among them), so each split is held
# to the single-device reference alone, at verify's tolerance (1e-10): 20 s of finite
# differences each saved (the layout's own splits: tests/test_pipeline_layout.py).
SPLITS = {
    "interleaved_accounted": {("model", "num_layers"): 6,
                              ("parallel", "pipeline_model_parallel_size"): 2,
                              ("parallel", "schedule"): "interleaved",
                              ("parallel", "num_layers_per_virtual_pipeline_stage"): 2,
                              ("parallel", "account_for_embedding_in_pipeline_split"): True,
                              ("parallel", "account_for_loss_in_pipeline_split"): True,
                              ("parallel", "global_batch_size"): 2, ("model", "hidden_size"): 32,
                              ("model", "seq_length"): 16, **SERIAL},
    "interleaved_first_last": {("model", "num_layers"): 6,
                               ("parallel", "pipeline_model_parallel_size"): 2,
                               ("parallel", "decoder_first_pipeline_num_layers"): 2,
                               ("parallel", "decoder_last_pipeline_num_layers"): 4,
                               ("parallel", "num_virtual_stages_per_pipeline_rank"): 2,
                               ("parallel", "global_batch_size"): 2, ("model", "hidden_size"): 32,
                               ("model", "seq_length"): 16, **SERIAL},
}


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_interleaved_split_equals_the_single_device_reference(name):
    sc = load_scenario(None, {**BASE, **SPLITS[name]})
    assert sc.parallel.schedule_name == "interleaved" and sc.parallel.uneven_pipeline
    errors = compare_with_reference(simulate_iteration(sc))
    assert max(errors.values()) <= 1e-10, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    assert len(errors) > 6 * 4  # every layer's tensors, the embedding and the head


def test_combined_llama_tiny_verifies():
    """GQA with t = 2 and SP, p = 2 split 1 + 2, d = 2, RoPE, SwiGLU, RMSNorm, untied, flash."""
    sc = load_scenario(SCENARIOS / "llama-tiny.toml")
    assert sc.parallel.dp == 2 and sc.model.flash and not sc.model.tied
    report = verify_report(sc)
    assert report["passed"]
    assert report["max_rel_err_vs_reference"] < 1e-13
    assert "output.weight" in report["checked"] and "embedding.position" not in report["checked"]
