"""Meta mode's shortcuts with expert parallelism (docs/moe.md "Meta mode at scale"): an EP
group's all-to-all that no other traffic meets is timed alone, and its MoE layer steps are
recorded once per placement and replayed; each gives the numbers of the path without it."""

from dataclasses import replace

import pytest

from simsp.cluster.topology import NODES_PER_LEAF, placement
from simsp.engine.group_timing import RING_ALONE, TEMPLATE
from simsp.scenario.loading import load_scenario
from simsp.metrics.collect import collect
from simsp.training.driver.iteration import Shortcuts, simulate_iteration


def split_units_scenario():
    """p 3, d 16, EP 16 on 2-GPU nodes: stage 2's EP group spans nodes 16-23, four in each of
    two scalable units (NODES_PER_LEAF = 20), so its cross-unit pairs cross the spine and its
    all-to-alls take longer than stage 0's and 1's."""
    assert NODES_PER_LEAF == 20
    model = {"num_layers": 3, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64,
             "vocab_size": 256, "ffn_hidden_size": 128, "add_bias_linear": False,
             "num_experts": 16, "moe_router_topk": 2, "moe_ffn_hidden_size": 64,
             "swiglu": True, "normalization": "RMSNorm", "position_embedding_type": "rope",
             "moe_shared_expert_intermediate_size": 64}
    parallel = {"pipeline_model_parallel_size": 3, "data_parallel_size": 16,
                "expert_model_parallel_size": 16, "moe_token_dispatcher_type": "alltoall",
                "moe_grouped_gemm": True, "micro_batch_size": 1, "global_batch_size": 32,
                "distributed_optimizer": True, "recompute_granularity": "full"}
    overrides = {("model", k): v for k, v in model.items()}
    overrides.update({("parallel", k): v for k, v in parallel.items()})
    overrides.update({("cluster", "gpus_per_node"): 2, ("cluster", "nodes"): 24,
                      ("run", "mode"): "meta"})
    return load_scenario(None, overrides)


def _metrics(sc, shortcuts: Shortcuts) -> dict:
    return collect(simulate_iteration(sc, shortcuts, trace="none"), shortcuts)


def _assert_equal(mine: dict, theirs: dict) -> None:
    """Iteration time, every stage's exposure (each kind), peaks and expert loads equal."""
    assert mine["iteration_time_s"] == pytest.approx(theirs["iteration_time_s"], rel=1e-12)
    for stage, other in zip(mine["exposed_s_per_stage"], theirs["exposed_s_per_stage"]):
        for kind, seconds in other.items():
            assert stage[kind] == pytest.approx(seconds, rel=1e-9, abs=1e-15), kind
    peaks = {r["rank"]: r["peak_bytes"] for r in theirs["ranks"]}
    assert [r["peak_bytes"] for r in mine["ranks"]] == [peaks[r["rank"]] for r in mine["ranks"]]
    for key in ("routed_pairs", "slowest_expert_rows"):
        assert mine["moe"][key] == theirs["moe"][key]


def test_alone_all_to_alls_and_moe_templates_change_nothing():
    sc = split_units_scenario()
    fast = Shortcuts.for_scale(sc)
    # stage 2's pairs cross the leaf boundary for some replicas only: one rank per node runs
    # (rail symmetry), and layer templates are refused (an expert group's simulated members
    # may reach its all-to-all at different moments; replayed, 2.9e-3 off)
    assert fast.representative and fast.symmetry is not None and not fast.templates
    assert len(fast.groups(TEMPLATE)) == 3
    full = _metrics(sc, Shortcuts())
    # every rank simulated: the all-to-alls timed alone equal their flows
    alone = replace(fast, representative=False, templates=False)
    _assert_equal(_metrics(sc, alone), full)
    # the quotient, its all-to-alls timed alone, equals the full simulation
    _assert_equal(_metrics(sc, fast), full)
    # the split group keeps its own template (3 above); its exposure no longer differs from
    # stage 1's: what made it slower was the rings' spine latency, and NCCL's per-tier step
    # latency (docs/nccl.md) has no spine term


def as_flows(methods: tuple) -> tuple:
    """The same methods but the all-to-all templates: those groups' all-to-alls run as flows
    (their rings still timed alone)."""
    return tuple((group, RING_ALONE if method == TEMPLATE else method)
                 for group, method in methods)


def test_placement_is_the_same_for_groups_moved_by_whole_nodes_within_a_unit():
    one_unit = [placement(tuple(range(first, first + 16)), 2, 24) for first in (0, 16)]
    split = placement(tuple(range(32, 48)), 2, 24)  # nodes 16-23: units 0 and 1
    assert one_unit[0] == one_unit[1] != split
    assert placement((0, 1), 2, 24) != placement((1, 0), 2, 24)  # ring order is kept
    assert placement((40, 41), 2, 24) != placement((0, 1), 2, 24)  # unit 1 has 4 nodes
