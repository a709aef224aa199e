"""The timing plan (simsp/shortcuts/plan.py) names, for hand-worked layouts, the method each group's
collectives take (engine/group_timing.py), and the communicator honours it group by group.

NCCL's rings (engine/collectives/ring_plan.py channel_rings): a group inside one node is one ring,
each GPU's NVLink port carrying one of its hops; across nodes one channel per member a node
holds, so k members per node put k hops on every NVLink port; one member per node crosses only
its NIC. Two owners' hops on one link clash unless they are in turn (shortcuts/clashes.py).
"""

from pathlib import Path

import pytest
import simpy

from simsp.cluster.topology import build_topology
from simsp.engine.collectives.ring import RING_COLLECTIVES
from simsp.engine.collectives.ring_plan import ALL_REDUCE
from simsp.engine.communicator import Communicator
from simsp.engine.group_timing import (CLOSED_FORM, NODE_PIECE, RING_ALONE, STEP_BY_STEP,
                                       TEMPLATE, EveryGroup)
from simsp.engine.network import Network
from simsp.hardware.constants import LinkCalibration
from simsp.scenario.config import Cluster
from simsp.scenario.loading import load_scenario
from simsp.shortcuts.check import Shortcuts
from simsp.shortcuts.methods import GROUP_METHODS, RANK_METHODS
from simsp.shortcuts.plan import timing_plan
from tests.test_fsdp_segments import fsdp_scenario
from tests.test_shortcut_layouts import layout_scenario

ROOT = Path(__file__).resolve().parent.parent


def plan_of(sc):
    """The plan the fast path runs."""
    return timing_plan(sc, Shortcuts.for_scale(sc))


def test_rings_inside_one_node_in_turn_are_closed_form():
    """t2 d2 on one 4-GPU node, no overlap: every ring is one channel (one hop per port), and
    TP (0, 1) and DP (0, 2) meet on GPU 0's port only in turn: all closed form, and one rank
    stands for the stage."""
    plan = plan_of(layout_scenario(4, 2, 1, 2, False, False, False, 2))
    for group in [(0, 1), (2, 3), (0, 2), (1, 3)]:
        assert plan.timing_of(group) == CLOSED_FORM, group
    assert plan.simulated == (0,) and plan.image_loads is None


def test_a_tp_ring_sharing_nvlink_with_overlapped_dp_runs_step_by_step():
    """The same layout with --overlap-grad-reduce: DP (0, 2) sends on GPU 0's NVLink port while
    TP (0, 1) may: both run step by step, as do (2, 3) and (1, 3) on GPU 3's port. The clash
    TP (0, 1) / DP (1, 3) on GPU 1's port is no move of whole nodes, but the two rail shifts
    (TP rank, TP group) map the stage onto itself: rank 0 runs, as the quotient by them. Each
    of its rings runs as the one hop GPU 0 sends (0 -> 1, 0 -> 2: the other is its image), and
    every GPU's NVLink port stands as GPU 0's (the shifts move any GPU of the node onto 0)."""
    plan = plan_of(layout_scenario(4, 2, 1, 2, False, True, False, 2))
    for group in [(0, 1), (2, 3), (0, 2), (1, 3)]:
        assert plan.timing_of(group) == STEP_BY_STEP, group
    assert plan.simulated == (0,) and not plan.image_loads
    assert set(plan.pieces) == {(0, 1), (0, 2)}
    assert all(piece.executed == ((0, 0),) for piece in plan.pieces.values())
    up, down = ("gpu0", "node0/nvswitch"), ("node0/nvswitch", "gpu0")
    assert {plan.link_reps[(f"gpu{g}", "node0/nvswitch")] for g in range(4)} == {up}
    assert {plan.link_reps[("node0/nvswitch", f"gpu{g}")] for g in range(4)} == {down}


def test_a_dp_ring_whose_channels_share_ports_is_its_ring_alone():
    """d = 16 on two 8-GPU nodes: 8 channels, 8 hops on every NVLink port, no other traffic:
    the ring alone (run once step by step)."""
    plan = plan_of(layout_scenario(8, 1, 1, 16, False, True, True, 1))
    assert plan.timing_of(tuple(range(16))) == RING_ALONE


def test_one_member_per_node_and_a_tp_ring_per_node_are_closed_form():
    """t4 d2 on two 4-GPU nodes, overlapped reduction: each TP ring fills a node (one
    channel); each DP pair has one member per node (one channel over its rail's NICs, which
    TP never uses)."""
    plan = plan_of(layout_scenario(4, 4, 1, 2, False, True, False, 2))
    for group in [(0, 1, 2, 3), (4, 5, 6, 7)] + [(i, 4 + i) for i in range(4)]:
        assert plan.timing_of(group) == CLOSED_FORM, group
    assert plan.simulated == (0,)


def test_fsdp_rings_that_meet_only_themselves_are_node_pieces():
    """FSDP d = 16 on two nodes: the DP ring's gathers and reductions overlap (two streams), no
    other owner: node pieces. With t = 2 its rings cross TP's NVLink ports: step by step."""
    assert plan_of(fsdp_scenario(16)).timing_of(tuple(range(16))) == NODE_PIECE
    plan = plan_of(fsdp_scenario(8, t=2))
    assert plan.timing_of(tuple(range(0, 16, 2))) == STEP_BY_STEP


def moe_scenario(**parallel):
    """A 2-layer MoE model of 8 experts on one 4-GPU node, meta mode."""
    model = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64,
             "vocab_size": 256, "ffn_hidden_size": 128, "num_experts": 8,
             "moe_router_topk": 2, "moe_ffn_hidden_size": 64, "add_bias_linear": False}
    overrides = {("model", k): v for k, v in model.items()}
    overrides.update({("parallel", k): v for k, v in parallel.items()})
    overrides.update({("cluster", "gpus_per_node"): 4, ("cluster", "nodes"): 1,
                      ("run", "mode"): "meta", ("parallel", "moe_token_dispatcher_type"):
                      "alltoall", ("parallel", "global_batch_size"): 8})
    return load_scenario(None, overrides)


def test_an_ep_group_alone_is_a_template_and_unlisted_groups_their_ring_alone():
    """d4 EP 2 on one node: EP groups (0, 1) and (2, 3) meet no other owner's hop (DP (0..3)
    runs in turn): all-to-all templates. The expert data-parallel groups (0, 2), (1, 3) are
    checked (shortcuts/traffic.py expert_owners): in turn with DP on the DP stream, one hop per
    NVLink port, closed form. A group the check does not list (an ETP group) is timed as its
    ring alone (shortcuts/methods.py UNLISTED)."""
    plan = plan_of(moe_scenario(data_parallel_size=4, expert_model_parallel_size=2))
    assert plan.timing_of((0, 1)) == plan.timing_of((2, 3)) == TEMPLATE
    assert plan.timing_of((0, 1, 2, 3)) == CLOSED_FORM
    assert plan.timing_of((0, 2)) == plan.timing_of((1, 3)) == CLOSED_FORM
    assert plan.default == RING_ALONE


def test_without_shortcuts_every_group_runs_step_by_step():
    """--no-shortcuts and numeric mode: the plain path."""
    sc = layout_scenario(8, 1, 1, 16, False, True, True, 1)
    for plan in (timing_plan(sc, Shortcuts()),
                 plan_of(load_scenario(None, {("parallel", "data_parallel_size"): 2}))):
        assert plan.simulated is None
        for group in [tuple(range(16)), (0, 1), (5,)]:
            assert plan.timing_of(group) == STEP_BY_STEP


def test_every_method_cites_a_test_and_the_docs_name_it():
    """The conditions table names existing tests, and docs/shortcuts.md's table every method."""
    docs = (ROOT / "docs" / "shortcuts.md").read_text()
    for method in GROUP_METHODS + RANK_METHODS:
        for test in method.test.split(", "):
            assert (ROOT / test).is_file(), (method.name, test)
        assert f"`{method.name}`" in docs, method.name


def _two_rings(methods: dict) -> dict:
    """64 MiB all-reduces on (0, 1) and (0, 2) at once (NCCL's ring forced), both crossing
    GPU 0's NVLink uplink: each group's seconds, timed by `methods`."""
    env = simpy.Environment()
    comm = Communicator(env, Network(env, build_topology(Cluster(nodes=1)),
                                     LinkCalibration(nccl_algo="ring")), timing_of=methods.get)
    for group in methods:
        for rank in group:
            env.process(comm.all_reduce(group, rank, None, 2**26))
    env.run()
    return {s.gpus: s.time_s for s in comm.stats}


def _alone(group) -> float:
    """Reference: the ring run directly, alone on the links."""
    env = simpy.Environment()
    network = Network(env, build_topology(Cluster(nodes=1)), LinkCalibration(nccl_algo="ring"))
    process = env.process(RING_COLLECTIVES[ALL_REDUCE](env, network, list(group), None, 2**26))
    env.run()
    return process.value[1].time_s


def test_the_communicator_times_each_group_by_its_method():
    """Both step by step, the two rings share GPU 0's uplink and each is slower than alone;
    with (0, 2) timed as a whole it loads no link, so (0, 1) runs at its pace alone."""
    both = _two_rings({(0, 1): STEP_BY_STEP, (0, 2): STEP_BY_STEP})
    assert both[(0, 1)] > 1.2 * _alone((0, 1))
    mixed = _two_rings({(0, 1): STEP_BY_STEP, (0, 2): RING_ALONE})
    assert mixed[(0, 1)] == pytest.approx(_alone((0, 1)), rel=1e-12)
    assert mixed[(0, 2)] == pytest.approx(_alone((0, 2)), rel=1e-12)


def test_a_method_outside_the_table_is_refused():
    with pytest.raises(ValueError):
        EveryGroup("fast")
