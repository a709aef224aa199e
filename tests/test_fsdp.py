"""Sharded data parallelism (training/data_parallel/fsdp.py): numeric equality with the single-device
reference per strategy, a hand-worked timeline of gathers, compute and reduce-scatters with
prefetch, and Llama 3 8B's per-rank memory against the closed form of docs/fsdp.md."""

import json

import numpy as np
import pytest

from simsp.scenario.loading import load_scenario
from simsp.engine.group_timing import NODE_PIECE, RING_ALONE, STEP_BY_STEP, EveryGroup
from simsp.engine.collectives.ring_timing import collective_time
from simsp.explore.evaluation.evaluate import collect_metrics
from simsp.explore.search.bounds import memory_lower_bound, time_lower_bound
from simsp.model.params import layer_param_names, param_shapes
from simsp.training.driver.compare import compare_with_reference
from simsp.training.data_parallel.fsdp import FsdpUnits
from simsp.training.driver.gradcheck import gradient_check
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
from simsp.training.pipeline.plan import stage_plans
from simsp.training.driver.world import build_world
from tests.inprocess import cli

TINY = {"model": {"num_layers": 4, "hidden_size": 32, "num_attention_heads": 4,
                  "seq_length": 16, "vocab_size": 64},
        "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
                     "data_parallel_size": 2, "sequence_parallel": True,
                     "micro_batch_size": 1, "global_batch_size": 4}}
STRATEGIES = [{"use_megatron_fsdp": True, "data_parallel_sharding_strategy": s}
              for s in ("no_shard", "optim", "optim_grads", "optim_grads_params")] + \
             [{"use_torch_fsdp2": True}]


def scenario(sections: dict):
    """A validated scenario from {section: {key: value}}."""
    return load_scenario(overrides={(section, key): value for section, values in sections.items()
                                    for key, value in values.items()})


def tiny(**parallel):
    return scenario({"model": TINY["model"], "parallel": {**TINY["parallel"], **parallel}})


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: str(list(s.values())[-1]))
def test_every_strategy_equals_the_single_device_reference(strategy):
    """TP 2 + SP + PP 2 (tied embedding across stages) + DP 2, two micro-batches: every
    gradient rebuilt from the DP shards equals the reference to rounding."""
    errors = compare_with_reference(simulate_iteration(tiny(**strategy)))
    assert max(errors.values()) < 1e-12


@pytest.mark.parametrize("schedule", [
    {"num_layers_per_virtual_pipeline_stage": 1, "global_batch_size": 8},
    {"recompute_granularity": "full", "recompute_num_layers": 2}], ids=["interleaved", "full"])
def test_zero3_with_interleaving_and_full_recompute(schedule):
    """Interleaved chunks (a stage's layers not contiguous) and recomputed groups of two (both
    layers gathered before the group's backward) under ZeRO-3."""
    sc = tiny(use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads_params",
              **schedule)
    assert max(compare_with_reference(simulate_iteration(sc)).values()) < 1e-12


@pytest.mark.parametrize("strategy", STRATEGIES[1:], ids=lambda s: str(list(s.values())[-1]))
def test_adam_on_the_shard_updates_the_parameters_as_without_fsdp(strategy):
    """After the step (and, for optim and optim_grads, the parameters' all-gather) every rank's
    updated parameters, rebuilt from the shards where they are sharded, equal plain DDP's."""
    plain, sharded = simulate_iteration(tiny()), simulate_iteration(tiny(**strategy))
    for rank, state in sharded.states.items():
        fsdp, expected = state.fsdp, plain.states[rank].weights
        for unit in fsdp.units:
            window = fsdp._slice(unit)
            flat = np.concatenate([expected[n].data.reshape(-1) for n in unit.params]
                                  + [np.zeros(unit.padded - unit.numel)])  # (padded,)
            if fsdp.s.shard_params:
                got = fsdp.shards[unit.name].data  # (n,)
                np.testing.assert_allclose(got, flat[window], rtol=0, atol=1e-13)
            else:
                for name in unit.params:
                    np.testing.assert_allclose(state.weights[name].data, expected[name].data,
                                               rtol=0, atol=1e-13)


def test_fsdp2_with_context_parallelism_shards_over_dp_and_cp():
    """Llama-class layers with CP 2 (ring attention), TP 2 + SP, an uneven 2-stage pipeline and
    DP 2: units sharded over the 4 ranks of the DP x CP group equal the reference."""
    sc = load_scenario("scenarios/llama-tiny-cp.toml", {("parallel", "use_torch_fsdp2"): True})
    run = simulate_iteration(sc)
    assert next(iter(run.states.values())).fsdp.d == 4
    assert max(compare_with_reference(run).values()) < 1e-12


def test_the_sp_sum_over_shards_is_needed(monkeypatch):
    """Skip the SP-partial sum over TP on the shards: the layer norms' gradients go wrong,
    so the equality above is not vacuous."""
    def skip(self, r):
        return
        yield
    monkeypatch.setattr(FsdpUnits, "_sync_sp_shards", skip)
    errors = compare_with_reference(simulate_iteration(tiny(use_torch_fsdp2=True)))
    assert errors["layers.0.ln1.gamma"] > 1e-3
    assert errors["layers.0.attn.qkv.weight"] < 1e-12


def test_finite_differences_agree_under_zero3():
    """`simsp verify`'s other check, on two tensors: directional central differences of the
    loss against the gradients rebuilt from the shards."""
    errors = gradient_check(
        tiny(use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads_params"),
        names=["layers.1.mlp.fc1.weight", "final_ln.gamma"]).errors
    assert max(errors.values()) < 1e-5


def test_fsdp_flags_are_checked():
    rc, _, err = cli(["run", "--data-parallel-sharding-strategy", "optim"])
    assert rc == 2 and err.strip() == \
        "error: parallel.data_parallel_sharding_strategy: needs use_megatron_fsdp"
    rc, _, err = cli(["run", "--use-megatron-fsdp", "--use-torch-fsdp2"])
    assert rc == 2 and "use_torch_fsdp2" in err


# ---------------------------------------------------------------------------------------------
# A hand-worked timeline: two layer units on two DP ranks, compute of chosen length
# ---------------------------------------------------------------------------------------------

F, B = 300e-6, 600e-6  # seconds of one layer's forward and backward (longer than a gather)


def _harness(strategy: dict):
    """Two DP ranks, two layer units (no root: the harness passes layer parameters only),
    driven through the hooks the training loop calls, with fixed compute times."""
    sc = scenario({
        "model": {"num_layers": 2, "hidden_size": 1024, "num_attention_heads": 8,
                  "seq_length": 64, "vocab_size": 128},
        "parallel": {"data_parallel_size": 2, **strategy},
        "cluster": {"nccl_algo": "ring", "nccl_proto": "Simple"}, "run": {"mode": "meta"}})
    world = build_world(sc, timing_of=EveryGroup(RING_ALONE))
    shapes = param_shapes(sc.padded_model)
    layer_shapes = {n: shapes[n] for i in (0, 1) for n in layer_param_names(i) if n in shapes}
    plans, log, units = stage_plans(sc, world.grid), [], {}

    def program(r):
        fsdp = units[r.rank] = FsdpUnits(r, sc, world.grid, plans[r.rank], layer_shapes, None)
        for i in (0, 1):
            yield from fsdp.params_needed(r, 0, (i,))
            log.append((r.rank, f"F{i}", r.env.now, r.ledger.current["weights"]))
            yield r.env.timeout(F)
            fsdp.after_forward(r, (i,))
        for i in (1, 0):
            yield from fsdp.before_backward(r, 0, (i,))
            log.append((r.rank, f"B{i}", r.env.now, r.ledger.current["gradients"]))
            yield r.env.timeout(B)
            fsdp.grads_ready(r, plans[r.rank], 0, 0, (i,))
        yield from fsdp.finish(r)
        log.append((r.rank, "end", r.env.now, r.ledger.current["gradients"]))

    for r in world.ranks.values():
        world.env.process(program(r))
    world.env.run()
    return sc, world, units, log


def test_hand_worked_timeline_of_two_units_with_prefetch():
    """ZeRO-3 (optim_grads_params) by hand, A = one unit's all-gather, R = its reduce-scatter
    (the ring's closed form, engine/collectives/ring_timing.py), F < B the compute, A < F, R < B:
      0        issue AG0 and, prefetched, AG1 (queued behind it on the gather stream)
      A        AG0 done: F0 runs [A, A+F]; AG1 runs [A, 2A]
      A+F      F0 done, copy 0 freed; AG1 arrived: F1 runs [A+F, A+2F] at once
      A+2F     before B1: issue AG1 again and, prefetched, AG0; wait A (exposed)
      2A+2F    B1 runs [2A+2F, 2A+2F+B]; AG0 runs [2A+2F, 3A+2F], in time
      2A+2F+B  RS1 issued [.., +R]; B0 runs at once to 2A+2F+2B; then RS0 [.., +R]
      2A+2F+2B+R  finish: the last reduce-scatter, R, is exposed."""
    sc, world, units, log = _harness({"use_megatron_fsdp": True,
                                      "data_parallel_sharding_strategy": "optim_grads_params"})
    unit = units[0].units[0]
    gpus, graph, cal = [0, 1], world.network.graph, world.network.calibration
    A = collective_time("all_gather", graph, gpus, unit.padded * 2, cal, 2)
    R = collective_time("reduce_scatter", graph, gpus, unit.padded * 4, cal, 4)
    assert A < F and R < B
    times = {name: t for rank, name, t, _ in log if rank == 0}
    expected = {"F0": A, "F1": A + F, "B1": 2 * A + 2 * F, "B0": 2 * A + 2 * F + B,
                "end": 2 * A + 2 * F + 2 * B + R}
    for name, t in expected.items():
        assert times[name] == pytest.approx(t, rel=0, abs=1e-12), name
    stats = units[0].unit_report()
    assert stats["layers.0"]["all_gather_exposed_s"] == pytest.approx(A, abs=1e-12)
    assert stats["layers.1"]["all_gather_exposed_s"] == pytest.approx(A, abs=1e-12)
    assert stats["layers.0"]["reduce_exposed_s"] == pytest.approx(R, abs=1e-12)
    assert stats["layers.1"]["reduce_exposed_s"] == 0.0
    assert stats["layers.0"]["all_gather_s"] == pytest.approx(2 * A, abs=1e-12)
    # ledger: while F0 runs both copies are live (0 and the prefetched 1); the unsharded
    # gradients: B1's alone, then B0's beside RS1's still in flight, none at the end
    copy = unit.padded * 2
    shard_bytes = 2 * sum(u.shard(2) for u in units[0].units)
    weights = {name: b for rank, name, _, b in log if rank == 0 and name.startswith("F")}
    assert weights == {"F0": shard_bytes + 2 * copy, "F1": shard_bytes + copy}
    grads = {name: b for rank, name, _, b in log if rank == 0 and not name.startswith("F")}
    grad_shards = 4 * sum(u.shard(2) for u in units[0].units)
    assert grads == {"B1": grad_shards + 4 * unit.padded, "B0": grad_shards + 8 * unit.padded,
                     "end": grad_shards}


# ---------------------------------------------------------------------------------------------
# Llama 3 8B over 8 GPUs: per-rank memory by category against docs/fsdp.md's closed form
# ---------------------------------------------------------------------------------------------

H, HEADS, GROUPS, HEAD_DIM, FFN, VOCAB, LAYERS = 4096, 32, 8, 128, 14336, 128256, 32
LAYER = (H * (HEADS + 2 * GROUPS) * HEAD_DIM + HEADS * HEAD_DIM * H  # QKV, projection
         + H * 2 * FFN + FFN * H + 2 * H)  # SwiGLU fc1, fc2, two RMSNorm weights
WORD, ROOT = VOCAB * H, H + VOCAB * H  # word embedding; final norm + untied output layer
SHARD = (LAYERS * LAYER + WORD + ROOT) // 8  # every unit divides by 8: no padding
LLAMA_8B_FSDP = ["run", "scenarios/llama3-8b.toml", "--tensor-model-parallel-size", "1",
                 "--no-sequence-parallel", "--data-parallel-size", "8",
                 "--global-batch-size", "16", "--json"]
MEMORY_FORM = {  # docs/fsdp.md#llama-3-8b-over-8-gpus
    ("--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"): {
        "weights": 2 * SHARD + 2 * (WORD + ROOT) + 2 * 2 * LAYER,
        "gradients": 4 * SHARD + 4 * (WORD + ROOT) + 4 * LAYER,
        "optimizer": 12 * SHARD, "communication": 0},
    ("--use-torch-fsdp2",): {
        "weights": 4 * SHARD + 2 * (WORD + ROOT) + 2 * 2 * LAYER,
        "gradients": 4 * SHARD + 2 * (WORD + ROOT),
        "optimizer": 8 * SHARD, "communication": 4 * (WORD + ROOT) + 4 * LAYER}}


@pytest.mark.parametrize("flags", list(MEMORY_FORM), ids=lambda f: f[-1])
def test_llama3_8b_fsdp_memory_matches_the_closed_form(flags):
    """Peak bytes by category of every rank: the shards, the root units' copies and
    gradients, two layer copies (one computing, one prefetched) and the unsharded gradient of
    the layer whose reduce-scatter is in flight when the embedding's backward starts; the
    activations are the same as without FSDP (the K22/Llama closed form); the search's lower
    bounds hold."""
    rc, out, err = cli(LLAMA_8B_FSDP[:-1] + list(flags) + ["--json"])
    assert rc == 0, err
    metrics = json.loads(out)
    for rank in metrics["ranks"]:
        peaks = rank["peak_by_category_bytes"]
        for category, expected in MEMORY_FORM[flags].items():
            assert peaks[category] == expected, (rank["rank"], category)
        assert peaks["activations"] == metrics["first_stage_activation_formula_bytes"]
    sc = load_scenario("scenarios/llama3-8b.toml", {
        ("parallel", "tensor_model_parallel_size"): 1, ("parallel", "sequence_parallel"): False,
        ("parallel", "data_parallel_size"): 8, ("parallel", "global_batch_size"): 16,
        **({("parallel", "use_torch_fsdp2"): True} if len(flags) == 1 else
           {("parallel", "use_megatron_fsdp"): True,
            ("parallel", "data_parallel_sharding_strategy"): flags[-1]})})
    assert memory_lower_bound(sc) <= metrics["ranks"][0]["peak_bytes"]
    assert time_lower_bound(sc) <= metrics["iteration_time_s"]
    share = metrics["fsdp"]["exposed_fraction"]
    assert 0 < share < 1


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: str(list(s.values())[-1]))
def test_search_bounds_hold_under_every_strategy(strategy):
    """The search's proven lower bounds (explore/search/bounds.py) stay below the simulated iteration
    time and stage-0 peak on a meta layout with TP, SP, a 2-stage pipeline and d = 2."""
    sc = scenario({"model": {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8,
                             "seq_length": 512, "vocab_size": 8000},
                   "parallel": {**TINY["parallel"], "global_batch_size": 8, **strategy},
                   "run": {"mode": "meta"}})
    metrics = collect_metrics(sc)
    stage0 = [r["peak_bytes"] for r in metrics["ranks"] if r["pp"] == 0]
    assert memory_lower_bound(sc) <= min(stage0)
    assert time_lower_bound(sc) <= metrics["iteration_time_s"]


@pytest.mark.parametrize("layout", [
    {"tensor_model_parallel_size": 2, "sequence_parallel": True, "data_parallel_size": 4},
    {"data_parallel_size": 8}], ids=["t2-d4", "d8"])
def test_meta_shortcuts_equal_the_full_simulation_under_fsdp(layout):
    """FSDP's gathers and reduce-scatters overlap each other and, at t 2, TP traffic on the
    same NVLink: with the shortcuts (its DP rings step by step; at d 8 one simulated rank) the
    iteration and the memory are those of every rank simulated step by step."""
    sc = scenario({"model": {"num_layers": 2, "hidden_size": 1024, "num_attention_heads": 8,
                             "seq_length": 512, "vocab_size": 8000},
                   "parallel": {**layout, "global_batch_size": 16, "use_torch_fsdp2": True},
                   "run": {"mode": "meta"}})
    fast = simulate_iteration(sc, Shortcuts.for_scale(sc))
    full = simulate_iteration(sc)
    assert fast.inputs.shortcuts.closed_form and fast.inputs.shortcuts.groups(STEP_BY_STEP, NODE_PIECE)
    assert fast.inputs.shortcuts.representative == (layout["data_parallel_size"] == 8)
    assert max(fast.results.end_s.values()) == pytest.approx(max(full.results.end_s.values()),
                                                             rel=1e-9)
    rank = next(iter(fast.inputs.world.ranks))
    assert (fast.inputs.world.ranks[rank].ledger.peak_total
            == full.inputs.world.ranks[rank].ledger.peak_total)


def test_wide_fsdp_is_refused_before_it_runs():
    """FSDP's DP rings that share NVLink ports with TP traffic run step by step and cost about
    d² per collective (simsp/scenario/work.py, measured at d = 16, 32, 64): Llama 3 8B at t 2, d = 256
    is estimated above the limit and refused at once (at t 1 they run as pieces: d·G)."""
    rc, _, err = cli(["run", "scenarios/llama3-8b.toml", "--tensor-model-parallel-size", "2",
                      "--sequence-parallel", "--data-parallel-size", "256", "--nodes", "64",
                      "--global-batch-size", "256", "--use-torch-fsdp2", "--json"])
    assert rc == 2 and err.startswith("error: work: about ") and "600" in err
