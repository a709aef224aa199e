"""A p2p CP ring's sends timed in arithmetic where the plan keeps them alone on their links
(training/context_parallel/lone_ring.py) equal the full simulation (`Shortcuts()`: every send a
fair-shared flow) to 1e-9 s in iteration time and every stage's exposure, on layouts that
stress it; a wrong lone time fails the same comparison."""

import pytest

from simsp.metrics.collect import collect
from simsp.training.context_parallel import lone_ring
from simsp.scenario.loading import load_scenario
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
from tests.test_cp_shortcuts import exposures_apart


def cp_scenario(gpn, t, cp, p, d, comm_type, interleaved=False, overlap=False, seq=512):
    """tests/test_cp_shortcuts.py's tiny flash model (hidden 96, 12 heads, 4 KV groups) of
    2p layers (4p interleaved, 2 a chunk) and `seq` tokens, meta mode, on links slow enough
    (2 GB/s InfiniBand, 4 GB/s NVLink) that the ring's sends outlast its block compute and
    show in the iteration; a2a+p2p as 2 x cp/2."""
    world = t * cp * p * d
    parallel = {"tensor_model_parallel_size": t, "context_parallel_size": cp,
                "cp_comm_type": comm_type, "pipeline_model_parallel_size": p,
                "data_parallel_size": d, "global_batch_size": 4 * d,
                "distributed_optimizer": True, "sequence_parallel": t > 1,
                "overlap_grad_reduce": overlap, "ddp_bucket_size": 20_000}
    if comm_type == "a2a+p2p":
        parallel["hierarchical_context_parallel_sizes"] = [2, cp // 2]
    if interleaved:
        parallel["num_layers_per_virtual_pipeline_stage"] = 2
    overrides = {("model", "num_layers"): (4 if interleaved else 2) * p,
                 ("model", "hidden_size"): 96, ("model", "num_attention_heads"): 12,
                 ("model", "seq_length"): seq, ("model", "group_query_attention"): True,
                 ("model", "num_query_groups"): 4, ("model", "attention_backend"): "flash",
                 ("model", "vocab_size"): 256, ("run", "mode"): "meta",
                 ("cluster", "gpus_per_node"): gpn, ("cluster", "nodes"): -(-world // gpn),
                 ("cluster", "ib_bandwidth_GBps"): 2.0, ("cluster", "nvlink_bandwidth_GBps"): 4.0}
    overrides.update({("parallel", k): v for k, v in parallel.items()})
    return load_scenario(None, overrides)


def _fast_and_full(sc):
    """(fast metrics, full metrics, the lone rings the fast run used)."""
    fast = Shortcuts.for_scale(sc)
    run = simulate_iteration(sc, fast, trace="none")
    lone = [v for k, v in run.inputs.world.cp_rings.items() if k[0] == "lone" and v]
    full = simulate_iteration(sc, Shortcuts(), trace="none")
    assert not [k for k, v in full.inputs.world.cp_rings.items() if k[0] == "lone" and v]
    return collect(run, fast), collect(full, Shortcuts()), lone


LAYOUTS = [  # gpn, t, cp, p, d, comm_type, interleaved, overlapped DP, lone rings expected
    (4, 4, 2, 2, 1, "p2p", False, False, 2),  # CP pairs across nodes, each TP group a node
    (2, 2, 4, 2, 1, "p2p", True, False, 2),  # CP 4 over four nodes, TP and PP interleaved
    (4, 1, 4, 2, 1, "p2p", False, False, 2),  # CP 4 inside a node (NVLink), two stages
    (2, 1, 4, 1, 1, "a2a+p2p", False, False, 0),  # hierarchical: its rings stay flows
    # d 2: the CP representative (shortcuts/representative.py cp_replicas) runs replica 0's
    # TP rank 0, one CP pair per stage; dp_cp groups in a node
    (8, 2, 2, 2, 2, "p2p", False, False, 2),
    # d 3: a stage's 12 ranks do not fill whole nodes, so every rank runs: t·d = 6 CP pairs
    (8, 2, 2, 1, 3, "p2p", False, False, 6),
    (8, 2, 2, 2, 2, "p2p", False, True, 0),  # overlapped DP meets the CP groups: flows
]


@pytest.mark.parametrize("gpn, t, cp, p, d, comm_type, interleaved, overlap, rings", LAYOUTS)
def test_lone_ring_equals_full_simulation(gpn, t, cp, p, d, comm_type, interleaved, overlap,
                                          rings):
    sc = cp_scenario(gpn, t, cp, p, d, comm_type, interleaved, overlap)
    fast, full, lone = _fast_and_full(sc)
    assert len(lone) == rings
    assert exposures_apart(fast, full) <= 1e-9


def test_a_wrong_lone_time_fails(monkeypatch):
    """Sends 1% slower than their lone rate move the iteration past the tolerance."""
    sc = cp_scenario(4, 4, 2, 2, 1, "p2p")
    drain = lone_ring.LoneRing.drain_s  # both send's and the ring pass's (ring_pass.py)

    def slow(nbytes, rate_Bps):
        return drain(int(nbytes * 1.01), rate_Bps)

    monkeypatch.setattr(lone_ring.LoneRing, "drain_s", staticmethod(slow))
    fast, full, lone = _fast_and_full(sc)
    assert lone and exposures_apart(fast, full) > 1e-9


def test_pairs_that_share_a_link_are_refused():
    """A ring whose neighbour pairs of one direction meet on a link (here 0 -> 1 twice: each at
    half its lone rate together) is refused; CP pair (0, 1) across NVLink is not."""
    sc = cp_scenario(4, 1, 4, 1, 1, "p2p")
    network = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none").inputs.world.network
    assert lone_ring.LoneRing(network, (0, 1)).routes.keys() == {(0, 1), (1, 0)}
    with pytest.raises(ValueError, match="shares a link"):
        lone_ring.LoneRing(network, (0, 1, 0, 1))
