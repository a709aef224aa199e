"""The quotient by rail symmetry with stepwise EP groups (docs/shortcuts.md, "Rail symmetry with
expert all-to-alls", "Under the quotient"): each EP group's all-to-all runs as the pairs its
simulated members send (one per orbit of its pairs) on the orbits' links, its token-count
all-gather as its ring piece; equal to the full simulation (Shortcuts()) to 1e-9."""

from dataclasses import replace

import pytest

from simsp.cluster.grid import RankGrid
from simsp.cluster.topology import build_topology, nodes_hosting
from simsp.metrics.collect import collect
from simsp.scenario.loading import load_scenario
from simsp.scenario.work import MetaWork, VerdictCounts, check_work, meta_seconds
from simsp.shortcuts.check import Shortcuts
from simsp.shortcuts.rail_symmetry import stage_axes, symmetry_breach
from simsp.shortcuts.traffic import expert_owners, traffic_owners
from simsp.shortcuts.work_counts import estimated_counts, run_seconds
from simsp.training.driver.iteration import simulate_iteration


def moe_layout(schedule: str, gpn: int, t: int, d: int, ep: int, **parallel):
    """p 2, t·d ranks a stage on `gpn`-GPU nodes, EP `ep` (ETP 1), overlapped DP reduction; a
    4-layer MoE of hidden 1024 (8 experts, top 2: uniform routing), s 2048; 2 GB/s NICs so
    that pipeline sends, all-to-alls and DP rings meet; 2 micro-batches per replica unless
    `parallel` says otherwise."""
    model = {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 4, "seq_length": 2048,
             "vocab_size": 256, "ffn_hidden_size": 2048, "add_bias_linear": False,
             "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 1024,
             "swiglu": True, "normalization": "RMSNorm", "position_embedding_type": "rope"}
    layout = {"tensor_model_parallel_size": t, "sequence_parallel": t > 1,
              "pipeline_model_parallel_size": 2, "data_parallel_size": d,
              "expert_model_parallel_size": ep, "expert_tensor_parallel_size": 1,
              "moe_token_dispatcher_type": "alltoall", "moe_grouped_gemm": True,
              "micro_batch_size": 1, "global_batch_size": 2 * d, "schedule": schedule,
              "distributed_optimizer": True, "overlap_grad_reduce": True,
              "ddp_bucket_size": 2_000_000, **parallel}
    overrides = {("model", k): v for k, v in model.items()}
    overrides.update({("parallel", k): v for k, v in layout.items()})
    overrides.update({("cluster", "gpus_per_node"): gpn, ("cluster", "nodes"): 2 * t * d // gpn,
                      ("cluster", "ib_bandwidth_GBps"): 2.0, ("run", "mode"): "meta"})
    return load_scenario(None, overrides)


def _metrics(sc, shortcuts: Shortcuts) -> dict:
    return collect(simulate_iteration(sc, shortcuts, trace="none"), shortcuts)


def assert_equal_to_full(sc, fast: Shortcuts) -> dict:
    """Iteration time and every stage's exposure (each kind) equal to the full simulation's to
    1e-9; returns the full simulation's metrics."""
    mine, full = _metrics(sc, fast), _metrics(sc, Shortcuts())
    assert mine["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-9)
    for stage, other in zip(mine["exposed_s_per_stage"], full["exposed_s_per_stage"]):
        for kind, seconds in other.items():
            assert stage[kind] == pytest.approx(seconds, rel=1e-9, abs=1e-15), kind
    return full


def test_the_token_count_ring_refuses_the_tp_shift():
    """1F1B, t2 d4 EP 4 on 4-GPU nodes (EP groups 0-3 and 4-7 of stage 0 on nodes 0 and 1):
    the DP rings of TP rank 1 cross the NVLink ports TP group (0, 1) uses, so only rail
    symmetry keeps a representative. The TP shift maps every EP group's pairs onto its pairs
    but its token-count all-gather's ring 0 -> 1 -> 2 -> 3 onto 1 -> 0 -> 3 -> 2, no hop of
    that ring: refused, so TP ranks 0 and 1 run (with the TP shift taken, before this check,
    a stage's exposure was 5.6e-4 off at 4 micro-batches a replica; DualPipe's alike). Each EP group runs its simulated members'
    2 x 3 pairs, on the links of GPU 0 (or 8) and 1 (or 9); equal to the full simulation."""
    sc = moe_layout("1f1b", 4, 2, 4, 4)
    fast = Shortcuts.for_scale(sc)
    symmetry = fast.symmetry
    assert symmetry.ranks == (0, 1, 8, 9) and symmetry.loads == {}
    assert symmetry.link_reps[("gpu7", "leaf0/rail3")] == ("gpu1", "leaf0/rail1")
    assert (0, 1, 2, 3) in symmetry.pieces
    assert symmetry.pair_orbits[(0, 1, 2, 3)] == tuple(
        (a, b, ()) for a in (0, 1) for b in (0, 1, 2, 3) if b != a)
    assert estimated_counts(sc, fast).ep_pairs == 6.0
    graph = build_topology(sc.cluster, nodes_hosting(range(16), 4))
    grid = RankGrid(2, 2, 4, 1)
    owners = traffic_owners(grid, False) + expert_owners(sc)
    tp_shift = stage_axes(grid, 4).shift(16, (1, 0, 0))
    why = symmetry_breach(graph, tp_shift, owners, frozenset(o[1] for o in owners))
    assert why == "maps the token-count ring of ep (0, 1, 2, 3) onto other hops than its image's"
    assert_equal_to_full(sc, fast)


def test_expert_groups_across_a_leaf_boundary(monkeypatch):
    """d = EP 8 on 2-GPU nodes under ZB-H1, leaves of 2 nodes: stage 0 (nodes 0-3) spans leaves
    {0, 1} and {2, 3}, and a node shift by one would move the EP pair 0 -> 2 (one leaf) onto
    2 -> 4 (across the spine): refused with the group named; by two every pair keeps its class,
    so ranks 0 and 2 of each stage run the quotient, equal to the full simulation."""
    from simsp.hardware import cluster_hardware

    monkeypatch.setattr(cluster_hardware, "DEFAULT", replace(cluster_hardware.DEFAULT, nodes_per_leaf=2))
    sc = moe_layout("zb-h1", 2, 1, 8, 8)
    fast = Shortcuts.for_scale(sc)
    assert fast.symmetry.ranks == (0, 2, 8, 10) and fast.symmetry.link_reps
    assert "moves ep (0, 1, 2, 3) onto a route of another class" in dict(
        fast.reasons)["representative"]
    assert estimated_counts(sc, fast).ep_pairs == 2 * 7  # 2 simulated members x 7 peers
    assert_equal_to_full(sc, fast)


def test_dropping_one_gpus_orbit_links_moves_the_run():
    """ZB-H1, p 4, d = EP 4 on 2-GPU nodes: stage 3's all-to-all runs as rank 12's pairs to
    13, 14, 15, each on the links of its orbit (GPU 12's NIC down stands for those of 12-15).
    With GPU 14's links standing for themselves, the pair 12 -> 14 no longer shares GPU 12's
    NIC down with the image of 12 -> 15 there: stage 3's exposed all-to-all moves by > 1%."""
    from test_rail_symmetry_experts import full_metrics, moe_scenario

    sc = moe_scenario("zb-h1")  # equal to the full simulation there (with the images)
    fast = Shortcuts.for_scale(sc)
    full = full_metrics("zb-h1", 16)
    reps = {link: rep for link, rep in fast.symmetry.link_reps.items() if "gpu14" not in link}
    bare = replace(fast, symmetry=replace(fast.symmetry, link_reps=reps))
    moved = _metrics(sc, bare)["exposed_s_per_stage"][3]["ep_comm"]
    assert abs(moved / full["exposed_s_per_stage"][3]["ep_comm"] - 1) > 1e-2


def test_the_work_check_takes_the_orbit_flows():
    """run's work check takes run_seconds (commands/run.py), which prices the all-to-alls by
    their orbit flows (WorkCounts.ep_pairs, passed by name: a float in the all-to-all counts'
    place raised TypeError) on top of the layer-steps alone."""
    sc = moe_layout("zb-h1", 2, 1, 8, 8)
    shortcuts = Shortcuts.for_scale(sc)
    assert estimated_counts(sc, shortcuts).ep_pairs is not None
    estimate = run_seconds(sc, shortcuts)
    no_all_to_all = VerdictCounts(a2a=(0, 0), ep_pairs=0.0)
    assert estimate > meta_seconds(sc, True, no_all_to_all)
    check_work(sc, shortcuts=True, meta=MetaWork(seconds=estimate))


def test_rail_shifts_permute_the_channels_of_a_ring_across_nodes():
    """d = EP 8 on 4-GPU nodes under DualPipe (DeepSeek-V3's stage scaled down: one rank per
    stage): NCCL's rotated channels of the DP (and token-count) ring 0-7 start at GPUs 0, 1, 2,
    3 of each node, and a rail shift maps channel c onto channel c + 1. Rank 0 sends 0 -> 1 in
    channels 0, 2, 3 and 0 -> 5 (through GPU 1) in channel 1; a hop stands on its image in the
    channel its shift maps its channel onto (before, channel 1's 1 -> 2, whose image 0 -> 1 is
    in three channels but its own, was ambiguous: the quotient was refused and every ring
    stepped whole, DeepSeek-V3's 2.06 million flows). Equal to the full simulation."""
    sc = moe_layout("dualpipe", 4, 1, 8, 8, global_batch_size=32)
    fast = Shortcuts.for_scale(sc)
    assert fast.symmetry.ranks == (0, 8) and fast.symmetry.link_reps
    piece = fast.symmetry.pieces[(0, 1, 2, 3, 4, 5, 6, 7)]
    assert piece.executed == ((0, 0), (2, 2), (3, 1), (1, 3))
    # (0, 0) waits on 7 -> 0 through GPU 4, moved by a node and a rail: channel 1's 0 -> 5;
    # (c, ·) for c = 2, 3, 1 on channel c's 3 -> 0, moved by a rail: channel c + 1's 0 -> 1
    assert piece.waits_on == (3, 2, 0, 1)
    assert_equal_to_full(sc, fast)
