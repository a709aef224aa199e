"""run's work estimate (simsp.scenario.work) against the work the simulation does, counted, along
the axes where a term other than layer-steps dominates: pipeline depth (every rank's plan lists
every layer), TP without shortcuts (every rank of a stage runs), one-tensor gradient buckets,
and the CP ring's pairs. The estimate's units (simulated ranks, layer-steps, buckets, rank pairs)
are compared with what the run counted; their CPU-time prices, and the estimate against measured
CPU time, are benchmarks/work_estimate.py's (a test must pass on a loaded machine)."""

import pytest

from simsp.scenario.work import (CP_SECONDS_PER_RANK_PAIR, bucket_count, layer_steps,
                                 meta_bytes, pair_seconds, simulated_ranks)
from simsp.scenario.loading import load_scenario
from simsp.training.driver.iteration import Shortcuts, simulate_iteration

TINY = {("model", "hidden_size"): 64, ("model", "num_attention_heads"): 4,
        ("model", "seq_length"): 32, ("model", "vocab_size"): 128, ("run", "mode"): "meta"}
WIDE = {("model", "hidden_size"): 6144, ("model", "num_attention_heads"): 64,
        ("model", "seq_length"): 2048, ("model", "vocab_size"): 51200, ("run", "mode"): "meta",
        ("parallel", "tensor_model_parallel_size"): 8, ("parallel", "sequence_parallel"): True,
        ("parallel", "recompute_granularity"): "selective"}
CASES = {
    "layer-steps: 22B width, L48 p4 m32": (WIDE, {("model", "num_layers"): 48,
        ("parallel", "pipeline_model_parallel_size"): 4, ("parallel", "global_batch_size"): 32,
        ("cluster", "nodes"): 4}, True),
    "pipeline depth: L = p = 256, one micro-batch": (TINY, {("model", "num_layers"): 256,
        ("parallel", "pipeline_model_parallel_size"): 256, ("parallel", "global_batch_size"): 1,
        ("cluster", "nodes"): 32}, True),
    "TP without shortcuts: t = 64": (TINY, {("model", "num_layers"): 2,
        ("model", "num_attention_heads"): 64, ("parallel", "tensor_model_parallel_size"): 64,
        ("cluster", "nodes"): 8}, False),
    "one-tensor buckets: 22B width, d = 16": (WIDE, {("model", "num_layers"): 48,
        ("parallel", "data_parallel_size"): 16, ("parallel", "global_batch_size"): 16,
        ("parallel", "ddp_bucket_size"): 1, ("parallel", "overlap_grad_reduce"): True,
        ("cluster", "nodes"): 16}, True),
}


@pytest.mark.parametrize("case", CASES)
def test_estimate_counts_the_ranks_layer_steps_and_buckets_the_run_simulates(case):
    base, layout, representative = CASES[case]
    sc = load_scenario(None, {**base, **layout})
    shortcuts = Shortcuts.for_scale(sc) if representative else Shortcuts()
    run = simulate_iteration(sc, shortcuts, trace="none")
    ranks = sorted(run.results.end_s)
    assert simulated_ranks(sc, representative) == len(ranks)
    per_stage = len(ranks) // sc.parallel.pp  # ranks each stage simulates
    forwards = sum(len(run.inputs.plans[r].layers(chunk))  # a forward step runs its chunk's layers
                   for r in ranks for kind, _, chunk, *_ in run.results.steps[r] if kind == "F")
    assert layer_steps(sc) == forwards // per_stage
    if sc.parallel.dp > 1:  # 12 tensors per layer and 3 more (a lone stage also holds the
        built = len(run.states[ranks[0]].ddp_buckets.buckets)  # position table: one more)
        assert bucket_count(sc) <= built <= bucket_count(sc) + 1, (bucket_count(sc), built)


def test_pipeline_depth_memory_term():
    """L = p = 1024 at one micro-batch measured 150 MB of peak RSS above the loaded scenario (the
    plans; benchmarks/estimate_constants.py's bytes measure, 2026-11-29; 1.5 GB on the engine of
    2026-11-28): the estimate within 2x above it, and 16x that at L = p = 4096."""
    def scenario(p):
        return load_scenario(None, {**TINY, ("model", "num_layers"): p,
                                    ("parallel", "pipeline_model_parallel_size"): p,
                                    ("parallel", "global_batch_size"): 1,
                                    ("cluster", "nodes"): p // 8})
    assert 1.5e8 < meta_bytes(scenario(1024)) < 3.0e8
    assert meta_bytes(scenario(4096)) > 15 * meta_bytes(scenario(1024))  # the plans' p²


PAIRS = {  # the terms that grow with the square of a group (work.pair_seconds); their CPU time
    # against the estimate is benchmarks/work_estimate.py's
    "CP ring: cp = 64, s 4096": {("model", "num_layers"): 2, ("model", "seq_length"): 4096,
        ("model", "attention_backend"): "flash", ("parallel", "context_parallel_size"): 64,
        ("cluster", "nodes"): 8},
    "EP all-to-all: ep = d = 64": {("model", "num_layers"): 2, ("model", "seq_length"): 256,
        ("model", "add_bias_linear"): False, ("model", "num_experts"): 64,
        ("parallel", "expert_model_parallel_size"): 64, ("parallel", "data_parallel_size"): 64,
        ("parallel", "global_batch_size"): 64, ("parallel", "moe_token_dispatcher_type"):
        "alltoall", ("cluster", "nodes"): 8},
}


@pytest.mark.parametrize("cp, t, d, layers, batch", [(2, 1, 1, 2, 1), (8, 1, 1, 2, 1),
                                                      (4, 2, 2, 4, 4)])
def test_the_cp_ring_exchanges_grow_with_the_pairs_of_its_ranks(cp, t, d, layers, batch):
    """The CP pair term (work.pair_seconds) prices cp² exchanges per layer-step and (t, d) CP
    group: the run sends, per rank, cp − 1 K/V blocks forward and cp backward (K/V, then
    dK/dV), i.e. cp·(2cp − 1) transfers per group, counted on the network (every rank run:
    the term prices the run without the CP representative)."""
    sc = load_scenario(None, {**TINY, ("model", "num_layers"): layers,
                              ("model", "seq_length"): 128, ("model", "attention_backend"): "flash",
                              ("parallel", "context_parallel_size"): cp,
                              ("parallel", "tensor_model_parallel_size"): t,
                              ("parallel", "data_parallel_size"): d,
                              ("parallel", "global_batch_size"): batch, ("cluster", "nodes"): 2})
    run = simulate_iteration(sc, Shortcuts(), trace="none")
    sent = sum(tr.label.startswith("cp ") for tr in run.inputs.world.network.transfers)
    assert sent == layer_steps(sc) * t * d * cp * (2 * cp - 1)
    pairs = layer_steps(sc) * t * d * cp ** 2
    assert pair_seconds(sc) == pytest.approx(pairs * CP_SECONDS_PER_RANK_PAIR, rel=1e-12)
