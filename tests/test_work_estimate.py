"""run's work estimate (simsp.scenario.work) against measured CPU time, along the axes where a term
other than layer-steps dominates: pipeline depth (every rank's plan lists every layer), TP
without shortcuts (every ring step of t ranks) and one-tensor gradient buckets. The estimate
is within a factor of FACTOR of the measurement either way (README "Limits")."""

import time

import pytest

from simsp.scenario.work import meta_bytes, meta_seconds
from simsp.scenario.loading import load_scenario
from simsp.training.driver.iteration import Shortcuts, simulate_iteration

FACTOR = 4
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
    "pipeline depth: L = p = 384, one micro-batch": (TINY, {("model", "num_layers"): 384,
        ("parallel", "pipeline_model_parallel_size"): 384, ("parallel", "global_batch_size"): 1,
        ("cluster", "nodes"): 48}, True),
    "TP without shortcuts: t = 64": (TINY, {("model", "num_layers"): 2,
        ("model", "num_attention_heads"): 64, ("parallel", "tensor_model_parallel_size"): 64,
        ("cluster", "nodes"): 8}, False),
    "one-tensor buckets: 22B width, d = 16": (WIDE, {("model", "num_layers"): 48,
        ("parallel", "data_parallel_size"): 16, ("parallel", "global_batch_size"): 16,
        ("parallel", "ddp_bucket_size"): 1, ("parallel", "overlap_grad_reduce"): True,
        ("cluster", "nodes"): 16}, True),
}


@pytest.mark.parametrize("case", CASES)
def test_estimate_is_within_a_factor_of_the_measured_time(case):
    base, layout, representative = CASES[case]
    sc = load_scenario(None, {**base, **layout})
    shortcuts = Shortcuts.for_scale(sc) if representative else Shortcuts()
    start = time.process_time()
    simulate_iteration(sc, shortcuts)
    measured = time.process_time() - start
    estimate = meta_seconds(sc, representative)
    assert measured / FACTOR <= estimate <= measured * FACTOR, (estimate, measured)


def test_pipeline_depth_memory_term():
    """L = p = 1024 at one micro-batch measured 1.5 GB (the plans); 4096 would need 24 GiB."""
    def scenario(p):
        return load_scenario(None, {**TINY, ("model", "num_layers"): p,
                                    ("parallel", "pipeline_model_parallel_size"): p,
                                    ("parallel", "global_batch_size"): 1,
                                    ("cluster", "nodes"): p // 8})
    assert 1.2e9 < meta_bytes(scenario(1024)) < 2.0e9
    assert meta_bytes(scenario(4096)) > 16 * meta_bytes(scenario(1024)) * 0.99


PAIRS = {  # the terms that grow with the square of a group (work.pair_seconds)
    "CP ring: cp = 64, s 4096": {("model", "num_layers"): 2, ("model", "seq_length"): 4096,
        ("model", "attention_backend"): "flash", ("parallel", "context_parallel_size"): 64,
        ("cluster", "nodes"): 8},
    "EP all-to-all: ep = d = 64": {("model", "num_layers"): 2, ("model", "seq_length"): 256,
        ("model", "add_bias_linear"): False, ("model", "num_experts"): 64,
        ("parallel", "expert_model_parallel_size"): 64, ("parallel", "data_parallel_size"): 64,
        ("parallel", "global_batch_size"): 64, ("parallel", "moe_token_dispatcher_type"):
        "alltoall", ("cluster", "nodes"): 8},
}


@pytest.mark.parametrize("case", PAIRS)
def test_group_squared_terms_within_a_factor_of_two(case):
    """Without the cp² and ep² terms the estimate was 3.7x (CP 64) and 800x (EP 64) below the
    measured time; with them it is within 2x either way (measured 0.72x and 0.83x: the EP
    all-to-alls here meet nothing, so they are timed alone once per stage, work._ep_exchanges)."""
    sc = load_scenario(None, {**TINY, **PAIRS[case]})
    start = time.process_time()
    simulate_iteration(sc, Shortcuts.for_scale(sc))
    measured = time.process_time() - start
    estimate = meta_seconds(sc, True)
    assert measured / 2 <= estimate <= measured * 2, (estimate, measured)
