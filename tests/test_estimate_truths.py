"""The work estimates against what runs, counted: the iterations `simsp verify` simulates against
the bound its work check prices (commands/verify.py _iterations), and the ranks a meta run
simulates (its replicas per placement or shard kind, CP replicas, expert groups grown) against
the ranks meta_seconds and meta_bytes count (shortcuts/work_counts.py run_ranks)."""

import json
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

import simsp.hardware.cluster_hardware as cluster_hardware
from simsp.cli import main
from simsp.commands import run as run_command, verify
from simsp.scenario.loading import load_scenario
from simsp.scenario.work import check_work
from simsp.shortcuts.check import Shortcuts
from simsp.shortcuts.work_counts import run_ranks
from simsp.training.driver import gradcheck, iteration
from simsp.training.driver.iteration import simulate_iteration
from tests.test_cp_representative_dp import cp_layout
from tests.test_fsdp_leaf_replicas import fsdp
from tests.test_representative_audit import scenario as dp_layout

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from estimate_constants import counts  # noqa: E402 (each constant's count in the estimate)

TINY = "scenarios/tiny.toml"
# scenarios/tiny.toml's checked tensors, by hand: word and position embeddings, 12 per layer
# (2 norms x 2, QKV, projection, fc1, fc2 x weight and bias) x 4, the final norm's 2, the
# embedding output
TINY_TENSORS = 2 + 12 * 4 + 2 + 1
# RMSNorm, RoPE, untied, 2 layers: the word embedding, 10 per layer (1 per norm), the final
# norm, the output layer, the embedding output
LLAMA_TENSORS = 1 + 10 * 2 + 1 + 1 + 1


@pytest.fixture
def iterations(monkeypatch):
    """Count verify's simulated iterations; each after the test's first returns the first's run
    (the count is what is checked, not the differences: that keeps a 320-iteration check cheap).
    After the test the counter passes every call through: a module imported meanwhile may
    hold it."""
    runs, first, counting = [], [], [True]  # the calls counted; the first run, kept

    def counted(sc, *args, **kwargs):
        if not counting[0]:
            return simulate_iteration(sc, *args, **kwargs)
        if not first:
            first.append(simulate_iteration(sc, *args, **kwargs))
        runs.append(first[0])
        return first[0]
    monkeypatch.setattr(gradcheck, "simulate_iteration", counted)
    monkeypatch.setattr(iteration, "simulate_iteration", counted)
    yield runs
    counting[0] = False


def test_verify_runs_the_iterations_its_work_check_counts(iterations, monkeypatch, capsys):
    """scenarios/tiny.toml: no tensor re-differenced, 2 per tensor + the gradients' run and the
    reference's; every tensor re-differenced (the tolerance below any error), 4 more per tensor:
    the bound the work check prices."""
    fewest, most = 2 + 2 * TINY_TENSORS, 2 + 6 * TINY_TENSORS
    assert verify._iterations(load_scenario(TINY)) == (fewest, most)
    for tolerance, expected, refined in ((float("inf"), fewest, 0), (-1.0, most, TINY_TENSORS)):
        monkeypatch.setattr(verify, "FD_TOLERANCE", tolerance)
        iterations.clear()
        main(["verify", TINY, "--json"])
        report = json.loads(capsys.readouterr().out)
        assert len(report["checked"]) == TINY_TENSORS and len(report["fd_refined"]) == refined
        assert len(iterations) == expected


def test_verify_counts_the_tensors_of_llama_layers():
    """RMSNorm (one parameter per norm), RoPE (no position table), untied output: the count
    follows the model's own parameters (the rule of 12 per layer + 5 gave 26, not 24)."""
    sc = load_scenario(TINY, {("model", "normalization"): "RMSNorm",
                              ("model", "position_embedding_type"): "rope",
                              ("model", "untie_embeddings_and_output_weights"): True,
                              ("model", "num_layers"): 2})
    assert verify._iterations(sc) == (2 + 2 * LLAMA_TENSORS, 2 + 6 * LLAMA_TENSORS)


def test_verify_float32_and_fp8_bounds_are_exact():
    """float32 never re-differences: 2 per tensor + 2 at most; FP8 runs the reference alone."""
    sc = load_scenario(TINY, {("run", "numeric_dtype"): "float32"})
    assert verify._iterations(sc) == (2 + 2 * TINY_TENSORS,) * 2
    sc = load_scenario(TINY, {("parallel", "fp8_format"): "hybrid",
                              ("cluster", "system"): "dgx-h100"})
    assert verify._iterations(sc) == (1, 1)


def test_verify_refusal_names_the_worst_case(capsys):
    """The time refusal (24 layers of h 128: 1,760 iterations of 6.8 s at most) gives the bound
    and how it is made, in one line."""
    rc = main(["verify", TINY, "--num-layers", "24", "--hidden-size", "128"])
    err = capsys.readouterr().err
    tensors = 2 + 12 * 24 + 2 + 1
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: work: up to about ")
    assert f"x up to {2 + 6 * tensors} iterations: 6 per checked tensor" in err
    assert f"x {tensors} tensors" in err and f"{2 + 2 * tensors} if none is re-differenced" in err


def moe_layout():
    """EP 4 over d 4, p 2, imbalanced routing: each stage's simulated rank grows to its whole
    expert group (model/blocks/moe/placement.py representatives)."""
    sc = load_scenario(TINY, {("model", "num_layers"): 4, ("model", "add_bias_linear"): False,
                              ("model", "num_experts"): 4, ("model", "moe_routing_imbalance"): 0.5,
                              ("parallel", "expert_model_parallel_size"): 4,
                              ("parallel", "tensor_model_parallel_size"): 1,
                              ("parallel", "sequence_parallel"): False,
                              ("parallel", "data_parallel_size"): 4,
                              ("parallel", "moe_token_dispatcher_type"): "alltoall",
                              ("parallel", "micro_batch_size"): 1,
                              ("parallel", "global_batch_size"): 8, ("run", "mode"): "meta"})
    return sc


LAYOUTS = {  # label -> (the scenario, the fabric's nodes per leaf (None: as it is), ranks run)
    "placement replicas: t1 p3 d8 across a leaf": (
        lambda: dp_layout(1, 1, 3, 8, False, False, untied=True), None, 6),
    "FSDP shards across a leaf": (
        lambda: fsdp(dp_layout(1, 1, 3, 8, False, False, untied=True)), None, 6),
    "CP replicas: t2 c2 d3 across a leaf": (
        lambda: cp_layout(2, 2, 2, 1, 3, "p2p", ib_latency_us=20.0), 3, 4),
    "rail symmetry: t1 p3 d2 interleaved": (
        lambda: dp_layout(1, 1, 3, 2, True, True, hidden=512, seq=256, bucket=200_000), None, 3),
    "expert groups: EP 4 d 4 p 2, imbalanced": (moe_layout, None, 8),
}


@pytest.mark.parametrize("label", LAYOUTS)
def test_the_estimate_counts_the_ranks_the_run_simulates(label, monkeypatch):
    """The ranks a run executes (those with an end time), hand-counted here too, are the ranks
    the estimate prices: each its plan of every layer (seconds and bytes) and each its ledger
    of its layer-steps (bytes: the forward layer-steps the run executed)."""
    make, per_leaf, hand = LAYOUTS[label]
    if per_leaf is not None:
        monkeypatch.setattr(cluster_hardware, "DEFAULT",
                            replace(cluster_hardware.DEFAULT, nodes_per_leaf=per_leaf))
    sc = make()
    fast = Shortcuts.for_scale(sc)
    assert fast.representative
    run = simulate_iteration(sc, fast, trace="none")
    ranks = sorted(run.results.end_s)
    assert len(ranks) == hand == run_ranks(sc, fast)
    plans = len(ranks) * sc.model.num_layers
    assert counts(sc, fast, "run")["run"]["PLAN_SECONDS_PER_RANK_LAYER"] == plans
    terms = counts(sc, fast, "bytes")["bytes"]
    assert terms["PLAN_BYTES_PER_RANK_LAYER"] == plans
    forwards = sum(len(run.inputs.plans[r].layers(chunk)) for r in ranks  # CP shadows: none
                   for kind, _, chunk, *_ in run.results.steps.get(r, ()) if kind == "F")
    # the ledger per layer-step: a template's replay, else every record of the layer (full_bytes)
    per_step = "META_BYTES_PER_LAYER_STEP" if fast.templates else "FULL_BYTES_PER_RANK_STEP"
    assert terms[per_step] == forwards


# A TP layer's ring collectives under SP (Megatron's sequence-parallel linears, hand-listed):
# forward, the all-gathers before QKV and fc1 and the reduce-scatters after the projection and
# fc2; backward, their transposes and the re-gathers of QKV's and fc1's inputs for the weight
# gradients. Each is a ring of t − 1 steps, one transfer a step from every rank.
LAYER_COLLECTIVES = ("qkv_enter", "attn_exit", "fc1_enter", "mlp_exit", "mlp.fc2_exit_grad",
                     "mlp.fc1_regather", "mlp.fc1_enter_grad", "attn.proj_exit_grad",
                     "attn.qkv_regather", "attn.qkv_enter_grad")


@pytest.mark.parametrize("tp, dp", [(2, 2), (4, 1)])
def test_the_full_estimate_counts_what_a_full_run_keeps(tp, dp):
    """Without shortcuts (tiny in meta mode, 2 stages) every rank runs and keeps its state and
    its layers', a ledger of its layer-steps and the transfer records of its TP rings: the
    estimate's ranks, rank-layers, rank-steps and ring steps are the run's ranks, the layers
    of their plans, forward layer-steps and each layer collective's transfers."""
    sc = load_scenario(TINY, {("run", "mode"): "meta", ("parallel", "data_parallel_size"): dp,
                              ("parallel", "tensor_model_parallel_size"): tp})
    full = Shortcuts()
    run = simulate_iteration(sc, full, trace="steps")
    terms = counts(sc, full, "full-bytes")["full-bytes"]
    ranks = sorted(run.results.end_s)
    assert len(ranks) == 8 == terms["FULL_BYTES_PER_RANK"]  # t·p·d = 8
    plans = [run.inputs.plans[r] for r in ranks]
    held = sum(len(plan.layers(chunk)) for plan in plans for chunk in range(plan.v))
    assert held == 8 * 2 == terms["FULL_BYTES_PER_RANK_LAYER"]  # each its stage's 2 layers
    assert terms["PLAN_BYTES_PER_RANK_LAYER"] == 8 * 4 and "META_BYTES_PER_LAYER_STEP" not in terms
    forwards = sum(len(run.inputs.plans[r].layers(chunk)) for r in ranks
                   for kind, _, chunk, *_ in run.results.steps[r] if kind == "F")
    m = 16 // (2 * dp)  # micro-batches of 2 samples per replica
    assert forwards == 8 * 2 * m == terms["FULL_BYTES_PER_RANK_STEP"]  # 2 layers a stage
    per_collective = Counter(t.label.split(" step ")[0] for t in run.inputs.world.network.transfers)
    assert terms["FULL_BYTES_PER_RING_STEP"] == forwards * (tp - 1)
    assert [per_collective[name] for name in LAYER_COLLECTIVES] == [forwards * (tp - 1)] * 10


def test_a_full_run_above_the_memory_limit_is_refused_before_it_runs(monkeypatch, capsys):
    """paper-175b at 1,024 micro-batches without shortcuts: 64 ranks x 12 layers x 1,024
    micro-batches = 786,432 rank-steps, each its ledger and 7 ring steps (about 43 GB, above
    8 GiB) is refused even under --force, one line, exit 2; the representative's estimate of the
    same scenario is below the limit (the full side alone refuses it)."""
    def never(*args, **kwargs):
        raise AssertionError("a refused run must not simulate")
    monkeypatch.setattr(run_command, "simulate_iteration", never)
    argv = ["scenarios/paper-175b.toml", "--global-batch-size", "1024"]
    rc = main(["run", *argv, "--no-shortcuts", "--force"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith("error: work: meta mode would keep about ") and "above the limit" in err
    check_work(load_scenario(argv[0], {("parallel", "global_batch_size"): 1024}), force=True)
