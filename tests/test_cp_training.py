"""Context parallelism in the training loop (docs/context-parallel.md): every gradient of CP
layouts combined with TP, SP, PP and DP against the single-device reference (float64, to
rounding), `simsp verify` on scenarios/llama-tiny-cp.toml, and the ring's transfers and buffers
as the training loop runs it."""

from pathlib import Path

import pytest

from simsp.commands.verify import REFERENCE_TOLERANCE, verify_report
from simsp.config import load_scenario
from simsp.training.compare import compare_with_reference
from simsp.training.iteration import simulate_iteration

CP_TINY = Path(__file__).resolve().parents[1] / "scenarios" / "llama-tiny-cp.toml"
LAYOUTS = {  # overrides of llama-tiny-cp.toml: cp 2, t 2 SP, p 2 (1 + 2), d 2, hidden dropout
    "cp2_tp_sp_pp_dp": {},
    "cp4_tp_sp_pp": {("parallel", "context_parallel_size"): 4,
                     ("parallel", "data_parallel_size"): 1, ("parallel", "global_batch_size"): 2},
    "cp2_learned_positions_tied_t1": {
        ("model", "position_embedding_type"): "learned_absolute",
        ("model", "untie_embeddings_and_output_weights"): False,
        ("parallel", "tensor_model_parallel_size"): 1, ("parallel", "sequence_parallel"): False},
    "cp2_full_recompute_groups_overlap": {
        ("model", "num_layers"): 4, ("parallel", "decoder_first_pipeline_num_layers"): 2,
        ("parallel", "recompute_granularity"): "full", ("parallel", "recompute_num_layers"): 2,
        ("parallel", "overlap_grad_reduce"): True},
    "cp2_selective_core_attn": {("parallel", "recompute_granularity"): "selective"},
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_gradient_equals_the_single_device_reference(name):
    sc = load_scenario(CP_TINY, LAYOUTS[name])
    errors = compare_with_reference(simulate_iteration(sc))
    assert max(errors.values()) < REFERENCE_TOLERANCE, sorted(errors.items(),
                                                              key=lambda kv: -kv[1])[:3]
    assert "embedding_output" in errors and "loss" in errors
