"""DeepEP's two-hop internode dispatch (engine/collectives/deepep.py): per-link bytes hand-
counted for 4 EP ranks over 2 DGX nodes (GPUs 0, 1 on node 0 and 8, 9 on node 1: rails 0, 1,
0, 1), a token crossing IB once per node, and a hand-worked timeline."""

from dataclasses import replace

import numpy as np
import pytest
import simpy

from simsp.cluster.topology import build_topology
from simsp.engine.collectives.deepep import two_hop, two_hop_plan
from simsp.engine.network import Network
from simsp.hardware.constants import LinkCalibration
from simsp.scenario.config import Cluster

CLUSTER = Cluster(nodes=2)
CAL = LinkCalibration()
NV = CLUSTER.nvlink_bandwidth_GBps * 1e9 * CAL.nvlink_efficiency  # achieved B/s
IB = CLUSTER.ib_bandwidth_GBps * 1e9 * CAL.ib_efficiency
NV_LAT = CLUSTER.nvlink_latency_us * 1e-6
IB_LAT = CLUSTER.ib_latency_us * 1e-6
GPUS, NODE, RAIL = [0, 1, 8, 9], [0, 0, 1, 1], [0, 1, 0, 1]
H = 1_000_000  # bytes per token (hidden × 2 bytes)

# Rank 0's tokens -> ranks (is_token_in_rank): t0 -> {2, 3}, t1 -> {1, 2}, t2 -> {3}.
RANK0 = np.array([[0, 0, 1, 1], [0, 1, 1, 0], [0, 0, 0, 1]], dtype=bool)  # (3, 4)
SILENT = np.zeros((0, 4), dtype=bool)


def test_rank0_bytes_hand_counted():
    # Node 1 gets t0, t1, t2 once over IB, to rank 2 (GPU 8, rank 0's rail 0): 3 tokens; rank
    # 2 forwards t0 and t2 to rank 3 over NVLink: 2; t1 to rank 1 over NVLink directly: 1.
    # The alltoall dispatcher sends per destination rank: 0->2 two tokens, 0->3 two: 4 on IB.
    plan = two_hop_plan([RANK0, SILENT, SILENT, SILENT], NODE, RAIL, H)
    assert plan.rdma == {(0, 2): 3 * H}
    assert plan.nvlink == {(0, 1): H}
    assert plan.forwarded == {(0, 2): {3: 2 * H}}
    assert plan.link_bytes() == {"rdma": 3 * H, "nvlink": 3 * H}


def test_every_rank_sending_bytes_hand_counted():
    # Rank 3 (node 1, rail 1) sends u0 -> {0, 1}, u1 -> {0}, u2 -> {2}: node 0 once per token
    # over IB to rank 1 (rail 1): u0, u1 = 2; rank 1 forwards u0, u1 to rank 0: 2; u2 NVLink to
    # rank 2: 1. Rank 1 sends v0 -> {1, 3} (itself and rank 3): IB 1->3 one token, nothing
    # forwarded (rank 3 is the forwarder).
    rank3 = np.array([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0]], dtype=bool)
    rank1 = np.array([[0, 1, 0, 1]], dtype=bool)
    plan = two_hop_plan([RANK0, rank1, SILENT, rank3], NODE, RAIL, H)
    assert plan.rdma == {(0, 2): 3 * H, (3, 1): 2 * H, (1, 3): H}
    assert plan.nvlink == {(0, 1): H, (3, 2): H}
    assert plan.forwarded == {(0, 2): {3: 2 * H}, (3, 1): {0: 2 * H}}


def test_two_hop_timeline_hand_worked():
    # Alone on the links: RDMA 0->2 (GPU 0 -> 8, same rail, 2 IB edges) 3H at ib, delivered at
    # 3H/ib + 2 lat_ib; then GPU 8 forwards 2H to GPU 9 over NVLink: + 2H/nv + lat_nv. The
    # direct NVLink 0->1 (H) shares no link with them: H/nv + lat_nv.
    plan = two_hop_plan([RANK0, SILENT, SILENT, SILENT], NODE, RAIL, H)
    env = simpy.Environment()
    network = Network(env, build_topology(CLUSTER), CAL)
    process = env.process(two_hop(env, network, GPUS, plan))
    env.run()
    arrivals = process.value
    rdma = 3 * H / IB + 2 * IB_LAT
    assert arrivals[(0, 2)] == pytest.approx(rdma, rel=0, abs=1e-9)
    assert arrivals[(0, 1)] == pytest.approx(H / NV + NV_LAT, rel=0, abs=1e-9)
    assert arrivals[(0, 2, 3)] == pytest.approx(rdma + 2 * H / NV + NV_LAT, rel=0, abs=1e-9)
    assert env.now == pytest.approx(rdma + 2 * H / NV + NV_LAT, rel=0, abs=1e-9)


def test_combine_is_the_mirror_image():
    # Combine: GPU 9 sends its 2H back to the forwarder GPU 8 over NVLink first (2H/nv +
    # lat_nv), then GPU 8 one reduced copy per token, 3H, over IB to GPU 0 (+ 3H/ib + 2 lat_ib).
    plan = two_hop_plan([RANK0, SILENT, SILENT, SILENT], NODE, RAIL, H)
    env = simpy.Environment()
    network = Network(env, build_topology(CLUSTER), CAL)
    process = env.process(two_hop(env, network, GPUS, plan, combine=True))
    env.run()
    arrivals = process.value
    forwarded = 2 * H / NV + NV_LAT
    assert arrivals[(0, 2, 3)] == pytest.approx(forwarded, rel=0, abs=1e-9)
    assert arrivals[(0, 2)] == pytest.approx(forwarded + 3 * H / IB + 2 * IB_LAT, rel=0,
                                             abs=1e-9)
    labels = {t.label for t in network.transfers}
    assert labels == {"deepep 3->2", "deepep 2->0", "deepep 1->0"}


def test_the_kernels_hold_their_sms_while_compute_runs():
    # With SM contention on, DeepEP's kernel holds NUM_SMS = 20 of the GPU's SMs (deep_ep
    # Buffer.num_sms) from its call to its end: a compute kernel of time D on rank 0 started
    # with it runs at (132 - 20)/132 while the dispatch lasts (3H/ib + 2 lat_ib + 2H/nv + lat_nv
    # on rank 0's side: it waits for the whole exchange), then at the full rate.
    from simsp.engine.collectives.deepep import NUM_SMS
    from simsp.engine.communicator import Communicator
    from simsp.engine.sm_share import SmShare
    env = simpy.Environment()
    comm = Communicator(env, Network(env, build_topology(CLUSTER), CAL))
    comm.sm_share = SmShare(env, 132)
    ends = {}
    routes = {0: RANK0, 1: SILENT, 8: SILENT, 9: SILENT}

    def member(rank):
        yield from comm.deepep(tuple(GPUS), rank, None, routes[rank], H, "d")
        ends[rank] = env.now

    D = 1e-3

    def compute():
        yield from comm.sm_share.run(0, D)
        ends["gemm"] = env.now

    for rank in GPUS:
        env.process(member(rank))
    env.process(compute())
    env.run()
    dispatch = 3 * H / IB + 2 * IB_LAT + 2 * H / NV + NV_LAT
    assert ends[0] == pytest.approx(dispatch, rel=0, abs=1e-9)
    rate = (132 - NUM_SMS) / 132
    assert ends["gemm"] == pytest.approx(dispatch + (D - dispatch * rate), rel=0, abs=1e-9)


FLEX = dict(moe_token_dispatcher_type="flex", moe_enable_deepep=True)


@pytest.mark.parametrize("layout", [dict(nodes=2, gpus_per_node=1),
                                    dict(nodes=2, gpus_per_node=2, data_parallel_size=4,
                                         expert_model_parallel_size=4)])
def test_flex_moves_the_same_rows_as_the_reference(layout):
    # EP across 2 nodes: every gradient as the single-device reference's, through DeepEP.
    from simsp.training.driver.compare import compare_with_reference
    from simsp.training.driver.iteration import simulate_iteration
    from tests.test_moe_expert_parallel import scenario
    run = simulate_iteration(scenario(**FLEX, **layout))
    kinds = {kind for _, kind in run.inputs.world.ranks[0].comm_bytes}
    assert {"deepep_dispatch", "deepep_combine"} <= kinds and "all_to_all_dispatch" not in kinds
    assert max(compare_with_reference(run).values()) < 1e-13


@pytest.mark.parametrize("extra, field", [
    (dict(moe_enable_deepep=True), "parallel.moe_enable_deepep"),  # alltoall
    (dict(moe_token_dispatcher_type="flex"), "parallel.moe_token_dispatcher_type"),
    (dict(FLEX, moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True),
     "model.moe_pad_expert_input_to_capacity"),
    (dict(FLEX, expert_tensor_parallel_size=2, data_parallel_size=4),
     "parallel.expert_tensor_parallel_size"),
])
def test_flex_refusals_name_their_field(extra, field):
    from simsp.errors import UserError
    from tests.test_moe_expert_parallel import scenario
    with pytest.raises(UserError) as caught:
        scenario(**extra)
    assert str(caught.value).startswith(field)


def two_node_ep(**extra):
    """Meta, p 2, d 4, EP 4 on 2-GPU nodes: each stage's EP group spans two nodes (two rails)."""
    from simsp.scenario.loading import load_scenario
    model = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64,
             "vocab_size": 256, "ffn_hidden_size": 128, "add_bias_linear": False,
             "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 64, "swiglu": True,
             "normalization": "RMSNorm", "position_embedding_type": "rope"}
    parallel = {"pipeline_model_parallel_size": 2, "data_parallel_size": 4,
                "expert_model_parallel_size": 4, "moe_grouped_gemm": True,
                "micro_batch_size": 1, "global_batch_size": 16, "distributed_optimizer": True,
                "recompute_granularity": "full", **FLEX, **extra}
    overrides = {("model", k): v for k, v in model.items()}
    overrides.update({("parallel", k): v for k, v in parallel.items()})
    overrides.update({("cluster", "gpus_per_node"): 2, ("cluster", "nodes"): 4,
                      ("run", "mode"): "meta"})
    return load_scenario(None, overrides)


def test_flex_shortcuts_equal_the_full_simulation():
    # The EP groups' DeepEP exchanges timed alone once per placement and plan (TEMPLATE) and
    # the MoE layer steps replayed give the numbers of every rank's flows on shared links.
    from simsp.engine.group_timing import TEMPLATE
    from simsp.training.driver.iteration import Shortcuts
    from tests.test_moe_shortcuts import _assert_equal, _metrics, as_flows
    sc = two_node_ep()
    fast = Shortcuts.for_scale(sc)
    assert fast.representative and fast.templates
    assert fast.groups(TEMPLATE) == {(0, 1, 2, 3), (4, 5, 6, 7)}
    full = _metrics(sc, Shortcuts())
    fast_metrics = _metrics(sc, fast)
    assert fast_metrics["exposed_s_per_stage"][0]["ep_comm"] > 0
    _assert_equal(fast_metrics, full)
    every_rank = replace(fast, representative=False, templates=False)
    _assert_equal(_metrics(sc, every_rank), full)
    _assert_equal(_metrics(sc, replace(every_rank, methods=as_flows(fast.methods))), full)


def test_meta_routes_are_member_zeros_turned():
    # Member i's table is member 0's with its columns turned by i (what the communicator
    # assumes of a member the shortcuts leave out), and alike in every layer.
    from types import SimpleNamespace
    from simsp.model.blocks.moe import deepep
    counts = np.full(8, 4)  # T 16, top-2, 8 experts: 4 rows each
    routed = SimpleNamespace(logits=np.zeros((16, 8)), counts=counts)
    tables = [deepep.in_rank(SimpleNamespace(moe=SimpleNamespace(ep=4, ep_index=i), numeric=False,
                                             seed=7), routed) for i in range(4)]
    for i, table in enumerate(tables):  # (16, 4)
        assert np.array_equal(table, np.roll(tables[0], i, axis=1))
    # each expert pair of member 0 holds 2 experts of 4 rows: between 4 and 8 tokens reach it
    assert all(4 <= n <= 8 for n in tables[0].sum(axis=0))


def test_one_layer_side_run_falls_back_to_alltoall():
    # `simsp run`'s one-layer measurement (metrics.layer_tensors) puts every expert on one TP
    # group: no EP exchange, so flex (TP*EP > 1, ETP 1) becomes the alltoall dispatcher.
    from simsp.training.driver.layer_sim import one_tp_group
    one = one_tp_group(two_node_ep())
    assert (one.parallel.ep, one.parallel.moe_token_dispatcher_type) == (1, "alltoall")
    assert not one.parallel.moe_enable_deepep
    kept = one_tp_group(two_node_ep(), keep_experts=True)
    assert kept.parallel.moe_token_dispatcher_type == "flex"


def test_a_bad_flex_layout_is_refused_before_the_run():
    from inprocess import cli
    rc, out, err = cli(["run", "scenarios/mixtral-8x7b.toml", "--json",
                        "--moe-token-dispatcher-type", "flex", "--moe-enable-deepep",
                        "--expert-model-parallel-size", "1", "--tensor-model-parallel-size", "1"])
    assert (rc, out) == (2, "")
    assert err.splitlines() == [err.splitlines()[0]]
    assert err.startswith("error: parallel.moe_token_dispatcher_type") and "TP*EP > 1" in err
