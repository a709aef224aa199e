"""--ddp-average-in-collective against Megatron-LM's default (d98e8a64,
megatron/core/distributed/distributed_data_parallel.py gradient scaling factors,
param_and_grad_buffer.py start_grad_sync): the default multiplies each bucket by 1/(d·cp) in
one element-wise kernel before summing; the flag averages in the collective (NCCL's
pre-multiplied sum), so exactly those kernels go (expert buckets keep edp/(d·cp) when it is not
1), the collectives move the same bytes, and the averaged gradients are the same."""

import numpy as np
import pytest

from simsp.errors import UserError
from simsp.hardware.costmodel import kernel_time
from simsp.scenario.loading import load_scenario, with_overrides
from simsp.shortcuts.check import Shortcuts
from simsp.training.driver.compare import compare_with_reference
from simsp.training.driver.iteration import simulate_iteration
from simsp.training.data_parallel.grad_scaling import scaling_factor


def test_megatrons_scaling_factors():
    """Case 2 (default): 1/(d·cp) for every bucket; Case 1 (average): 1 dense, edp/(d·cp)
    expert, so that with the average over edp each gradient ends at 1/(d·cp)."""
    assert scaling_factor(False, 4, 4) == 0.25 and scaling_factor(False, 4, 8) == 0.25
    assert scaling_factor(True, 4, 4) == 1.0
    assert scaling_factor(True, 4, 8) / 8 == 1 / 4  # AVG over edp = 8 ranks


def gradients(sc) -> dict:
    """{(rank, parameter): gradient} after a numeric iteration (every rank simulated)."""
    run = simulate_iteration(sc, Shortcuts(), trace="none")
    return {(rank, n): g.data.copy() for rank, state in run.states.items()
            for n, g in state.grads.items()}


@pytest.mark.parametrize("path,parallel", [
    ("scenarios/llama-tiny.toml", {}),  # TP 2 + SP, PP 2, DP 2
    ("scenarios/moe-tiny-cp.toml", {}),  # CP 2, DP 2, EP 2 (edp 4 = d·cp: expert factor 1)
    ("scenarios/moe-tiny-cp.toml", {"expert_model_parallel_size": 1})])  # edp 8: factor 2
def test_averaged_gradients_equal_the_default_ones(path, parallel):
    """Numeric mode: every rank's every gradient after the DP reduction is the same, to 1e-12,
    whether the buckets were scaled by 1/(d·cp) and summed or averaged in the collective."""
    sc = load_scenario(path, {("parallel", k): v for k, v in parallel.items()})
    default = gradients(sc)
    averaged = gradients(with_overrides(sc, parallel={"ddp_average_in_collective": True}))
    assert default.keys() == averaged.keys()
    scale = max(np.abs(g).max() for g in default.values())
    for key, g in default.items():
        np.testing.assert_allclose(averaged[key], g, rtol=0, atol=1e-12 * scale, err_msg=str(key))


def test_verify_compares_the_average_against_the_reference():
    """llama-tiny (TP 2 + SP, PP 2, DP 2) under the average: every parameter's gradient and the
    embedding output's gradient (a replica's, of its own mean loss) against the single-device
    reference's global-mean gradients, within 1e-10."""
    sc = load_scenario("scenarios/llama-tiny.toml",
                       {("parallel", "ddp_average_in_collective"): True})
    errors = compare_with_reference(simulate_iteration(sc, Shortcuts(), trace="none"))
    assert "embedding_output" in errors
    assert max(errors.values()) <= 1e-10, sorted(errors.items(), key=lambda kv: -kv[1])[:3]


def meta_run(average: bool):
    """llama-tiny in meta mode, overlapped reduction, the shortcuts' representative ranks."""
    sc = load_scenario("scenarios/llama-tiny.toml", {
        ("run", "mode"): "meta", ("parallel", "overlap_grad_reduce"): True,
        ("parallel", "ddp_average_in_collective"): average})
    return simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none")


def test_the_average_removes_exactly_the_dense_scaling_kernels():
    """Per simulated rank: element-wise seconds fall by one kernel per bucket, reading and
    writing its fp32 gradients (2 · 4 B · numel); the DP collectives' bytes are unchanged."""
    default, averaged = meta_run(False), meta_run(True)
    for rank, r in default.inputs.world.ranks.items():
        mine = averaged.inputs.world.ranks[rank]
        buckets = default.states[rank].ddp_buckets.buckets
        assert buckets
        removed = sum(kernel_time("elementwise", 0, 2 * 4 * b.numel, cal=r.compute_cal)
                      for b in buckets)
        assert r.busy_s["elementwise"] - mine.busy_s["elementwise"] == pytest.approx(
            removed, rel=1e-9)
        assert mine.comm_bytes == r.comm_bytes


@pytest.mark.parametrize("path,parallel,reason", [
    ("scenarios/llama-tiny.toml", {"use_torch_fsdp2": True}, "not modelled with FSDP"),
    ("scenarios/moe-tiny-cp.toml", {"tensor_model_parallel_size": 1,
                                    "sequence_parallel": False, "data_parallel_size": 2,
                                    "context_parallel_size": 1,
                                    "expert_model_parallel_size": 2},
     "edp = 1")])
def test_refusals(path, parallel, reason):
    """Not modelled: FSDP's reductions, expert weights held by one data-parallel rank."""
    overrides = {("parallel", k): v for k, v in parallel.items()}
    overrides[("parallel", "ddp_average_in_collective")] = True
    with pytest.raises(UserError) as caught:
        load_scenario(path, overrides)
    assert caught.value.field == "parallel.ddp_average_in_collective"
    assert reason in str(caught.value)
