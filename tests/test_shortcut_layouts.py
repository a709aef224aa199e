"""The fast path (Shortcuts.for_scale) equals the full simulation (--no-shortcuts) on random
layouts that share links: 2, 4 and 8 GPUs per node, t·d not a multiple of them, 1F1B and
interleaved, overlapped gradient reduction (and pipeline transfers, interleaved), distributed
optimizer (tiny models)."""

from hypothesis import given, settings, strategies as st
import pytest

from simsp.engine.group_timing import NODE_PIECE, STEP_BY_STEP
from simsp.scenario.loading import load_scenario
from simsp.metrics.collect import collect
from simsp.shortcuts.check import Shortcuts
from simsp.training.driver.iteration import simulate_iteration


def layout_scenario(gpn, t, p, d, interleaved, overlap, distributed, m, **cluster):
    """A 2p-layer model of hidden 96 (12 heads, 48 tokens) on ceil(t·p·d / gpn) nodes, meta mode
    (`cluster`: other [cluster] fields)."""
    world = t * p * d
    parallel = {"tensor_model_parallel_size": t, "pipeline_model_parallel_size": p,
                "data_parallel_size": d, "global_batch_size": d * m,
                "overlap_grad_reduce": overlap, "distributed_optimizer": distributed,
                "ddp_bucket_size": 20_000, "sequence_parallel": t > 1}
    if interleaved:
        parallel["num_layers_per_virtual_pipeline_stage"] = 1
        parallel["overlap_p2p_communication"] = overlap
    overrides = {("model", "num_layers"): 2 * p, ("model", "hidden_size"): 96,
                 ("model", "num_attention_heads"): 12, ("model", "seq_length"): 48,
                 ("model", "vocab_size"): 256, ("run", "mode"): "meta",
                 ("cluster", "gpus_per_node"): gpn, ("cluster", "nodes"): -(-world // gpn)}
    overrides.update({("parallel", k): v for k, v in parallel.items()})
    overrides.update({("cluster", k): v for k, v in cluster.items()})
    return load_scenario(None, overrides)


def fast_and_full(sc):
    """Metrics of the fast path and of the full simulation."""
    fast = Shortcuts.for_scale(sc)
    return (collect(simulate_iteration(sc, fast, trace="none"), fast),
            collect(simulate_iteration(sc, Shortcuts(), trace="none"), Shortcuts()))


def assert_same(fast, full):
    """Iteration time and every stage's exposure (each kind) within 1%."""
    t_iter = full["iteration_time_s"]
    assert fast["iteration_time_s"] == pytest.approx(t_iter, rel=0.01)
    for mine, theirs in zip(fast["exposed_s_per_stage"], full["exposed_s_per_stage"]):
        for kind, seconds in theirs.items():
            assert mine[kind] == pytest.approx(seconds, rel=0.01, abs=1e-4 * t_iter), kind


def test_uneven_data_parallel_groups_share_nics():
    """t4 p2 d3 on 8-GPU nodes: the two stages' DP all-reduces share node 1's NICs (PXN);
    timed alone in closed form they were 23% too fast (16.35 ms against 21.34 ms, before
    NCCL's protocol choice)."""
    sc = load_scenario(None, {("model", "num_layers"): 4, ("model", "hidden_size"): 2048,
                              ("model", "num_attention_heads"): 16, ("model", "seq_length"): 1024,
                              ("run", "mode"): "meta", ("cluster", "nodes"): 3,
                              ("parallel", "tensor_model_parallel_size"): 4,
                              ("parallel", "pipeline_model_parallel_size"): 2,
                              ("parallel", "data_parallel_size"): 3,
                              ("parallel", "global_batch_size"): 12})
    fast, full = fast_and_full(sc)
    assert_same(fast, full)
    assert fast["shortcuts_used"]["representative"].startswith("not used: ")


@settings(max_examples=10, deadline=None)
@given(gpn=st.sampled_from([2, 4, 8]), t=st.sampled_from([1, 2, 3, 4]),
       p=st.integers(1, 3), d=st.integers(1, 3), interleaved=st.booleans(),
       overlap=st.booleans(), distributed=st.booleans())
def test_fast_path_equals_full_simulation(gpn, t, p, d, interleaved, overlap, distributed):
    """Whatever the layout, the shortcuts the fast path takes leave time and exposure within
    1% of simulating every rank and every ring step."""
    interleaved = interleaved and p > 1
    sc = layout_scenario(gpn, t, p, d, interleaved, overlap, distributed, 2 * p)
    assert_same(*fast_and_full(sc))


def test_paper_layouts_keep_every_shortcut():
    """K22's layouts (a TP group fills a node, DP over whole nodes) share no link a shortcut
    depends on: one rank per stage, every collective in closed form, templates."""
    from simsp.shortcuts.check import check_shortcuts

    for name, overrides in [("paper-175b", {}), ("paper-530b", {}),
                            ("paper-1t", {("parallel", "data_parallel_size"): 2,
                                          ("parallel", "global_batch_size"): 1024,
                                          ("cluster", "nodes"): 128})]:
        verdict = check_shortcuts(load_scenario(f"scenarios/{name}.toml", overrides))
        assert (verdict.representative, verdict.closed_form, verdict.templates) == \
            (True, True, True) and not verdict.groups(STEP_BY_STEP, NODE_PIECE), name


def test_groups_sharing_a_nic_run_stepwise():
    """t2 d3 p2 on 4-GPU nodes: stage 0 (GPUs 0-5) and stage 1 (6-11) both use node 1; the
    DP ring of stage 0 (0, 2, 4) relays its hop 2 -> 4 through GPU 0's NVLink port (PXN),
    which TP group (0, 1) uses while the overlapped gradient reduction runs, so its
    collectives run step by step, and one rank cannot stand for a stage."""
    from simsp.shortcuts.check import check_shortcuts

    verdict = check_shortcuts(layout_scenario(4, 2, 2, 3, False, True, False, 4))
    assert (0, 2, 4) in verdict.groups(STEP_BY_STEP) and not verdict.representative
    assert dict(verdict.reasons)["representative"].startswith("not used: ranks per stage")


def test_mirrored_clashes_keep_one_rank_per_stage():
    """t2 d3 p2 on 2-GPU nodes with overlapped gradient reduction: every DP ring meets the
    pipeline transfers of each replica on that replica's NIC, the representative's included, so
    one rank per stage still stands for all while the rings run step by step: exact."""
    sc = layout_scenario(2, 2, 2, 3, False, True, False, 4)
    shortcuts = Shortcuts.for_scale(sc)
    assert shortcuts.representative and (0, 2, 4) in shortcuts.groups(STEP_BY_STEP)
    fast, full = fast_and_full(sc)
    assert fast["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-9)


def test_rings_sharing_ports_only_among_their_channels_are_timed_alone():
    """d = 16 on two 8-GPU nodes, NVLink-bound (InfiniBand at 100 GB/s): NCCL's 8 rail channels
    put 8 hops of unequal latency on every NVLink port, so the closed form would be 4-18% slow,
    but no other traffic shares them: the fast path times each collective as its ring alone
    (engine/collectives/ring_alone.py, one node's piece of one channel step by step), equal to the full
    simulation, with no group run step by step."""
    sc = layout_scenario(8, 1, 1, 16, False, True, True, 1, ib_bandwidth_GBps=100.0)
    shortcuts = Shortcuts.for_scale(sc)
    assert shortcuts.representative and not shortcuts.groups(STEP_BY_STEP, NODE_PIECE)
    fast, full = fast_and_full(sc)
    assert fast["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-9)


def overlapped_scenario(gpn, t, p, d, interleaved, hidden=1024, seq=512):
    """A 2p-layer model big enough that DP buckets overlap the TP collectives of the backward
    pass (overlapped reduction and parameter gather, distributed optimizer)."""
    sc = layout_scenario(gpn, t, p, d, interleaved, True, True, 2 * p)
    from dataclasses import replace
    return replace(sc, model=replace(sc.model, hidden_size=hidden, num_attention_heads=16,
                                     seq_length=seq, vocab_size=1024),
                   parallel=replace(sc.parallel, ddp_bucket_size=2_000_000,
                                    overlap_param_gather=True))


def test_rail_symmetric_stages_keep_one_rank_and_one_hop_per_orbit():
    """t2 p2 d4 interleaved on 4-GPU nodes: DP rings of every TP rank overlap TP collectives on
    the NVLink ports, so one rank stands for its stage only as the quotient by the stage's rail
    symmetry (shortcuts/quotient.py): every ring runs as the hops its simulated member sends
    (the DP ring of GPUs 0, 2, 4, 6: its two channels' hops from GPU 0), every link as its
    orbit's link of GPU 0 or 8. Equal to the full simulation; with GPU 2's links standing for
    themselves (the images of one hop dropped) stage exposures move by > 1%."""
    from dataclasses import replace

    sc = overlapped_scenario(4, 2, 2, 4, True)
    fast = Shortcuts.for_scale(sc)
    assert fast.representative and fast.symmetry is not None
    assert fast.symmetry.ranks == (0, 8)  # node and rail shifts: one rank per stage
    # the ring order 0 2 4 6 on nodes {0, 1}: channel 0 sends 0 -> 2, channel 1 (rotated) 0 -> 4
    assert fast.symmetry.pieces[(0, 2, 4, 6)].executed == ((0, 0), (1, 1))
    assert fast.symmetry.pieces[(0, 1)].executed == ((0, 0),)  # TP: rank 0's hop of 2
    mine, full = fast_and_full(sc)
    assert mine["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-9)
    for a, b in zip(mine["exposed_s_per_stage"], full["exposed_s_per_stage"]):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-15)
    reps = {link: rep for link, rep in fast.symmetry.link_reps.items() if "gpu2" not in link}
    bare = replace(fast, symmetry=replace(fast.symmetry, link_reps=reps))
    unloaded = collect(simulate_iteration(sc, bare, trace="none"), bare)
    assert max(abs(a[k] / b[k] - 1) for a, b in zip(unloaded["exposed_s_per_stage"],
                                                    full["exposed_s_per_stage"])
               for k in b if b[k]) > 1e-2


def test_node_shifts_stop_at_a_leaf_boundary():
    """t2 p2 d22 on 4-GPU nodes: stage 1 spans nodes 11-21 across the leaf boundary at node 20,
    where a shift by whole nodes would move a hop from one leaf to two: rails alone are
    symmetric, so one rank per node and stage runs (22), equal to the full simulation."""
    sc = overlapped_scenario(4, 2, 2, 22, False, hidden=512, seq=256)
    fast = Shortcuts.for_scale(sc)
    assert fast.symmetry is not None and len(fast.symmetry.ranks) == 22
    mine, full = fast_and_full(sc)
    assert mine["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-9)


@pytest.mark.parametrize("per_leaf, d, ranks, refused", [
    # 4 nodes a stage on leaves of 2: rings 0-1|2-3 cross a spine twice, every pair 0->4 ... 3->7
    # crosses one: a shift by one node keeps both (the ring's channel, the pairs' class)
    (2, 8, (0, 16), ""),
    # 3 nodes a stage on leaves of 4: the pair 0 -> 3 stays on leaf 0, 1 -> 4 crosses the spine
    (4, 6, (0, 4, 8, 12, 16, 20), "moves p2p (0, 12) onto a route of another class")])
def test_node_shifts_across_leaves_keep_route_classes(monkeypatch, per_leaf, d, ranks, refused):
    """Stages across scalable units (leaves of `per_leaf` nodes): a node shift that moves a DP
    ring's spine crossing along the ring keeps its channel's hop routes, so its step latency
    (NCCL's pipelined latency), and is kept where every pipeline pair keeps its route class;
    refused, with the pair named, where one does not. Equal to the full simulation."""
    from dataclasses import replace
    import simsp.hardware.cluster_hardware as cluster_hardware

    monkeypatch.setattr(cluster_hardware, "DEFAULT", replace(cluster_hardware.DEFAULT, nodes_per_leaf=per_leaf))
    sc = overlapped_scenario(4, 2, 2, d, False, hidden=512, seq=256)
    fast = Shortcuts.for_scale(sc)
    assert fast.symmetry is not None and fast.symmetry.ranks == ranks
    assert refused in dict(fast.reasons)["representative"]
    mine, full = fast_and_full(sc)
    assert mine["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-9)
    for a, b in zip(mine["exposed_s_per_stage"], full["exposed_s_per_stage"]):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-15)


def test_te_userbuffers_exchanges_run_one_pair_per_orbit():
    """t2 p2 d4 interleaved with --tp-comm-overlap: TE's exchanges run as all-to-alls of the TP
    group; under the quotient only the present member's pairs run (the absent one's are their
    images): equal to the full simulation (0.38% slow with every member's pairs on the
    orbits' links)."""
    from dataclasses import replace

    sc = overlapped_scenario(4, 2, 2, 4, True)
    sc = replace(sc, parallel=replace(sc.parallel, tp_comm_overlap=True))
    fast = Shortcuts.for_scale(sc)
    assert fast.symmetry.ranks == (0, 8) and fast.symmetry.pieces and fast.symmetry.link_reps
    mine, full = fast_and_full(sc)
    assert mine["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-9)
    for a, b in zip(mine["exposed_s_per_stage"], full["exposed_s_per_stage"]):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-15)


def test_a_dp_ring_whose_hops_repeat_across_channels_equals_the_full_simulation():
    """t2 SP d8 on two 8-GPU nodes with TE's overlap (GPT-3 20B's row scaled down): the DP ring
    of GPUs 0, 2, ..., 14 holds four members per node, and NCCL's rotated channels repeat a
    node's hops (channel 1's 2 -> 4 is channel 0's too), so a hop's image is looked up in its
    own channel (shortcuts/quotient.py ring_piece; a KeyError before). Equal to the full
    simulation."""
    sc = layout_scenario(8, 2, 1, 8, False, True, True, 2, system="dgx-h100")
    from dataclasses import replace
    sc = replace(sc, parallel=replace(sc.parallel, tp_comm_overlap=True, fp8_format="hybrid"))
    mine, full = fast_and_full(sc)
    assert mine["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-9)
    for a, b in zip(mine["exposed_s_per_stage"], full["exposed_s_per_stage"]):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-15)
