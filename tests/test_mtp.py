"""Multi-token prediction (simsp/training/mtp.py, docs/mtp.md): every gradient against the
single-device reference (simsp/model/reference/) and central finite differences, the last
stage's weights against the count of the depths' tensors, Megatron's FLOPs against a hand
count, bad input as one error line."""

import numpy as np
import pytest

from simsp.cli import main
from simsp.commands.verify import verify_report
from simsp.scenario.loading import load_scenario
from simsp.metrics.collect import collect
from simsp.model.flops import megatron_flops
from simsp.model.params import init_params, layer_shapes, mtp_shapes
from simsp.training.driver.compare import compare_with_reference, gathered_grads
from simsp.training.driver.gradcheck import _direction, _finite_difference
from simsp.training.driver.iteration import Shortcuts, simulate_iteration

BASE = {("model", "num_layers"): 2, ("model", "hidden_size"): 16,
        ("model", "num_attention_heads"): 2, ("model", "seq_length"): 8,
        ("model", "vocab_size"): 64, ("model", "ffn_hidden_size"): 24,
        ("model", "position_embedding_type"): "rope", ("model", "normalization"): "RMSNorm",
        ("model", "swiglu"): True, ("model", "add_bias_linear"): False,
        ("model", "untie_embeddings_and_output_weights"): True,
        ("model", "mtp_num_layers"): 2, ("model", "mtp_loss_scaling_factor"): 1.0,
        ("parallel", "micro_batch_size"): 1, ("parallel", "global_batch_size"): 2,
        ("run", "mode"): "numeric", ("run", "numeric_dtype"): "float64"}
TP_PP = {("parallel", "tensor_model_parallel_size"): 2,
         ("parallel", "pipeline_model_parallel_size"): 2}
MOE_EP = {**TP_PP, ("parallel", "sequence_parallel"): True,
          ("parallel", "data_parallel_size"): 2, ("parallel", "global_batch_size"): 4,
          ("model", "num_experts"): 4, ("model", "moe_router_topk"): 2,
          ("model", "moe_layer_freq"): "([0]*1+[1]*1)", ("model", "moe_aux_loss_coeff"): 0.01,
          ("parallel", "expert_model_parallel_size"): 2,
          ("parallel", "moe_token_dispatcher_type"): "alltoall"}
LAYOUTS = {
    # the depths' layers are MoE (built as the last layer), EP 2 over ETP 2, SP, PP 2, DP 2
    "t2 sp pp2 dp2 ep2, MoE depths": MOE_EP,
    # the output layer tied to the embedding; the projection gathered without SP
    "t2 pp2 tied, full recompute": {**TP_PP, ("model", "untie_embeddings_and_output_weights"):
                                    False, ("parallel", "recompute_granularity"): "full"},
    "t1 selective recompute, one depth": {("model", "mtp_num_layers"): 1,
                                          ("parallel", "recompute_granularity"): "selective"},
}


def scenario(extra: dict):
    return load_scenario(None, {**BASE, **extra})


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_gradient_matches_the_single_device_reference(name):
    errors = compare_with_reference(simulate_iteration(scenario(LAYOUTS[name])))
    assert max(errors.values()) < 1e-13
    assert any(n.startswith("mtp.0.layer.") for n in errors) and "mtp.0.eh_proj.weight" in errors


def test_finite_differences_agree():
    """`simsp verify` on t = 1 (every tensor), and central differences (step 1e-4, truncation
    ~1e-8) of the depths' own tensors and the shared tables on the MoE/EP layout."""
    report = verify_report(scenario({}))
    assert report["passed"], report["max_rel_err"]
    sc = scenario(MOE_EP)
    params = init_params(sc.padded_model, sc.run.seed, np.float64)
    grads = gathered_grads(simulate_iteration(sc, canonical=params))
    rng = np.random.default_rng(3)
    for name in ("mtp.0.eh_proj.weight", "mtp.1.enorm.gamma", "mtp.0.hnorm.gamma",
                 "mtp.1.layer.mlp.router.weight", "embedding.word", "output.weight"):
        u = _direction(rng, grads[name].shape)
        exact = float(np.sum(grads[name] * u))
        assert _finite_difference(sc, params, name, u, 1e-4) == pytest.approx(exact, rel=1e-6)


def test_the_last_stage_holds_the_depths_and_a_copy_of_the_embedding():
    meta = {**TP_PP, ("run", "mode"): "meta", ("model", "hidden_size"): 64,
            ("model", "num_attention_heads"): 4, ("model", "seq_length"): 64,
            ("model", "vocab_size"): 512, ("model", "ffn_hidden_size"): 128}
    weights = {}
    for depths in (None, 2):
        without = {} if depths else {("model", "mtp_loss_scaling_factor"): 0.1}  # the default
        sc = scenario({**meta, ("model", "mtp_num_layers"): depths, **without})
        metrics = collect(simulate_iteration(sc, Shortcuts()), Shortcuts())
        weights[depths] = {r["pp"]: r["weights_bytes"] for r in metrics["ranks"] if r["tp"] == 0}
    h, t = 64, 2
    own = sum(np.prod(shape) for shape in mtp_shapes(sc.padded_model).values())
    replicated = 2 * 5 * h  # per depth enorm, hnorm, final_ln, ln1, ln2; the rest split
    per_rank = (own - replicated) // t + replicated + sc.padded_model.vocab_size * h // t
    assert weights[2][0] == weights[None][0]
    assert weights[2][1] - weights[None][1] == 2 * per_rank  # bf16


def test_megatron_flops_count_the_depths():
    """training.py: D more layers of the last layer's kind, 6·D·(3h + 2h²), D more logits."""
    sc = scenario({("run", "mode"): "meta"})
    m, B, v = sc.model, 8, sc.padded_model.vocab_size
    h, s, D = m.hidden_size, m.seq_length, m.mtp_num_layers
    layer = sum(np.prod(shape) for name, shape in layer_shapes(m).items()
                if "norm" not in name and "ln" not in name)  # the GEMM weights
    core = 6 * m.num_attention_heads * m.head_dim  # causal QKᵀ and ·V
    extra = 6 * B * s * D * (layer + 3 * h + 2 * h * h + h * v) + B * s * s * core * D
    no_mtp = load_scenario(None, {**BASE, ("run", "mode"): "meta",
                                  ("model", "mtp_num_layers"): None,
                                  ("model", "mtp_loss_scaling_factor"): 0.1}).model
    assert megatron_flops(m, B, v) - megatron_flops(no_mtp, B, v) == pytest.approx(extra,
                                                                                  rel=1e-12)


@pytest.mark.parametrize("extra, field", [
    (["--position-embedding-type", "learned_absolute"], "model.mtp_num_layers"),
    (["--position-embedding-type", "rope", "--mtp-loss-scaling-factor", "-1"],
     "model.mtp_loss_scaling_factor"),
    (["--position-embedding-type", "rope", "--context-parallel-size", "2",
      "--data-parallel-size", "1"], "parallel.context_parallel_size"),
])
def test_bad_mtp_input_is_one_error_line(extra, field, capsys):
    rc = main(["run", "--mtp-num-layers", "1", "--mode", "meta", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"error: {field}:") and err.count("\n") == 1
