"""Finite-difference gradient check of the 2-layer model: `simsp verify` and the Python API."""

from dataclasses import replace
import json

import pytest

from simsp.cli import main
from simsp.commands.verify import FD_TOLERANCE, REFERENCE_TOLERANCE
from simsp.scenario.loading import load_scenario
from simsp.model.blocks.mlp import activation
from simsp.model.blocks.mlp.activation import gelu_backward
from simsp.model.params import param_shapes
from simsp.training.driver.gradcheck import EMBEDDING_OUTPUT, gradient_check


def every_tensor(sc) -> set[str]:
    return set(param_shapes(sc.model)) | {EMBEDDING_OUTPUT}


def test_default_model_is_the_two_layer_gpt():
    sc = load_scenario()
    assert sc.model.num_layers == 2
    assert sc.run.mode == "numeric" and sc.run.numeric_dtype == "float64"
    names = set(param_shapes(sc.model))
    assert {n for n in names if n.startswith("layers.1.")}  # both layers have parameters
    assert len(names) == 2 + 2 * 12 + 2  # embeddings, 12 per layer, final LN


def test_simsp_verify_json_passes_for_every_parameter(capsys):
    assert main(["verify", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    sc = load_scenario()
    assert report["passed"] is True
    assert set(report["checked"]) == every_tensor(sc)
    assert set(report["fd_errors"]) == every_tensor(sc)
    assert all(err <= FD_TOLERANCE for err in report["fd_errors"].values())
    assert report["max_rel_err"] == max(report["fd_errors"].values()) <= FD_TOLERANCE
    assert report["max_rel_err_vs_reference"] <= REFERENCE_TOLERANCE
    assert set(param_shapes(sc.model)) | {"loss", EMBEDDING_OUTPUT} <= set(
        report["reference_errors"])
    print(f"\nverify default: worst FD rel err {report['max_rel_err']:.3e}, "
          f"vs reference {report['max_rel_err_vs_reference']:.3e}")


def test_gradient_check_api_on_the_default_model():
    """The API on a few tensors (every tensor: the `--json` test above, through the same
    gradient_check)."""
    sc = load_scenario()
    names = ["embedding.word", "layers.1.mlp.fc1.weight", EMBEDDING_OUTPUT]
    errors = gradient_check(sc, names=names).errors
    assert list(errors) == names
    worst = max(errors, key=errors.get)
    assert errors[worst] < FD_TOLERANCE, (worst, errors[worst])
    print(f"\ngradient_check default: worst {worst} {errors[worst]:.3e}")


@pytest.mark.parametrize("flags", [
    ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--recompute-granularity",
     "selective", "--pipeline-model-parallel-size", "2"],
    ["--tensor-model-parallel-size", "2", "--recompute-granularity", "full"],
])
def test_simsp_verify_passes_on_parallel_layouts(capsys, flags):
    assert main(["verify", "--json", *flags]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is True
    assert report["max_rel_err"] <= FD_TOLERANCE
    print(f"\nverify {' '.join(flags)}: worst FD {report['max_rel_err']:.3e}")


def test_gradient_check_catches_a_wrong_backward(monkeypatch, capsys):
    """A GeLU backward 10% too large: the FD check flags the layers' fc1, and so does the
    single-device reference (its own GeLU, gradients by autodiff: it shares no kernel with the
    simulated blocks); `simsp verify` exits 1, the fourth-order re-difference of fc1 as wrong
    as the first."""
    wrong = lambda dy, x: 1.1 * gelu_backward(dy, x)  # noqa: E731
    monkeypatch.setattr(activation, "GELU", replace(activation.GELU, backward=wrong))
    sc = load_scenario()
    errors = gradient_check(sc, names=["layers.0.mlp.fc1.weight", "layers.1.mlp.fc2.weight"]).errors
    assert errors["layers.0.mlp.fc1.weight"] > 1e-3
    assert errors["layers.1.mlp.fc2.weight"] < FD_TOLERANCE  # upstream of GeLU: still right
    assert main(["verify", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is False
    assert report["fd_refined"]["layers.0.mlp.fc1.weight"] > 1e-3
    assert report["fd_errors"]["layers.0.mlp.fc1.weight"] > 1e-3
    assert report["max_rel_err_vs_reference"] > 1e-3  # the reference computes GeLU its own way
