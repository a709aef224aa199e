"""SHARP across nodes (engine/collectives/collnet.py, docs/nccl.md "Across nodes"): NCCL's pick
among CollNet Direct/Chain, multi-node NVLS and NVLS_TREE against tuning.cc's costs worked by
hand, the closed form in a run, Megatron's DP-only scope, and the refusal without SHARP."""

from dataclasses import replace

import pytest
import simpy

from simsp.cluster.topology import build_topology
from simsp.engine.collectives import collnet
from simsp.engine.collectives.nccl_tuning import (ALL_GATHER, ALL_REDUCE, HOPPER, REDUCE_SCATTER,
                                                  sharp_time_us)
from simsp.engine.communicator import Communicator
from simsp.engine.group_timing import RING_ALONE, EveryGroup
from simsp.engine.network import Network
from simsp.errors import UserError
from simsp.hardware.constants import LinkCalibration
from simsp.metrics.sections import in_network_section
from simsp.report.run.in_network import in_network_lines
from simsp.scenario.loading import load_scenario
from simsp.shortcuts.check import Shortcuts
from simsp.training.driver.iteration import simulate_iteration

MiB = 2**20
# DGX H100, --use-sharp: 450 GB/s NVLink, NDR 50 GB/s NICs, Hopper
SHARP = LinkCalibration(nvls_nvlink_generation=4, sharp_collnet=True)


def _estimates_by_hand(nbytes: int, nodes: int) -> dict:
    """tuning.cc's estimates (us) on 8 H100s per node: every graph at 48 GB/s per channel
    (sm90SpeedArrayInter's first speed within NDR 50 GB/s and PCIe Gen5 x16 = 16 x 240 / 80
    = 48), 8 heads; CollNet Chain on the ring graph's 8 channels."""
    n = 8 * nodes
    ar = n / (2 * (n - 1))  # busbw -> algbw, n / nsteps
    nvls_tree_ch = min(48 * 0.85 * 7 / 8 * 2, 48 * (2 if nodes == 2 else 1),
                       57.7 if nodes == 2 else 45.5)
    bw = {"nvls": 8 * min(48 * 0.85 * 7 / 8 * 2, 48) * ar, "nvls_tree": 8 * nvls_tree_ch * ar,
          "collnet_direct": 8 * 48 * 0.85 * 0.5, "collnet_chain": 8 * 48 * 0.5}
    log2_nodes = {2: 1, 8: 3}[nodes]
    latency = {"nvls": 25 + 18, "nvls_tree": 25 + 2 * log2_nodes * 20.9,
               "collnet_direct": 2 * (3.7 + 7 * 0.4) + 31, "collnet_chain": 2 * 7 * 2.8 + 30}
    return {a: latency[a] + nbytes / (1000 * bw[a]) for a in bw}


@pytest.mark.parametrize("nodes, nbytes, expected", [
    (2, 64 * 1024, "nvls"), (2, MiB, "nvls"), (2, 256 * MiB, "nvls_tree"),
    (8, 256 * MiB, "nvls"), (8, 1024 * MiB, "nvls")])
def test_nccl_s_pick_is_the_cheapest_hand_worked_estimate(nodes, nbytes, expected):
    by_hand = _estimates_by_hand(nbytes, nodes)
    graphs = collnet.multinode_graphs(8, nodes, 450.0, 50.0, HOPPER)
    for algorithm, estimate in by_hand.items():
        assert sharp_time_us(ALL_REDUCE, algorithm, nbytes, 8 * nodes, nodes, graphs[algorithm],
                             HOPPER) == pytest.approx(estimate, rel=1e-12)
    assert min(by_hand, key=by_hand.get) == expected
    assert collnet.sharp_pick(nbytes, 8 * nodes, nodes, 450.0, 50.0, SHARP, 1e12) == expected
    # strictly faster than NCCL's ring or tree, else it keeps that
    best = by_hand[expected]
    assert collnet.sharp_pick(nbytes, 8 * nodes, nodes, 450.0, 50.0, SHARP, best) is None


def test_only_nvls_tree_without_collnet_nothing_forced_or_below_nvswitch_3():
    pick = lambda cal: collnet.sharp_pick(256 * MiB, 16, 2, 450.0, 50.0, cal, 1e12)
    # NCCL_NVLS_ENABLE's default leaves NVLS_TREE on every multi-node communicator; CollNet
    # and multi-node NVLS need NCCL_COLLNET_ENABLE (tuning.cc 500-510): at 1 MiB on 2 nodes
    # NVLS (48.12 us) wins with CollNet, NVLS_TREE (71.06) without
    no_collnet = replace(SHARP, sharp_collnet=False)
    assert pick(no_collnet) == "nvls_tree"
    assert collnet.sharp_pick(MiB, 16, 2, 450.0, 50.0, SHARP, 1e12) == "nvls"
    assert collnet.sharp_pick(MiB, 16, 2, 450.0, 50.0, no_collnet, 1e12) == "nvls_tree"
    assert collnet.sharp_pick(MiB, 16, 2, 450.0, 50.0, no_collnet, 71.0) is None
    assert collnet.sharp_pick(MiB, 16, 2, 450.0, 50.0, no_collnet, 1e12, REDUCE_SCATTER) is None
    assert pick(replace(SHARP, nccl_algo="ring")) is None
    assert pick(replace(SHARP, nccl_proto="LL128")) is None
    # DGX A100 (no NVLS): CollNet only, no x0.85: Direct 8 x 24 x 0.5 = 96 GB/s (PCIe Gen4
    # x16), 44 us; Chain on its searched graph, 8 x bwIntra 30 x 0.5 = 120 GB/s (pass 2 raises
    # a tree's bwIntra: tests/test_nccl_graph_search.py), 69.2 us: Direct at 1 MiB (54.9 us
    # against 77.9), Chain at 256 MiB (2306 us against 2840)
    a100 = replace(SHARP, nvls_nvlink_generation=0)
    assert collnet.sharp_pick(MiB, 16, 2, 300.0, 25.0, a100, 1e12) == "collnet_direct"
    assert collnet.sharp_pick(256 * MiB, 16, 2, 300.0, 25.0, a100, 1e12) == "collnet_chain"
    assert collnet.sharp_pick(256 * MiB, 16, 2, 300.0, 25.0,
                              replace(a100, sharp_collnet=False), 1e12) is None


def test_the_closed_form_by_hand():
    # NVLS_TREE, 2 nodes, 256 MiB: 66.8 us + max(NVLink S (1 + 1/8) at 450 x 0.78 x 0.85,
    # NIC S / 8 at 50 x 0.9) GB/s
    S = 256 * MiB
    time_s = collnet.sharp_all_reduce_time("nvls_tree", S, 16, 2, 450.0, 50.0, SHARP, 4)
    assert time_s == pytest.approx(66.8e-6 + max(S * 1.125 / (450e9 * 0.78 * 0.85),
                                                  S / 8 / 45e9), rel=1e-12)
    # beyond 2 nodes the tree carries 2 S / 8 per NIC; CollNet Direct 2 (7/8) S over NVLink
    assert collnet.sharp_all_reduce_time("nvls_tree", S, 64, 8, 450.0, 50.0, SHARP, 4) == \
        pytest.approx(150.4e-6 + max(S * 1.125 / (450e9 * 0.78 * 0.85), 2 * S / 8 / 45e9),
                      rel=1e-12)
    assert collnet.sharp_all_reduce_time("collnet_direct", S, 64, 8, 450.0, 50.0, SHARP, 4) \
        == pytest.approx(44e-6 + max(2 * 7 / 8 * S / (450e9 * 0.78), S / 8 / 45e9), rel=1e-12)
    # CollNet Chain: the same bytes, its own latency 2 x 7 x 2.8 + 30 us
    assert collnet.sharp_all_reduce_time("collnet_chain", S, 64, 8, 450.0, 50.0, SHARP, 4) \
        == pytest.approx(69.2e-6 + max(2 * 7 / 8 * S / (450e9 * 0.78), S / 8 / 45e9), rel=1e-12)


@pytest.mark.parametrize("collective", [REDUCE_SCATTER, ALL_GATHER])
def test_reduce_scatter_and_all_gather_picks_against_hand_worked_estimates(collective):
    """tuning.cc on 8 H100s a node, S the whole buffer (enqueue.cc: nRanks x count), busBw not
    converted to algbw: CollNet Direct 2 (3.7 + 7 x 0.4) + 31 = 44 us + S / (8 x min(48,
    0.9 x 48)); NVLS 25 + 18 = 43 us + S / (8 x min(40 x 0.85 x 7/8 x 7/8, 48)) on the
    searched NVLS graph (8 heads, bwIntra 40, bwInter 48: tests/test_nccl_graph_search.py);
    NVLS_TREE and Chain none."""
    def by_hand(nbytes):
        return {"collnet_direct": 44 + nbytes / (1000 * 8 * 43.2),
                "nvls": 43 + nbytes / (1000 * 8 * 40 * 0.85 * 7 / 8 * 7 / 8)}
    for nodes in (2, 8):
        graphs = collnet.multinode_graphs(8, nodes, 450.0, 50.0, HOPPER)
        for nbytes, expected in ((64 * 1024, "nvls"), (MiB, "collnet_direct"),
                                 (256 * MiB, "collnet_direct")):
            hand = by_hand(nbytes)
            for algorithm, estimate in hand.items():
                assert sharp_time_us(collective, algorithm, nbytes, 8 * nodes, nodes,
                                     graphs[algorithm], HOPPER) == pytest.approx(estimate,
                                                                                 rel=1e-12)
            assert sharp_time_us(collective, "nvls_tree", nbytes, 8 * nodes, nodes,
                                 graphs["nvls_tree"], HOPPER) is None
            assert min(hand, key=hand.get) == expected
            assert collnet.sharp_pick(nbytes, 8 * nodes, nodes, 450.0, 50.0, SHARP, 1e12,
                                      collective) == expected
            assert collnet.sharp_pick(nbytes, 8 * nodes, nodes, 450.0, 50.0, SHARP,
                                      hand[expected], collective) is None


def test_enqueue_s_local_rank_limits():
    # 36 GPUs a node: CollNet (Direct and Chain) needs <= 8, NVLS outside all-reduce <= 32
    # (enqueue.cc updateCollCostTable): nothing for a reduce-scatter, NVLS for an all-reduce
    assert collnet.sharp_pick(256 * MiB, 72, 2, 900.0, 50.0, SHARP, 1e12, REDUCE_SCATTER) \
        is None
    assert collnet.sharp_pick(256 * MiB, 72, 2, 900.0, 50.0, SHARP, 1e12) in ("nvls",
                                                                              "nvls_tree")


def test_reduce_scatter_and_all_gather_closed_forms_by_hand():
    # CollNet Direct: NVLink 7/8 S to and from the heads, NIC S/8; NVLS: NVLink S at
    # nvlsEfficiency (ld_reduce reads each slice once; the multicast writes each once)
    S = 256 * MiB
    for collective in (REDUCE_SCATTER, ALL_GATHER):
        assert collnet.sharp_all_reduce_time("collnet_direct", S, 16, 2, 450.0, 50.0, SHARP, 4,
                                             collective) == pytest.approx(
            44e-6 + max(S * 7 / 8 / (450e9 * 0.78), S / 8 / 45e9), rel=1e-12)
        assert collnet.sharp_all_reduce_time("nvls", S, 64, 8, 450.0, 50.0, SHARP, 4,
                                             collective) == pytest.approx(
            43e-6 + max(S / (450e9 * 0.78 * 0.85), S / 8 / 45e9), rel=1e-12)


def _sharp_communicator(sharp_groups):
    """A Communicator on 2 DGX H100 nodes with SHARP on, its CollNet on `sharp_groups`."""
    cluster = load_scenario(None, {("cluster", "system"): "dgx-h100", ("cluster", "nodes"): 2,
                                   ("cluster", "use_sharp"): True}).cluster
    env = simpy.Environment()
    comm = Communicator(env, Network(env, build_topology(cluster),
                                     LinkCalibration.from_cluster(cluster)),
                        timing_of=EveryGroup(RING_ALONE))
    comm.sharp_groups = sharp_groups
    return env, comm


def _all_reduce(gpus, nbytes, sharp_groups=None, name=""):
    """One all-reduce through the training loop's Communicator on 2 DGX H100 nodes, SHARP on."""
    env, comm = _sharp_communicator(sharp_groups)
    for rank in gpus:
        env.process(comm.all_reduce(tuple(gpus), rank, None, nbytes, "dp", name=name))
    env.run()
    return comm.stats[0]


def test_a_communicator_runs_the_pick_only_on_the_sharp_groups():
    S, group = 256 * MiB, tuple(range(16))
    stats = _all_reduce(group, S)
    assert (stats.algorithm, stats.protocol) == ("nvls_tree", "Simple")
    assert stats.time_s == collnet.sharp_all_reduce_time("nvls_tree", S, 16, 2, 450.0, 50.0,
                                                         SHARP, 4)
    # Megatron's --use-sharp: only the DP-CP groups' own communicators have CollNet, not
    # another group's, nor another communicator over the same ranks (the FP8 amax group's);
    # 1 MiB runs as NVLS with CollNet (48.12 us) and as NCCL's tree/LL128 without (70.3 us,
    # below NVLS_TREE's 71.06); 256 MiB is NVLS_TREE either way (no CollNet needed)
    assert _all_reduce(group, S, frozenset({group})).algorithm == "nvls_tree"
    assert _all_reduce(group, MiB, frozenset({group})).algorithm == "nvls"
    assert _all_reduce(group, MiB, frozenset({(0, 8)})).algorithm == "tree"
    assert _all_reduce(group, MiB, frozenset({group}), name="fp8_amax").algorithm == "tree"
    assert _all_reduce(group, S, frozenset({(0, 8)})).algorithm == "nvls_tree"


def _gathers(gpus, nbytes, sharp_groups=None):
    """A reduce-scatter then an all-gather of `nbytes` through the Communicator on 2 DGX H100
    nodes, SHARP on: their stats."""
    env, comm = _sharp_communicator(sharp_groups)

    def member(rank):
        yield from comm.reduce_scatter(tuple(gpus), rank, None, nbytes, "dp")
        yield from comm.all_gather(tuple(gpus), rank, None, nbytes, "dp")
    for rank in gpus:
        env.process(member(rank))
    env.run()
    return comm.stats


def test_a_communicator_runs_reduce_scatter_and_all_gather_in_the_network():
    # 32 MiB: NCCL's estimates on Hopper (tuning.cc): CollNet Direct 44 + S / 345.6 GB/s
    # (8 x min(48, 48 x 0.9)) = 141.1 us beats ring/Simple 70 + S / (8 x 48 x 16/15 GB/s) =
    # 151.9 us and ring/LL128 44.6 + S / (8 x 36.7 x 16/15) = 151.7 us (at 256 MiB the ring wins)
    S, group = 32 * MiB, tuple(range(16))
    rs, ag = _gathers(group, S, frozenset({group}))
    by_hand = 44e-6 + max(S * 7 / 8 / (450e9 * 0.78), S / 8 / 45e9)
    for stats, collective in ((rs, REDUCE_SCATTER), (ag, ALL_GATHER)):
        assert (stats.collective, stats.algorithm, stats.protocol) == (
            collective, "collnet_direct", "Simple")
        assert stats.end_s - stats.start_s == pytest.approx(by_hand, rel=1e-12)
    # not a DP-CP group: NCCL's ring
    assert [s.algorithm for s in _gathers(group, S, frozenset({(0, 8)}))] == ["ring", "ring"]


def _dp_run(use_sharp: bool, shortcuts: bool, distributed_optimizer: bool = False):
    """A tiny meta layout, t1 p1 d16 over 2 DGX H100 nodes: its one DP all-reduce's stats (the
    DP group's collectives' with the distributed optimizer)."""
    sc = load_scenario(None, {("parallel", "distributed_optimizer"): distributed_optimizer,
        ("cluster", "system"): "dgx-h100", ("cluster", "nodes"): 2,
        ("cluster", "use_sharp"): use_sharp, ("model", "num_layers"): 2,
        ("model", "hidden_size"): 256, ("model", "num_attention_heads"): 4,
        ("model", "seq_length"): 128, ("model", "vocab_size"): 512,
        ("parallel", "tensor_model_parallel_size"): 1,
        ("parallel", "pipeline_model_parallel_size"): 1, ("parallel", "data_parallel_size"): 16,
        ("parallel", "micro_batch_size"): 1, ("parallel", "global_batch_size"): 16,
        ("run", "mode"): "meta"})
    run = simulate_iteration(sc, Shortcuts.for_scale(sc) if shortcuts else Shortcuts(),
                             trace="none")
    dp = [s for s in run.inputs.world.comm.stats if len(s.gpus) == 16]
    return (dp, run) if distributed_optimizer else dp[0]


def test_a_run_s_distributed_optimizer_reduce_scatters_and_gathers_in_the_network():
    with_sharp, run = _dp_run(True, shortcuts=True, distributed_optimizer=True)
    assert {(s.collective, s.algorithm) for s in with_sharp} >= {
        (REDUCE_SCATTER, "collnet_direct"), (ALL_GATHER, "collnet_direct")}
    for stats in with_sharp:
        if stats.collective in (REDUCE_SCATTER, ALL_GATHER):  # 44 us + the NIC's S/8
            S = stats.nbytes
            by_hand = 44e-6 + max(S * 7 / 8 / (450e9 * 0.78), S / 8 / 45e9)
            assert stats.end_s - stats.start_s == pytest.approx(by_hand, rel=1e-12)
    without, plain_run = _dp_run(False, shortcuts=True, distributed_optimizer=True)
    assert {s.algorithm for s in without if s.collective != ALL_REDUCE} == {"ring"}
    # the run report says what ran in the network, and nothing without --use-sharp
    lines = in_network_lines(in_network_section(run))
    assert "| reduce-scatter | collnet_direct | yes | 1 |" in lines
    assert "| all-gather | collnet_direct | yes | 1 |" in lines
    assert in_network_section(plain_run) == {} and in_network_lines({}) == []


def test_a_run_s_dp_all_reduce_is_the_closed_form_with_and_without_shortcuts():
    stats = _dp_run(True, shortcuts=True)
    S = stats.nbytes  # the fp32 gradients of the layout's parameters
    assert stats.algorithm == "nvls"  # 43 us + S / 204.8 GB/s beats the ring and the others
    by_hand = 43e-6 + max(S * 1.125 / (450e9 * 0.78 * 0.85), S / 8 / 45e9)
    assert stats.end_s - stats.start_s == pytest.approx(by_hand, rel=1e-12)
    plain = _dp_run(True, shortcuts=False)
    assert (plain.algorithm, plain.end_s - plain.start_s) == ("nvls", stats.end_s - stats.start_s)
    # without --use-sharp NCCL_NVLS_ENABLE's default still weighs NVLS_TREE: 66.8 us + the
    # slower of NVLink S (1 + 1/8) at nvlsEfficiency and the NIC's S/8
    plain = _dp_run(False, shortcuts=True)
    assert plain.algorithm == "nvls_tree"
    assert plain.end_s - plain.start_s == pytest.approx(
        66.8e-6 + max(S * 1.125 / (450e9 * 0.78 * 0.85), S / 8 / 45e9), rel=1e-12)


def test_use_sharp_without_sharp_switches_is_one_error():
    with pytest.raises(UserError, match="cluster.use_sharp"):
        load_scenario(None, {("cluster", "use_sharp"): True})
    with pytest.raises(UserError, match="system dgx-h800 has none"):
        load_scenario(None, {("cluster", "use_sharp"): True,
                             ("cluster", "system"): "dgx-h800"})


def test_simsp_hardware_says_which_in_network_reductions_a_system_runs():
    from simsp.commands.hardware import describe
    assert describe("system", "dgx-h100")["in_network"].startswith(
        "NVLS in one node, NVLS_TREE across nodes; SHARPv3 in the switches: CollNet Direct/Chain "
        "and NVLS across nodes with --use-sharp")
    assert describe("system", "dgx-a100")["in_network"].startswith(
        "no NVLS (NVSwitch < 3); SHARPv2 in the switches: CollNet Direct/Chain across nodes")
    assert "no SHARP in the switches: --use-sharp refused" in \
        describe("system", "dgx-h800")["in_network"]


def test_a_tree_all_reduce_is_labelled_as_nccl_runs_it():
    # without SHARP, 1 MiB over 2 nodes runs as NCCL's tree with LL128 (tuning.cc: the tree's
    # latency beats the ring's 2(n-1) steps at this size); its stats say so, not "ring"
    stats = _all_reduce(tuple(range(16)), MiB, sharp_groups=frozenset())
    assert (stats.algorithm, stats.protocol) == ("tree", "LL128")
    assert stats.nchannels > 0
