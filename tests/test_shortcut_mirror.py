"""DualPipe's mirror pairs as owners of traffic (docs/shortcuts.md, "The traffic and its links";
docs/dualpipe.md): each stage's gradients are summed with its mirror's (p-1-pp) after the DP
reduction, a ring whose PXN relays cross NVLink ports that overlapped DP rings and pipeline
sends of the end stages still use; with the pairs listed the shortcuts equal the full
simulation (Shortcuts()) to 1e-9."""

import pytest

from simsp.metrics.collect import collect
from simsp.scenario.loading import load_scenario
from simsp.shortcuts.check import Shortcuts
from simsp.shortcuts.traffic import mirror_owners
from simsp.training.driver.iteration import simulate_iteration


def dualpipe_dense(gpn: int, p: int, d: int):
    """A 2p-layer model of hidden 96 (12 heads, 48 tokens) under DualPipe, t 1, 2p micro-batches
    per replica, overlapped DP reduction, distributed optimizer, on ceil(p·d / gpn) nodes."""
    parallel = {"pipeline_model_parallel_size": p, "data_parallel_size": d,
                "global_batch_size": 2 * p * d, "schedule": "dualpipe",
                "overlap_grad_reduce": True, "distributed_optimizer": True,
                "ddp_bucket_size": 20_000}
    overrides = {("model", "num_layers"): 2 * p, ("model", "hidden_size"): 96,
                 ("model", "num_attention_heads"): 12, ("model", "seq_length"): 48,
                 ("model", "vocab_size"): 256, ("run", "mode"): "meta",
                 ("cluster", "gpus_per_node"): gpn, ("cluster", "nodes"): -(-p * d // gpn)}
    overrides.update({("parallel", k): v for k, v in parallel.items()})
    return load_scenario(None, overrides)


def test_mirror_owners_pair_the_middle_stages():
    """Pipeline groups (stage order) of p 4 and p 6: stage i with stage p-1-i for 0 < i <
    p-1-i; the ends' pair is the embedding owner already, and p 2 has none."""
    assert mirror_owners([(0, 2, 4, 6), (1, 3, 5, 7)]) == [("mirror", (2, 4)),
                                                           ("mirror", (3, 5))]
    assert mirror_owners([(0, 1, 2, 3, 4, 5)]) == [("mirror", (1, 4)), ("mirror", (2, 3))]
    assert mirror_owners([(0, 8)]) == []


@pytest.mark.parametrize("gpn, p, d", [(4, 4, 2), (8, 4, 4)])
def test_dualpipe_mirror_pairs_equal_the_full_simulation(gpn, p, d):
    """p 4 (rank = dp + d·pp): mirror (d, 2d) relays through GPUs of stages 0 and 3 (PXN),
    whose NVLink ports their overlapped DP rings and sends use meanwhile: step by step; timed
    alone the run came out 2.9e-4 (d 2) and 6.5e-4 (d 4) fast."""
    sc = dualpipe_dense(gpn, p, d)
    fast = Shortcuts.for_scale(sc)
    assert dict(fast.methods)[(d, 2 * d)] == "step_by_step"  # stage 1's rank 0 and stage 2's
    mine = collect(simulate_iteration(sc, fast, trace="none"), fast)
    full = collect(simulate_iteration(sc, Shortcuts(), trace="none"), Shortcuts())
    assert mine["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-9)
    for stage, other in zip(mine["exposed_s_per_stage"], full["exposed_s_per_stage"]):
        for kind, seconds in other.items():
            assert stage[kind] == pytest.approx(seconds, rel=1e-9, abs=1e-15), kind
