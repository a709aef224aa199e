"""The two-chunk schedules (ZB-V, DualPipeV, DualPipe) with mixture-of-experts under expert
parallelism, multi-token prediction and context parallelism, as DeepSeek-V3 runs DualPipe
(docs/dualpipe.md "Experts, multi-token prediction and context parallelism"): every gradient
equal to the single-device reference, and the experts' grouped-GEMM weight gradients run in the
W steps (arXiv:2401.10241 §2; DeepSeek-V3 report §3.2.1, Figure 4's "backward for weights")."""

import pytest

from simsp.model.blocks.moe import experts
from simsp.scenario.loading import load_scenario
from simsp.training.driver.compare import compare_with_reference
from simsp.training.driver.iteration import simulate_iteration
from tests.test_moe_expert_parallel import scenario as moe_scenario
from tests.test_zero_bubble_run import only_model_state_left

PP, M, LAYERS = 4, 8, 8  # m = global batch 32 / (micro-batch 2 x DP 2)


def moe_layout(schedule: str, **extra):
    """EP 2 over DP 2, PP 4, 8 layers of 4 experts (top-2, capacity 0.5: tokens dropped),
    all-to-all dispatch, 8 micro-batches."""
    return moe_scenario(pipeline_model_parallel_size=PP, num_layers=LAYERS,
                        moe_expert_capacity_factor=0.5, global_batch_size=32,
                        schedule=schedule, **extra)


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev", "dualpipe"])
def test_moe_and_mtp_with_expert_parallelism_equal_the_reference(schedule):
    """The MoE layout with one multi-token prediction depth (a MoE layer, loss weight 0.3) on
    the last stage (the V's rank 0; both of DualPipe's end ranks): loss and every gradient
    (router, experts, attention, the depth's, embedding, head) within 1e-10 of the
    single-device reference; nothing but model state left after the iteration (every W
    freed what its B held for the experts' weight gradients)."""
    run = simulate_iteration(moe_layout(schedule, mtp_num_layers=1, mtp_loss_scaling_factor=0.3,
                                        position_embedding_type="rope"))
    errors = compare_with_reference(run)
    assert max(errors.values()) <= 1e-10, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    assert any(name.startswith("mtp.0.layer.mlp.experts") for name in errors)
    assert only_model_state_left(run)


def test_expert_weight_gradients_run_in_the_w_steps(monkeypatch):
    """ZB-V: every expert GEMM is one pass (data or weight gradient, never both); the weight
    gradients' GEMMs, fc2's then fc1's for each layer, all start inside a W step of their own
    rank, 2 per MoE layer of each chunk per micro-batch: 2 chunks x 8 micro-batches x
    8 / (2 x 4) layers a chunk x 2 = 32 per rank."""
    calls = []
    real = experts.expert_gemm

    def logged(r, name, counts, k, n, passes=1):
        calls.append((r.rank, name, passes, r.env.now))
        yield from real(r, name, counts, k, n, passes)
    monkeypatch.setattr(experts, "expert_gemm", logged)
    run = simulate_iteration(moe_layout("zbv"))
    backward = [c for c in calls if c[1].startswith("d_expert")]
    assert backward and all(passes == 1 for _, _, passes, _ in backward)
    for rank, steps in run.results.steps.items():
        w_spans = [(begin, end) for kind, *_, begin, end in steps if kind == "W"]
        mine = [(name, now) for r, name, _, now in backward if r == rank]
        weights = [(name, now) for name, now in mine if name.endswith("_weight")]
        assert len(weights) == 2 * M * (LAYERS // (2 * PP)) * 2
        assert [name for name, _ in weights[:2]] == ["d_expert_fc2_weight",
                                                     "d_expert_fc1_weight"]
        assert all(any(b <= now < e for b, e in w_spans) for _, now in weights)
        assert not any(any(b <= now < e for b, e in w_spans)
                       for name, now in mine if not name.endswith("_weight"))


@pytest.mark.parametrize("schedule", ["zbv", "dualpipe"])
def test_context_parallel_moe_equals_the_reference(schedule):
    """scenarios/moe-tiny-cp.toml (CP 2 over TP 2 with SP, EP 2, top-1 with dropping, hidden
    dropout) on PP 2 with 4 layers and 4 micro-batches, on the V and on DualPipe's two
    pipelines: every gradient within 1e-10 of the reference."""
    overrides = {("parallel", "schedule"): schedule,
                 ("parallel", "pipeline_model_parallel_size"): 2, ("model", "num_layers"): 4, ("parallel", "global_batch_size"): 8,
                 ("parallel", "data_parallel_size"): 1}
    run = simulate_iteration(load_scenario("scenarios/moe-tiny-cp.toml", overrides))
    assert run.inputs.sc.parallel.cp == 2 and run.inputs.sc.parallel.num_micro_batches == 4
    errors = compare_with_reference(run)
    assert max(errors.values()) <= 1e-10, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    assert only_model_state_left(run)
