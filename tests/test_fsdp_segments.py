"""FSDP's DP ring meets only its own gathers and reduce-scatters: the fast path runs each as one
node's piece of one channel on the shared links (docs/shortcuts.md, "Groups that meet only
themselves"), equal to the full simulation of every rank and ring step."""

import pytest

from simsp.engine.group_timing import NODE_PIECE
from simsp.scenario.loading import load_scenario
from simsp.metrics.collect import collect
from simsp.shortcuts.check import Shortcuts
from simsp.training.driver.iteration import simulate_iteration


def fsdp_scenario(d: int, t: int = 1, gpus_per_node_two: bool = False, **parallel):
    """A 2-layer Llama-shaped model (h 512) under FSDP2 over d ranks on 8-GPU nodes, meta
    (`gpus_per_node_two`: one layer of h 384 on 2-GPU nodes, one sample per rank)."""
    gpn = 2 if gpus_per_node_two else 8
    overrides = {("parallel", "tensor_model_parallel_size"): t,
                 ("parallel", "data_parallel_size"): d, ("parallel", "use_torch_fsdp2"): True,
                 ("parallel", "global_batch_size"): 2 * d, ("parallel", "micro_batch_size"): 1,
                 ("parallel", "sequence_parallel"): t > 1, ("cluster", "nodes"): d * t // gpn,
                 ("run", "mode"): "meta", ("model", "num_layers"): 2,
                 ("model", "hidden_size"): 512, ("model", "num_attention_heads"): 8,
                 ("model", "num_query_groups"): 8, ("model", "ffn_hidden_size"): 2048,
                 ("model", "seq_length"): 512, ("model", "vocab_size"): 4096}
    if gpus_per_node_two:
        overrides.update({("cluster", "gpus_per_node"): 2, ("model", "num_layers"): 1,
                          ("model", "hidden_size"): 384, ("model", "ffn_hidden_size"): 1536,
                          ("model", "seq_length"): 256, ("model", "vocab_size"): 2688,
                          ("parallel", "global_batch_size"): d})
    overrides.update({("parallel", k): v for k, v in parallel.items()})
    return load_scenario("scenarios/llama3-8b.toml", overrides)


def test_fsdp_rings_run_as_pieces_equal_to_the_full_simulation():
    """d = 16 on two nodes: the one DP group runs as pieces, its overlapping collectives sharing
    the piece's links; iteration time and exposure as every rank's every ring step."""
    sc = fsdp_scenario(16)
    fast = Shortcuts.for_scale(sc)
    assert fast.groups(NODE_PIECE) == {tuple(range(16))}
    mine = collect(simulate_iteration(sc, fast, trace="none"), fast)
    full = collect(simulate_iteration(sc, Shortcuts(), trace="none"), Shortcuts())
    assert mine["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-12)
    assert mine["exposed_s_per_stage"][0] == pytest.approx(full["exposed_s_per_stage"][0],
                                                           rel=1e-12, abs=1e-15)


def test_groups_sharing_links_with_tp_are_not_pieces():
    """t2 d8: each DP ring crosses NVLink ports TP collectives use, so it runs whole."""
    assert not Shortcuts.for_scale(fsdp_scenario(8, t=2)).groups(NODE_PIECE)


def test_pieces_across_a_leaf_boundary_take_the_slowest_hop():
    """d = 42 on 21 two-GPU nodes: node 20 sits under the second leaf, so two crossing hops go
    through the spine; each like hop of the piece takes its slowest latency (named in the
    verdict) and the ring keeps the full simulation's pace."""
    sc = fsdp_scenario(42, gpus_per_node_two=True)
    fast = Shortcuts.for_scale(sc)
    assert fast.groups(NODE_PIECE) and "leaf" in fast.why()["closed_form"]
    mine = collect(simulate_iteration(sc, fast, trace="none"), fast)
    full = collect(simulate_iteration(sc, Shortcuts(), trace="none"), Shortcuts())
    assert mine["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-12)


def test_rings_of_one_member_per_node_beside_the_pipeline_sends_run_as_pieces(monkeypatch):
    """t8 p2 d4 ZeRO-3 on DGX H100 (tests/test_work_counts.py FSDP_T8): each DP ring holds one
    member per node and meets the pipeline sends on its NICs. Under the plain representative
    each member's NIC meets its own replica's sends, the image of the representative's, so
    the ring runs as the representative's one hop on its own NIC, up and down: the same
    iteration and exposure, to the bit, as the ring stepped whole beside those sends. Its
    steps run in arithmetic while only pieces use the NIC (engine/collectives/step_trains.py,
    handed back to the network when a pipeline send starts there, which happens here): the
    same to 1e-12."""
    from dataclasses import replace

    from simsp.cluster.topology import gpu_name
    from simsp.engine.collectives import step_trains
    from simsp.engine.collectives.ring_alone import node_segment
    from simsp.engine.group_timing import STEP_BY_STEP
    from simsp.engine.network import Network
    from simsp.hardware.constants import LinkCalibration
    from tests.test_work_counts import FSDP_T8, scenario

    sc = scenario(FSDP_T8)
    fast = Shortcuts.for_scale(sc)
    assert fast.groups(NODE_PIECE) == {tuple(range(first, first + 32, 8))
                                       for first in (*range(8), *range(32, 40))}
    stepped = replace(fast, methods=tuple((g, STEP_BY_STEP if m == NODE_PIECE else m)
                                          for g, m in fast.methods))
    dissolved = []
    real = step_trains.StepTrains.dissolve
    monkeypatch.setattr(step_trains.StepTrains, "dissolve",
                        lambda self: dissolved.append(self) or real(self))
    trains = collect(simulate_iteration(sc, fast, trace="none"), fast)
    monkeypatch.setattr(Network, "step_trains", False)
    run = simulate_iteration(sc, fast, trace="none")
    mine, theirs = collect(run, fast), collect(simulate_iteration(sc, stepped, trace="none"),
                                               stepped)
    assert mine["iteration_time_s"] == theirs["iteration_time_s"]
    assert mine["exposed_s_per_stage"] == theirs["exposed_s_per_stage"]
    assert dissolved
    assert trains["iteration_time_s"] == pytest.approx(theirs["iteration_time_s"], rel=1e-12)
    for got, want in zip(trains["exposed_s_per_stage"], theirs["exposed_s_per_stage"]):
        assert got.keys() == want.keys()
        assert [got[k] for k in got] == pytest.approx([want[k] for k in got], rel=1e-12,
                                                      abs=1e-15)
    graph = run.inputs.world.network.graph
    _base, [(links, _latency, _chunk)] = node_segment(
        graph, [0, 8, 16, 24], LinkCalibration.from_cluster(sc.cluster), "all_gather", 2 ** 20,
        2, one_per_node=True)
    assert links == ((gpu_name(0), "leaf0/rail0"), ("leaf0/rail0", gpu_name(0)))


def test_a_piece_is_worked_out_once_per_collective_group_and_size(monkeypatch):
    """d = 16 on two nodes, 2 layers, 2 micro-batches: each unit's gathers and reduce-scatters
    repeat per micro-batch and layer, and a piece depends only on (collective, group, size,
    element size), so node_segment runs once per such key (engine/timed_collectives.py _segment),
    fewer times than the piece collectives run; the results are those of the full
    simulation (test above)."""
    import simsp.engine.timed_collectives as timed_collectives
    calls = []
    real = timed_collectives.node_segment

    def counting(graph, gpus, calibration, collective, nbytes, elem_bytes, **kw):
        calls.append((collective, tuple(gpus), nbytes, elem_bytes))
        return real(graph, gpus, calibration, collective, nbytes, elem_bytes, **kw)

    monkeypatch.setattr(timed_collectives, "node_segment", counting)
    sc = fsdp_scenario(16)
    run = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none")
    pieces = [s for s in run.inputs.world.comm.stats if s.gpus == tuple(range(16))]
    assert len(calls) == len(set(calls)) < len(pieces)


def test_the_check_asks_each_group_once_what_its_units_must_divide_by():
    """A piece needs nodes alike (m members each, or one per node with NICs at both ends) and
    every chunk an equal slice per channel: n x m must divide each unit's elements. The check
    asks the group once (ring_alone.py piece_divisor) where it asked node_segment per unit,
    collective and element size; both agree. d = 16 on two 8-GPU nodes: 16 x 8 = 128; with
    h 520 (4 heads) a layer unit holds 4,277,520 elements (520 x 1560 + 520 x 520 + 3 x 520 x 2048 +
    2 x 520), a multiple of 16 but 16 past one of 128, so no ring runs as pieces."""
    from simsp.cluster.topology import build_topology, nodes_hosting
    from simsp.engine.collectives.ring_alone import node_segment, piece_divisor
    from simsp.hardware.constants import LinkCalibration

    sc = fsdp_scenario(16)
    graph = build_topology(sc.cluster, nodes_hosting(range(16), 8))
    calibration = LinkCalibration.from_cluster(sc.cluster)
    assert piece_divisor(graph, list(range(16))) == 128
    assert piece_divisor(graph, [0, 8], one_per_node=True) == 2
    assert piece_divisor(graph, [0, 8]) is None  # one member per node, not asked for
    assert piece_divisor(graph, list(range(12))) is None  # 8 and 4 members
    for count in (128 * 3, 128 * 3 + 16):
        assert (node_segment(graph, list(range(16)), calibration, "all_gather", 2 * count, 2)
                is None) == bool(count % 128)
    assert Shortcuts.for_scale(sc).groups(NODE_PIECE)
    uneven = load_scenario("scenarios/llama3-8b.toml", {
        **{("model", k): v for k, v in sc.model.__dict__.items() if k in (
            "num_layers", "ffn_hidden_size", "seq_length", "vocab_size")},
        ("model", "hidden_size"): 520, ("model", "num_attention_heads"): 4,
        ("model", "num_query_groups"): 4, ("run", "mode"): "meta", ("cluster", "nodes"): 2,
        ("parallel", "tensor_model_parallel_size"): 1, ("parallel", "sequence_parallel"): False,
        ("parallel", "data_parallel_size"): 16, ("parallel", "use_torch_fsdp2"): True,
        ("parallel", "global_batch_size"): 32, ("parallel", "micro_batch_size"): 1})
    assert not Shortcuts.for_scale(uneven).groups(NODE_PIECE)
