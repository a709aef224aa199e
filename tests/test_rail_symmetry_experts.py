"""Rail symmetry with expert all-to-alls (docs/shortcuts.md, "Rail symmetry with expert
all-to-alls"): under the split-backward schedules the non-blocking pipeline sends meet the EP
all-to-alls on the NICs, so the plain representative is refused; one rank per orbit of the
stage's rail symmetry then runs, as the quotient by it (tests/test_shortcut_ep_quotient.py) or,
where that is refused, its sends and one flow per orbit of its all-to-alls' pairs loading their
images' links, and equals the full simulation (--no-shortcuts)."""

from dataclasses import replace
import functools
import os

import pytest

from simsp.cluster.topology import build_topology, hop_route, nodes_hosting
from simsp.explore.configs.sweep_file import load_sweep_file
from simsp.metrics.collect import collect
from simsp.scenario.loading import load_scenario
from simsp.scenario.work import pair_seconds
from simsp.shortcuts.check import Shortcuts, check_shortcuts
from simsp.shortcuts.traffic import can_bind
from simsp.shortcuts.work_counts import estimated_counts
from simsp.training.driver.iteration import simulate_iteration

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def moe_scenario(schedule: str, model_fields: dict | None = None, **parallel):
    """p 4, d 4, EP 4 on 2-GPU nodes (each stage's EP group spans two nodes, 16 GPUs), a 4-layer
    MoE of hidden 1024 (8 experts, top 2: uniform routing), s 2048, 2 GB/s NICs so that a
    pipeline send lasts as long as an all-to-all; 4 micro-batches per replica."""
    model = {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 4, "seq_length": 2048,
             "vocab_size": 256, "ffn_hidden_size": 2048, "add_bias_linear": False,
             "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 1024,
             "swiglu": True, "normalization": "RMSNorm", "position_embedding_type": "rope",
             **(model_fields or {})}
    layout = {"pipeline_model_parallel_size": 4, "data_parallel_size": 4,
              "expert_model_parallel_size": 4, "moe_token_dispatcher_type": "alltoall",
              "moe_grouped_gemm": True, "micro_batch_size": 1, "global_batch_size": 16,
              "distributed_optimizer": True, "schedule": schedule}
    layout.update(parallel)
    overrides = {("model", k): v for k, v in model.items()}
    overrides.update({("parallel", k): v for k, v in layout.items()})
    overrides.update({("cluster", "gpus_per_node"): 2, ("cluster", "nodes"): 8,
                      ("cluster", "ib_bandwidth_GBps"): 2.0, ("run", "mode"): "meta"})
    return load_scenario(None, overrides)


def _metrics(sc, shortcuts: Shortcuts) -> dict:
    return collect(simulate_iteration(sc, shortcuts, trace="none"), shortcuts)


@functools.cache
def full_metrics(schedule: str, batch: int = 16) -> dict:
    """The full simulation's metrics of moe_scenario(schedule), run once for every test."""
    return _metrics(moe_scenario(schedule, global_batch_size=batch), Shortcuts())


def _assert_equal(mine: dict, theirs: dict, rel: float = 1e-9) -> None:
    """Iteration time and every stage's exposure (each kind) equal to `rel`."""
    assert mine["iteration_time_s"] == pytest.approx(theirs["iteration_time_s"], rel=rel)
    for stage, other in zip(mine["exposed_s_per_stage"], theirs["exposed_s_per_stage"]):
        for kind, seconds in other.items():
            assert stage[kind] == pytest.approx(seconds, rel=rel, abs=1e-15), kind


@pytest.mark.parametrize("schedule, batch", [("zb-h1", 16), ("dualpipe", 32)])
def test_one_rank_per_stage_by_rail_symmetry_equals_every_rank(schedule, batch):
    sc = moe_scenario(schedule, global_batch_size=batch)  # DualPipe: 2 x p micro-batches
    fast = Shortcuts.for_scale(sc)
    # a stage's 4 ranks on 2 nodes x 2 rails: the rail swap and the node swap are symmetries,
    # so the 4 form one orbit and the first rank of each stage runs
    assert fast.representative and fast.symmetry is not None
    assert fast.symmetry.ranks == (0, 4, 8, 12)
    assert "up to rail symmetry" in fast.why()["representative"]
    _assert_equal(_metrics(sc, fast), full_metrics(schedule, batch))


def image_loads_only(monkeypatch):
    """The representative run without the quotient (as where a ring has no piece): image loads."""
    from simsp.shortcuts import rail_symmetry

    monkeypatch.setattr(rail_symmetry, "quotient", lambda *args: None)


def test_the_images_of_one_send_are_needed(monkeypatch):
    """Image loads (the quotient refused): stage 2's gradient send to stage 1 (rank 8 to rank 4)
    stands for ranks 9, 10, 11's to 5, 6, 7: its flows also load those three routes' binding
    links (a NIC up, a NIC down each). Without them the rank-8 send's all-to-all neighbours run
    faster and the run moves."""
    image_loads_only(monkeypatch)
    sc = moe_scenario("zb-h1")
    fast = Shortcuts.for_scale(sc)
    graph = build_topology(sc.cluster, nodes_hosting(range(16), 2))
    images = [(9, 5), (10, 6), (11, 7)]
    expected = [e for src, dst in images for e in hop_route(graph, src, dst) if can_bind(e)]
    assert len(expected) == 6
    loads = fast.symmetry.loads
    assert sorted(loads[(8, 4, None)]) == sorted(expected)
    # the all-to-alls whole (no pair orbits), as with image loads alone
    cut = replace(fast, symmetry=replace(fast.symmetry, loads={**loads, (8, 4, None): ()},
                                         pair_orbits={}))
    full = full_metrics("zb-h1", 16)
    dropped = _metrics(sc, cut)
    assert abs(dropped["iteration_time_s"] - full["iteration_time_s"]) > 1e-3 * \
        full["iteration_time_s"]


def test_the_images_of_one_all_to_all_are_needed(monkeypatch):
    """Image loads (the quotient refused): each stepwise EP group's all-to-all runs as one flow
    per orbit of its pairs: 12 pairs under the 4 shifts of a stage, 3 orbits (rank 12 to 13, 14
    and 15), each loading its 3 images' NVLink ports or NICs. Without stage 3's images its
    ranks' NICs carry less than in the full simulation and the run moves."""
    image_loads_only(monkeypatch)
    sc = moe_scenario("zb-h1")
    fast = Shortcuts.for_scale(sc)
    orbits = fast.symmetry.pair_orbits
    assert [(a, b) for a, b, _images in orbits[(12, 13, 14, 15)]] == [(12, 13), (12, 14),
                                                                      (12, 15)]
    assert all(len(images) == 3 * 2 for group in orbits.values() for *_pair, images in group)
    bare = {**orbits, (12, 13, 14, 15): tuple((a, b, ()) for a, b, _ in orbits[(12, 13, 14, 15)])}
    cut = replace(fast, symmetry=replace(fast.symmetry, pair_orbits=bare))
    full = full_metrics("zb-h1", 16)
    assert abs(_metrics(sc, cut)["iteration_time_s"] - full["iteration_time_s"]) > 1e-3 * \
        full["iteration_time_s"]


def test_refused_with_the_reason_where_ranks_of_an_orbit_differ():
    """Imbalanced routing sends each EP member different bytes: no rail symmetry, every rank
    runs, and the verdict says why; so does the flex dispatcher (its two-hop traffic is not
    listed hop by hop)."""
    skewed = check_shortcuts(moe_scenario("zb-h1", {"moe_routing_imbalance": 0.5}))
    assert not skewed.representative and skewed.symmetry is None
    assert skewed.why()["representative"].endswith("rail symmetry needs uniform routing "
                                                   "(every EP member sending alike)")
    flex = check_shortcuts(moe_scenario("zb-h1", moe_token_dispatcher_type="flex",
                                     moe_enable_deepep=True))
    assert not flex.representative
    assert "not tried with the flex dispatcher" in flex.why()["representative"]


def test_work_estimate_counts_every_exchange_and_one_flow_per_orbit(monkeypatch):
    """ZB-H1's sends are non-blocking, so every MoE layer-step's all-to-alls run as flows:
    4 layers x 4 micro-batches = 16 exchanges (1F1B's, timed alone, about once per stage: 4),
    each of 3 orbit flows (12 pairs / 4 shifts) in place of EP² = 16 (scenario/work.py's
    per-pair constants, set here to 4e-5 s a pair and 4.2e-9 s a pair squared so that both
    counts show)."""
    monkeypatch.setattr("simsp.scenario.work.EP_SECONDS_PER_RANK_PAIR", {"alltoall": 4e-5})
    monkeypatch.setattr("simsp.scenario.work.EP_SECONDS_PER_RANK_PAIR_SQUARED", 4.2e-9)
    sc = moe_scenario("zb-h1")
    counts = estimated_counts(sc, Shortcuts.for_scale(sc))
    assert counts.ep_pairs == 3.0
    assert pair_seconds(sc, ep_pairs=counts.ep_pairs) == pytest.approx(16 * (3 * 4e-5 + 9 * 4.2e-9),
                                                              rel=1e-12)
    blocking = moe_scenario("1f1b")
    assert estimated_counts(blocking, Shortcuts.for_scale(blocking)).ep_pairs is None
    assert pair_seconds(blocking) == pytest.approx(4 * (16 * 4e-5 + 256 * 4.2e-9), rel=1e-12)


def test_deepseek_schedules_sweep_file_loads():
    """sweeps/deepseek-v3-schedules.toml: 1F1B (the baseline), DualPipe and interleaved (by a
    pipeline layout; docs/pipeline-layout.md) at 2048 sequences, 32 micro-batches per pipeline
    (DualPipe: at least 2 x 16, even)."""
    variants = load_sweep_file(os.path.join(REPO, "sweeps", "deepseek-v3-schedules.toml"))
    assert [v[0] for v in variants] == ["1F1B", "DualPipe", "Interleaved",
                                        "Interleaved + EP overlap"]
    schedules = []
    for _name, values, *_rest in variants:
        sc = load_scenario(None, values)
        assert sc.parallel.num_micro_batches == 32
        schedules.append(sc.parallel.schedule_name)
    assert schedules == ["1f1b", "dualpipe", "interleaved", "interleaved"]


def test_executed_expert_groups_take_the_quotient():
    """Stage s's DP ring (4s .. 4s + 3, also its EP group) steps and has a piece, so the run is
    the quotient (shortcuts/quotient.py; docs/shortcuts.md, "Under the quotient"): every link as
    its orbit's, the rings (and the EP group's token-count all-gather) as their pieces, each EP
    group's all-to-all as its simulated member's 3 pairs with no image load."""
    fast = Shortcuts.for_scale(moe_scenario("zb-h1"))
    assert fast.symmetry.loads == {} and fast.symmetry.link_reps
    assert set(fast.symmetry.pieces) == {(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11),
                                         (12, 13, 14, 15)}
    assert fast.symmetry.pair_orbits[(4, 5, 6, 7)] == ((4, 5, ()), (4, 6, ()), (4, 7, ()))
