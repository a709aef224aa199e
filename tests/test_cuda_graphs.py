"""CUDA graphs and launch cost (docs/launch.md): a kernel inside a captured region pays the
in-graph per-kernel cost instead of its stream launch, each replay one graph launch; the
combinations Megatron-LM refuses are refused in one error line."""

import pytest

from simsp.hardware.launch import launch_costs
from simsp.hardware.profiles import gpu_profile
from simsp.scenario.loading import load_scenario
from simsp.training.driver.layer_sim import simulate_layer
from tests.inprocess import cli

# A GPT layer (LayerNorm, GeLU, biases, dropout), t = 1, on an H100. Its kernels counted by hand
# from Megatron's TransformerLayer (the fused kernels of simsp's defaults):
# attention forward: ln1, QKV GEMM, split QKV, scores GEMM, softmax, attention dropout,
#   context GEMM, merge heads, projection GEMM, bias-dropout-add                       = 10
# MLP forward: ln2, fc1 GEMM, bias-GeLU, fc2 GEMM, bias-dropout-add                    = 5
# MLP backward: dropout-add, fc2 bias grad, fc2 dgrad, fc2 wgrad, GeLU grad, fc1 dgrad,
#   fc1 wgrad, ln2 backward, residual add                                               = 9
# attention backward: dropout-add, proj bias grad, proj dgrad, proj wgrad, split heads,
#   context-grad copy, attention-dropout dgrad GEMM, dV GEMM, dropout grad, softmax grad,
#   dQ GEMM, dK GEMM, merge QKV grads, QKV dgrad, QKV wgrad, ln1 backward, residual add  = 17
KERNELS = {"attn": {"forward": 10, "backward": 17}, "mlp": {"forward": 5, "backward": 9}}
STREAM_S, NODE_S, GRAPH_S = 2e-6, 1.6e-6, 2e-6  # the H100 profile's figures (docs/launch.md)
MODEL = {"num_layers": 1, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
         "vocab_size": 128}


def _phase_seconds(**parallel) -> dict:
    """{phase: seconds of rank 0's kernels} for the layer under the given parallel fields."""
    overrides = {("model", k): v for k, v in MODEL.items()}
    overrides.update({("run", "mode"): "meta", ("cluster", "gpu"): "h100-sxm-80gb"})
    overrides.update({("parallel", k): v for k, v in parallel.items()})
    log = simulate_layer(load_scenario(None, overrides), log_kernels=True).ranks[0].kernel_log
    out = {"forward": 0.0, "backward": 0.0}
    for _, phase, _, _, _, seconds in log:
        out[phase] += seconds
    out["count"] = len(log)
    return out


def test_h100_profile_states_the_sourced_launch_costs():
    costs = launch_costs(gpu_profile("h100-sxm-80gb").launch, STREAM_S)
    assert (costs.kernel_s, costs.graph_node_s, costs.graph_launch_s) == (STREAM_S, NODE_S,
                                                                          GRAPH_S)
    # unstated (the A100): the blog's 0.4 us saving per kernel, a graph launch as a stream launch
    derived = launch_costs({}, 2e-6)
    assert derived.graph_node_s == pytest.approx(1.6e-6, abs=1e-18)
    assert derived.graph_launch_s == 2e-6


@pytest.mark.parametrize("parallel, captured, replays", [
    ({"cuda_graph_impl": "local"}, ("attn", "mlp"), 1),  # whole layer: one graph per pass
    ({"enable_cuda_graph": True}, ("attn", "mlp"), 1),  # the deprecated spelling of local
    ({"external_cuda_graph": True}, ("attn", "mlp"), 1),  # deprecated: transformer_engine
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": "full"}, ("attn", "mlp"), 1),
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": "attn"}, ("attn",), 1),
    ({"cuda_graph_impl": "local", "cuda_graph_scope": "mlp"}, ("mlp",), 1),
    ({"cuda_graph_impl": "local", "cuda_graph_scope": "attn mlp"}, ("attn", "mlp"), 2),
    ({"cuda_graph_impl": "full_iteration"}, ("attn", "mlp"), 0),  # its launch: not charged
])
def test_captured_kernels_pay_the_in_graph_cost_and_each_replay_one_launch(parallel, captured,
                                                                           replays):
    stream = _phase_seconds()
    graphed = _phase_seconds(**parallel)
    assert graphed["count"] == stream["count"] == 41  # 15 forward + 26 backward, as counted
    for phase in ("forward", "backward"):
        kernels = sum(KERNELS[region][phase] for region in captured)
        expected = stream[phase] - kernels * (STREAM_S - NODE_S) + replays * GRAPH_S
        assert graphed[phase] == pytest.approx(expected, abs=1e-12)


def test_mamba_module_captures_nothing_in_a_model_without_mamba_layers():
    stream = _phase_seconds()
    graphed = _phase_seconds(cuda_graph_impl="local", cuda_graph_scope="mamba")
    assert graphed["forward"] == pytest.approx(stream["forward"], abs=1e-12)


@pytest.mark.parametrize("argv, field, reason", [
    (["--cuda-graph-impl", "local", "--cuda-graph-scope", "atn"], "parallel.cuda_graph_modules",
     "'atn' is not one of"),
    (["--cuda-graph-impl", "bogus"], "--cuda-graph-impl", "invalid choice: 'bogus'"),
    (["--enable-cuda-graph", "--cuda-graph-impl", "transformer_engine"],
     "parallel.enable_cuda_graph", "do not use --enable-cuda-graph with --cuda-graph-impl"),
    (["--enable-cuda-graph", "--external-cuda-graph"], "parallel.external_cuda_graph",
     "cannot be enabled at the same time"),
    (["--cuda-graph-impl", "full_iteration", "--cuda-graph-scope", "attn"],
     "parallel.cuda_graph_modules", "must be empty when cuda_graph_impl is full_iteration"),
    (["--cuda-graph-impl", "local", "--cuda-graph-scope", "full", "attn"],
     "parallel.cuda_graph_modules", "full scope cannot be used with other scopes"),
    (["--cuda-graph-impl", "local", "--cuda-graph-scope", "moe"],
     "parallel.cuda_graph_modules", "moe cuda graph is only supported for MoE"),
    (["--cuda-graph-impl", "local", "--cuda-graph-scope", "attn", "--cuda-graph-modules",
      "mlp"], "parallel.cuda_graph_modules", "cannot be used together"),
    (["--cuda-graph-impl", "local", "--recompute-granularity", "full"],
     "parallel.recompute_granularity", "full recompute is only supported with"),
])
def test_refused_combinations_name_the_field_in_one_line(argv, field, reason):
    rc, _, err = cli(["layer", "--system", "dgx-h100", *argv])
    assert rc == 2
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("error: ") and field in err
    assert reason in err
