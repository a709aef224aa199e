"""--squared-relu (Megatron-LM's flag; relu(x)², core/activations.py squared_relu): its kernel
against central finite differences and the closed form, a parallel layout against the
independent single-device reference (which computes max(x, 0)² its own way), its FLOPs and
memory equal to GeLU's (same shapes, same two GEMMs), and the refused combinations."""

import numpy as np
import pytest

from simsp.cli import main
from simsp.training.driver.compare import compare_with_reference
from simsp.model.architecture import architecture
from simsp.model.blocks.mlp.activation import squared_relu_backward, squared_relu_forward
from simsp.model.flops import megatron_flops
from simsp.scenario.loading import load_scenario
from simsp.training.driver.iteration import Shortcuts, simulate_iteration

ON = {("model", "squared_relu"): True}


def test_kernel_is_the_square_of_relu_and_its_backward_matches_finite_differences():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(5, 7))  # (s, f)
    dy = rng.normal(size=(5, 7))
    assert np.array_equal(squared_relu_forward(np.array([-2.0, 0.0, 3.0])), [0.0, 0.0, 9.0])
    eps = 1e-6
    numeric = (squared_relu_forward(x + eps) - squared_relu_forward(x - eps)) / (2 * eps) * dy
    assert np.max(np.abs(squared_relu_backward(dy, x) - numeric)) < 1e-8


def test_a_parallel_layout_equals_the_independent_reference():
    """t 2 with SP, p 2, d 2, two micro-batches per replica: the loss and every gradient (the
    kernel's own derivative is the finite-difference test above)."""
    sc = load_scenario(None, {**ON, ("model", "num_layers"): 2,
                              ("parallel", "tensor_model_parallel_size"): 2,
                              ("parallel", "sequence_parallel"): True,
                              ("parallel", "pipeline_model_parallel_size"): 2,
                              ("parallel", "data_parallel_size"): 2,
                              ("parallel", "global_batch_size"): 4, ("cluster", "nodes"): 1})
    errors = compare_with_reference(simulate_iteration(sc))
    assert max(errors.values()) < 1e-12, sorted(errors.items(), key=lambda kv: -kv[1])[:3]


def test_flops_and_memory_are_gelus():
    """An elementwise activation of the same width: the same GEMMs and the same saved bytes."""
    meta = {("run", "mode"): "meta", ("parallel", "tensor_model_parallel_size"): 2,
            ("parallel", "sequence_parallel"): True}
    gelu, relu2 = load_scenario(None, meta), load_scenario(None, {**meta, **ON})
    assert megatron_flops(relu2.model, 8, 128) == megatron_flops(gelu.model, 8, 128)
    assert "squared ReLU" in architecture(relu2.model) and architecture(gelu.model) == "GPT"
    peaks = [simulate_iteration(sc, Shortcuts(), trace="none").inputs.world.ranks[0].ledger
             .summary().peak_by_category for sc in (gelu, relu2)]
    assert peaks[0] == peaks[1]


@pytest.mark.parametrize("flags, reason", [
    (["--squared-relu", "--swiglu"], "squared ReLU or SwiGLU"),
    (["--squared-relu", "--num-experts", "4"], "dense MLP only"),
])
def test_refused_combinations_are_one_error_line(flags, reason, capsys):
    assert main(["run", "--json", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: model.squared_relu:") and reason in err
    assert err.count("\n") == 1
