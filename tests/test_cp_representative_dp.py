"""Context parallelism with d > 1 keeps TP rank 0's CP ranks of one DP replica per placement
on the leaves (shortcuts/representative.py cp_replicas): the other TP ranks are their images
under the TP shift (rails renamed), the other replicas under moves by whole leaves and a
renaming of rails, and no link may carry traffic of a simulated owner and of a left-out one at
once. Each layout is checked against the full simulation (Shortcuts(): every rank, every ring
step) to 1e-9 s in iteration time and every stage's exposure, and peaks equal (tiny models,
meta mode)."""

from dataclasses import replace

import pytest

import simsp.hardware.cluster_hardware as cluster_hardware
from simsp.metrics.collect import collect
from simsp.scenario.loading import load_scenario
from simsp.shortcuts.plan import simulated_ranks
from simsp.training.driver.iteration import Shortcuts, simulate_iteration


def cp_layout(gpn, t, cp, p, d, comm_type, overlap=False, interleaved=False, **cluster):
    """A 2p-layer flash model of hidden 96 (12 heads, 4 KV groups, 96 tokens), two
    micro-batches per replica, on ceil(t·cp·p·d / gpn) nodes (`cluster`: other [cluster]
    fields), meta mode."""
    world = t * cp * p * d
    parallel = {"tensor_model_parallel_size": t, "context_parallel_size": cp,
                "cp_comm_type": comm_type, "pipeline_model_parallel_size": p,
                "data_parallel_size": d, "global_batch_size": 2 * d,
                "overlap_grad_reduce": overlap, "distributed_optimizer": True,
                "ddp_bucket_size": 20_000, "sequence_parallel": t > 1}
    if interleaved:
        parallel["num_layers_per_virtual_pipeline_stage"] = 1
    overrides = {("model", "num_layers"): 2 * p, ("model", "hidden_size"): 96,
                 ("model", "num_attention_heads"): 12, ("model", "seq_length"): 96,
                 ("model", "group_query_attention"): True, ("model", "num_query_groups"): 4,
                 ("model", "attention_backend"): "flash", ("model", "vocab_size"): 256,
                 ("run", "mode"): "meta", ("cluster", "gpus_per_node"): gpn,
                 ("cluster", "nodes"): -(-world // gpn)}
    overrides.update({("parallel", k): v for k, v in parallel.items()})
    overrides.update({("cluster", k): v for k, v in cluster.items()})
    return load_scenario(None, overrides)


def metrics(sc, shortcuts):
    """The run's metrics under `shortcuts`."""
    return collect(simulate_iteration(sc, shortcuts, trace="none"), shortcuts)


def apart(mine, full) -> float:
    """The largest difference of iteration time and any stage's exposure (seconds)."""
    stages = zip(mine["exposed_s_per_stage"], full["exposed_s_per_stage"])
    return max([abs(mine["iteration_time_s"] - full["iteration_time_s"])]
               + [abs(a[kind] - b[kind]) for a, b in stages for kind in b])


def peaks(run_metrics) -> list[int]:
    """Every rank's memory peak, in rank order."""
    return [rank["peak_bytes"] for rank in run_metrics["ranks"]]


@pytest.fixture
def fabric(monkeypatch):
    """Set fields of the default fabric (hardware/fabric.py Fabric) for one test."""
    def set_fields(**fields):
        monkeypatch.setattr(cluster_hardware, "DEFAULT",
                            replace(cluster_hardware.DEFAULT, **fields))
    return set_fields


@pytest.mark.parametrize("gpn, t, cp, p, d, comm_type, interleaved, ranks", [
    # each replica one 4-GPU node (t·c = 4), CP pairs inside it: replica 0's TP rank 0
    (4, 2, 2, 2, 2, "p2p", False, (0, 2, 8, 10)),
    # a CP group of 4 over two 2-GPU nodes, Ulysses all-to-alls across nodes
    (2, 1, 4, 2, 2, "a2a", False, (0, 1, 2, 3, 8, 9, 10, 11)),
    # four replicas share an 8-GPU node (t·c = 2 of its 8 rails each): rails renamed
    (8, 1, 2, 1, 4, "allgather", False, (0, 1)),
    # interleaved, replicas of 4 GPUs two to a node, stages on whole nodes
    (8, 2, 2, 2, 4, "p2p", True, (0, 2, 16, 18)),
])
def test_one_replica_stands_for_the_others(gpn, t, cp, p, d, comm_type, interleaved, ranks):
    """Replicas moved onto replica 0 by whole nodes (or rails) inside one 20-node leaf: TP
    rank 0's CP ranks of replica 0 run (rank tp + t·cp_rank + t·c·dp + t·c·d·stage,
    hand-listed), equal to the full simulation to 1e-9 s, every rank's peak the same."""
    sc = cp_layout(gpn, t, cp, p, d, comm_type, interleaved=interleaved)
    fast = Shortcuts.for_scale(sc)
    assert fast.representative and simulated_ranks(sc, fast) == ranks
    mine, full = metrics(sc, fast), metrics(sc, Shortcuts())
    assert apart(mine, full) <= 1e-9
    assert peaks(mine) == peaks(full)


@pytest.mark.parametrize("p, comm_type, interleaved, ranks", [
    (1, "p2p", False, (0, 2, 4, 6)),
    (2, "p2p", False, (0, 2, 4, 6, 12, 14, 16, 18)),
    (2, "allgather", True, (0, 2, 4, 6, 12, 14, 16, 18)),
])
def test_a_replica_across_a_leaf_boundary_runs_too(fabric, p, comm_type, interleaved, ranks):
    """t2 c2 d3 on 2-GPU nodes and 3-node leaves: replica 0 holds nodes 0-1 (leaf 0), replica
    1 nodes 2-3, across the boundary (its CP pair 4 -> 6 climbs to the spine, replica 0's
    0 -> 2 does not), replica 2 nodes 4-5 (leaf 1, placed as replica 0): replicas 0 and 1 run
    (IB latency 20 µs, so the spine's hop shows), equal to the full simulation to 1e-9 s.
    With replica 0 alone the dp_cp rings start when replica 0 arrives, before replica 1 in
    the full simulation: 0.48 ms (p 1) short, so the test can fail."""
    fabric(nodes_per_leaf=3)
    sc = cp_layout(2, 2, 2, p, 3, comm_type, interleaved=interleaved, ib_latency_us=20.0)
    fast = Shortcuts.for_scale(sc)
    assert fast.replicas == (0, 1) and simulated_ranks(sc, fast) == ranks
    assert "replicas 0, 1" in fast.why()["representative"]
    full = metrics(sc, Shortcuts())
    mine = metrics(sc, fast)
    assert apart(mine, full) <= 1e-9
    assert peaks(mine) == peaks(full)
    if comm_type == "p2p":  # dropping replica 1's image breaks it
        assert apart(metrics(sc, replace(fast, replicas=(0,))), full) > 1e-4


def test_a_replica_across_a_pod_boundary_runs_too(fabric):
    """t2 c2 d3 p2 on 2-GPU nodes, one node a leaf, pods of 3 leaves under a core (a core tier
    above 2 leaves): replica 1 holds nodes 2 (pod 0) and 3 (pod 1), so its CP pair 4 -> 6
    climbs to the core where replica 0's 0 -> 2 turns at its pod's spine; replica 2 (nodes 4-5,
    pod 1) is placed as replica 0. Replicas 0 and 1 run, equal to the full simulation to
    1e-9 s; replica 0 alone is 0.72 ms short."""
    fabric(nodes_per_leaf=1, two_tier_max_units=2, units_per_pod=3)
    sc = cp_layout(2, 2, 2, 2, 3, "p2p", ib_latency_us=20.0)
    fast = Shortcuts.for_scale(sc)
    assert fast.replicas == (0, 1)
    full = metrics(sc, Shortcuts())
    mine = metrics(sc, fast)
    assert apart(mine, full) <= 1e-9
    assert peaks(mine) == peaks(full)
    assert apart(metrics(sc, replace(fast, replicas=(0,))), full) > 1e-4


def test_overlapped_gradient_rings_meeting_left_out_replicas_are_refused():
    """t1 c2 d2 on 2-GPU nodes with --overlap-grad-reduce: the dp_cp ring (0, 1, 2, 3) of
    stage 0, simulated, may meet replica 1's pipeline send 6 -> 2 (left out) on GPU 2's NIC
    while the backward runs: refused, every rank runs; without the overlap the two are in turn
    and replica 0 stands for replica 1."""
    refused = Shortcuts.for_scale(cp_layout(2, 1, 2, 2, 2, "p2p", overlap=True))
    assert not refused.representative
    assert "leaf0/rail0->gpu2" in refused.why()["representative"]
    assert Shortcuts.for_scale(cp_layout(2, 1, 2, 2, 2, "p2p")).representative


def test_replicas_that_no_node_move_maps_are_refused():
    """t2 c3 d2 on 4-GPU nodes: a replica holds 6 GPUs (a node and a half), so replica 1
    starts mid-node and no move by whole nodes or renaming of rails takes it onto replica 0."""
    refused = Shortcuts.for_scale(cp_layout(4, 2, 3, 1, 2, "p2p"))
    assert not refused.representative
    assert "t*c = 6" in refused.why()["representative"]
