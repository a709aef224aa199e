"""The work estimate's counts (simsp/shortcuts/work_counts.py) against what the engine counted:
the flows the stepped rings start on the links (engine/network.py flows_started), on small
layouts that use each mechanism the per-layer-step price misses (TP rings sharing NVLink ports
with overlapped DP traffic so layer templates are off, the DP rings stepped beside them, every
ring stepped without shortcuts, with and without sequence parallelism, FSDP rings stepped beside
the pipeline sends). The estimate leaves out the pipeline sends, the loss's small collectives and
FSDP's root units, so it may fall short, never by half."""

import pytest

from simsp.cli import build_parser
from simsp.scenario.outside import scenario_from_args
from simsp.scenario.work import bucket_count
from simsp.cluster.grid import RankGrid
from simsp.scenario.loading import load_scenario
from simsp.shortcuts.bucket_counts import stage_buckets
from simsp.shortcuts.work_counts import cp_gather_flows, estimated_counts, ring_flows
from simsp.training.driver.iteration import Shortcuts, simulate_iteration

H100 = ["scenarios/paper-22b.toml", "--micro-batch-size", "1", "--system", "dgx-h100",
        "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "512"]
FSDP_T8 = H100 + ["--num-layers", "4", "--tensor-model-parallel-size", "8",
                  "--sequence-parallel", "--pipeline-model-parallel-size", "2",
                  "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                  "optim_grads_params", "--global-batch-size", "8", "--world-size", "64"]
CASES = {  # label -> (flags, shortcuts on)
    "t4 SP p2 interleaved d4, overlapped DP (templates off)": (H100 + [
        "--num-layers", "4", "--tensor-model-parallel-size", "4", "--sequence-parallel",
        "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
        "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
        "--global-batch-size", "16", "--world-size", "32"], True),
    "no shortcuts, t4 SP d2": (H100 + [
        "--num-layers", "2", "--tensor-model-parallel-size", "4", "--sequence-parallel",
        "--global-batch-size", "4", "--world-size", "8"], False),
    "no shortcuts, t4 without SP, full recompute, d2": (H100 + [
        "--num-layers", "2", "--tensor-model-parallel-size", "4", "--no-sequence-parallel",
        "--recompute-granularity", "full", "--global-batch-size", "4", "--world-size", "8"],
        False),
}  # t8 p2 d4 FSDP (FSDP_T8): its pieces' steps run in arithmetic (test below)


def scenario(flags: list[str]):
    """The scenario `simsp run FLAGS --mode meta` would simulate."""
    return scenario_from_args(build_parser().parse_args(["run", *flags, "--mode", "meta"]))


@pytest.mark.parametrize("case", CASES)
def test_estimated_flows_within_a_factor_of_two_of_the_flows_the_run_starts(case):
    flags, shortcuts_on = CASES[case]
    sc = scenario(flags)
    shortcuts = Shortcuts.for_scale(sc) if shortcuts_on else Shortcuts()
    run = simulate_iteration(sc, shortcuts, trace="none")
    measured = run.inputs.world.network.flows_started
    counts = estimated_counts(sc, shortcuts)
    estimated = counts.flows + counts.fsdp_flows + counts.piece_flows
    assert measured > 0
    assert 0.5 <= measured / estimated <= 2, (measured, estimated)


def test_a_ring_phase_starts_channels_times_positions_times_steps_flows():
    """Hand-counted: 4 GPUs of one node are one channel, 4 positions x 3 steps; 4 GPUs on two
    nodes (2 each) are 2 channels (one per member a node holds): 2 x 4 x 3."""
    assert ring_flows((0, 1, 2, 3), 8) == 12
    assert ring_flows((0, 1, 8, 9), 8) == 24


def test_fsdp_rings_count_a_ring_phase_or_a_piece_per_collective():
    """Hand-counted: t8 p2 d4 ZeRO-3, 2 layers per stage, 2 micro-batches: per stage and layer
    two gathers and a reduce-scatter per micro-batch (12 collectives) on DP rings of 4 nodes,
    one member each, one channel. With the shortcuts the representative's ring meets only the
    pipeline sends and runs as a piece, 1 position x 3 steps, in arithmetic while only pieces
    use its NIC (engine/collectives/step_trains.py): 2 stages x 12 x 3 = 72 steps and no
    flows; the run starts only the pipeline sends and the steps a send met; without them
    every stage's 8 rings step whole, 4 positions x 3 steps: 2 x 8 x 12 x 12 = 2,304."""
    sc = scenario(FSDP_T8)
    shortcuts = Shortcuts.for_scale(sc)
    counts = estimated_counts(sc, shortcuts)
    assert (counts.flows, counts.fsdp_flows, counts.piece_flows) == (0, 0, 0)
    assert (counts.train_steps, counts.train_collectives) == (72, 24)
    assert simulate_iteration(sc, shortcuts, trace="none").inputs.world.network \
        .flows_started < counts.train_steps
    assert estimated_counts(sc, Shortcuts()).fsdp_flows == 2304


def test_templated_layouts_count_no_flows():
    """22B as published (t 8 in one node, nothing beside its rings): every ring timed whole."""
    sc = scenario(["scenarios/paper-22b.toml"])
    assert estimated_counts(sc, Shortcuts.for_scale(sc)).flows == 0


def test_buckets_close_once_they_hold_the_bucket_size():
    """Hand-worked: h 1024, f 4096, t 1, 4 layers, v 128, d 64: the bucket is max(40e6, 64e6)
    parameters; a layer's matrices are 3M, 1M, 4M and 4M (M = 2^20; its biases and norms under
    0.01M), 48.2M in all with the 0.125M embedding: one bucket; at --ddp-bucket-size 5M they
    close after 3+1+4, then 4+3, 1+4 three times, and the last 4M with the embedding and the
    final norm stays open: 8 buckets."""
    flags = ["scenarios/paper-22b.toml", "--hidden-size", "1024", "--num-attention-heads", "16",
             "--num-layers", "4", "--vocab-size", "128", "--tensor-model-parallel-size", "1",
             "--no-sequence-parallel", "--overlap-grad-reduce", "--global-batch-size", "256", "--world-size", "64"]
    m = 2 ** 20
    assert bucket_count(scenario(flags)) == 1
    assert bucket_count(scenario(flags + ["--ddp-bucket-size", str(5 * m)])) == 8


def test_each_stage_counts_the_buckets_its_ranks_build():
    """Megatron-LM distributed_data_parallel.py cuts only the first stage's first model chunk at
    the bucket size. t 4 SP, p 2 interleaved (v 2), d 4, distributed optimizer, tied
    embeddings: the last stage has one bucket per chunk and one for its copy of the word
    embedding, 2 + 1 = 3 (hand-counted); the first stage, at a 1M bucket, its first chunk's one
    layer walked in reverse (fc2 4M/4 = 1M closes one, fc1 1M closes one, the projection, QKV
    and small tensors 1M closes one; M = 2^20) then the position table (0.5M) and the word
    embedding (12.5M) close a fourth, plus one for its second chunk: 5. Both against the
    buckets the engine builds on each simulated rank."""
    flags, _ = CASES["t4 SP p2 interleaved d4, overlapped DP (templates off)"]
    sc = scenario(flags + ["--ddp-bucket-size", str(2 ** 20)])
    run = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none")
    assert (stage_buckets(sc, 0), stage_buckets(sc, 1)) == (5, 3)
    grid = RankGrid(sc.parallel.tp, sc.parallel.pp, sc.parallel.dp, sc.parallel.cp)
    for rank in sorted(run.results.end_s):
        stage = grid.coords(rank).pp
        built = len(run.states[rank].ddp_buckets.buckets)
        assert stage_buckets(sc, stage) == built, (rank, stage, built)


def test_the_last_stage_counts_the_mtp_depths_copy_of_the_word_table():
    """An untied model with a multi-token prediction depth: the last stage embeds for the MTP
    depths (training/pipeline/plan.py stage_param_names), so under the distributed optimizer
    its copy of the word table is a bucket of its own, as the first stage's table is not
    (tiny t2 p2 d2: 1 bucket on stage 0, the chunk's and the copy's 2 on stage 1), against
    the buckets the engine builds on every rank."""
    sc = scenario(["scenarios/tiny.toml", "--position-embedding-type", "rope",
                   "--untie-embeddings-and-output-weights", "--mtp-num-layers", "1",
                   "--use-distributed-optimizer"])
    run = simulate_iteration(sc, Shortcuts(), trace="none")
    grid = RankGrid(sc.parallel.tp, sc.parallel.pp, sc.parallel.dp, sc.parallel.cp)
    built = {grid.coords(rank).pp: len(run.states[rank].ddp_buckets.buckets)
             for rank in run.results.end_s}
    assert built == {0: 1, 1: 2} == {stage: stage_buckets(sc, stage) for stage in (0, 1)}


def test_rings_run_as_pieces_count_the_hops_they_run():
    """t4 SP p2 interleaved d4 on 8-GPU nodes: one rank per stage runs (the quotient by rail
    symmetry), each ring as the hops it sends: a TP ring of 4 in one node (one channel) 1 hop a
    step, 3 a phase against 4 x 3 whole; a DP ring of 4 on two nodes (2 channels) 2 hops a
    step, 2 x 3 against 2 x 4 x 3."""
    from simsp.shortcuts.work_counts import phase_flows

    sc = scenario(CASES["t4 SP p2 interleaved d4, overlapped DP (templates off)"][0])
    flows = phase_flows(Shortcuts.for_scale(sc), 8)
    assert (flows((0, 1, 2, 3)), flows((0, 4, 8, 12))) == (3, 6)
    assert (ring_flows((0, 1, 2, 3), 8), ring_flows((0, 4, 8, 12), 8)) == (12, 24)


def moe_flags(ep: int, pp: int) -> list[str]:
    """2 MoE layers per stage (one expert per EP rank), alltoall dispatcher, EP = d = `ep` on
    each of `pp` stages (benchmarks/scale.py a2a-dispatch's layout)."""
    return ["scenarios/tiny.toml", "--num-layers", str(2 * pp), "--seq-length", "256",
            "--disable-bias-linear", "--num-experts", str(ep), "--tensor-model-parallel-size", "1",
            "--pipeline-model-parallel-size", str(pp), "--no-sequence-parallel",
            "--expert-model-parallel-size", str(ep), "--moe-token-dispatcher-type", "alltoall",
            "--micro-batch-size", "1", "--global-batch-size", str(2 * ep),
            "--world-size", str(ep * pp)]


@pytest.mark.parametrize("ep, pp, flows", [(16, 1, 16 * 15), (8, 2, 8 * 7)])
def test_all_to_alls_timed_alone_count_the_flows_their_private_runs_start(ep, pp, flows):
    """Hand-counted: uniform routing, so every dispatch and combine of an EP group sends one
    matrix, timed alone once per placement (engine/exchanges.py): EP 16 on two nodes, one
    group, 16 x 15 transfers; EP 8 on each of two stages' nodes, both groups one placement up
    to moving by whole nodes, 8 x 7 once. Equal to the flows the private runs started."""
    sc = scenario(moe_flags(ep, pp))
    shortcuts = Shortcuts.for_scale(sc)
    run = simulate_iteration(sc, shortcuts, trace="none")
    counts = estimated_counts(sc, shortcuts)
    assert counts.a2a_flows == flows == run.inputs.world.comm.alone_flows
    assert counts.checked_members == pp * ep  # every EP group's members


# TE's userbuffers with every method the exchanges take: aggregate ring-exchange all-gather,
# ring-exchange reduce-scatters (proj forward, qkv dgrad), a pipelined dgrad reduce-scatter
UB_CFG = """
[qkv_fprop]
aggregate = 1
[proj_fprop]
method = "ring_exchange"
[qkv_dgrad]
method = "ring_exchange"
[fc1_dgrad]
method = "pipeline"
num_splits = 2
"""
EXCHANGE = (" ring ", " pair ", " p2p ")  # the labels of TE's exchange steps (base/tp_overlap.py)


def flow_labels(sc, shortcuts) -> tuple[int, list[str]]:
    """The flows one meta iteration starts and the labels of its transfers (every transfer is
    a flow; ring steps recorded where every rank runs, engine/network.py)."""
    run = simulate_iteration(sc, shortcuts, trace="none")
    network = run.inputs.world.network
    return network.flows_started, [tr.label for tr in network.transfers]


T4_P2 = H100 + ["--num-layers", "4", "--tensor-model-parallel-size", "4", "--sequence-parallel",
                "--pipeline-model-parallel-size", "2", "--global-batch-size", "8",
                "--world-size", "16"]
T2 = H100 + ["--num-layers", "4", "--tensor-model-parallel-size", "2", "--sequence-parallel",
             "--global-batch-size", "4", "--world-size", "4"]
MOE_2_OF_4 = ["--num-experts", "4", "--expert-model-parallel-size", "2", "--moe-layer-freq",
              "[0,1,0,1]", "--disable-bias-linear"]
EXCHANGE_CASES = {  # label -> (flags, shortcuts on, UB_CFG, exchange flows hand-counted)
    # a step is t(t − 1) = 12 flows; the quotient runs one rank per stage (2 TP groups), 8
    # layer-steps each; TE's defaults: 4 AG sites x 3 steps
    "t4 p2 interleaved d4, the quotient": (
        CASES["t4 SP p2 interleaved d4, overlapped DP (templates off)"][0], True, False,
        2 * 8 * 12 * 12),
    # UB_CFG: forward qkv's AG in t/2 = 2 steps, fc1's AG and proj's RS 3 each (fc2's
    # pipelined: rings); backward proj's and fc2's AG and qkv's dgrad RS 3 each (fc1's
    # pipelined): 17 steps x 12 flows x 2 TP groups x 4 layer-steps (2 layers, 2 micro-batches)
    "t4 d2, every exchange method, no shortcuts": (CASES["no shortcuts, t4 SP d2"][0], False,
                                                   True, 17 * 12 * 2 * 4),
    # t 4 in one node, nothing beside: layer templates record one layer's forward and
    # backward once (model/replay.py), 4 AG sites x 3 steps x 12 flows
    "t4 p2 templated": (T4_P2, True, False, 12 * 12),
    # t 2 (2 flows a step, 1 step an AG), 2 TP groups, 2 micro-batches: the MoE layers' experts
    # are not TE's GEMMs, so 2 steps there (qkv fprop, proj dgrad), 4 in the dense layers:
    # (2 x 2 + 2 x 4) x 2 x 2 x 2
    "t2 d2, MoE every other layer, no shortcuts": (T2 + MOE_2_OF_4, False, False,
                                                   (2 * 2 + 2 * 4) * 2 * 2 * 2),
    # selective recompute of the MLP runs fc1's forward again: 5 steps a layer,
    # 4 layers x 2 micro-batches x 2 TP groups x 2 flows
    "t2 d2, MLP recomputed, no shortcuts": (T2 + ["--recompute-granularity", "selective",
                                                  "--recompute-modules", "core_attn mlp"],
                                            False, False, 5 * 4 * 2 * 2 * 2),
}


@pytest.mark.parametrize("case", EXCHANGE_CASES)
def test_te_exchanges_count_every_pair_of_each_step(case, tmp_path):
    """--tp-comm-overlap: the exchange steps' flows equal the hand count and the transfers the
    run labels as exchange steps; on dense layers without the MLP recomputed (where the
    estimate's ring phases are exact) the overlap changes the run's flows by exactly what it
    changes the estimate's (ring phases moved to exchanges or split; what the estimate leaves
    out, pipeline sends and the loss's collectives, is alike with and without)."""
    flags, shortcuts_on, cfg, exchanges = EXCHANGE_CASES[case]
    overlap = ["--tp-comm-overlap"]
    if cfg:
        (tmp_path / "ub.toml").write_text(UB_CFG)
        overlap += ["--tp-comm-overlap-cfg", str(tmp_path / "ub.toml"),
                    "--tp-comm-overlap-rs-dgrad"]
    estimated, measured = [], []
    # the estimate's ring phases are exact for dense layers without the MLP recomputed
    compared = "MoE" not in case and "recomputed" not in case
    for extra in ([], overlap) if compared else (overlap,):
        sc = scenario(flags + extra)
        shortcuts = Shortcuts.for_scale(sc) if shortcuts_on else Shortcuts()
        flows, labels = flow_labels(sc, shortcuts)
        counts = estimated_counts(sc, shortcuts)
        estimated.append(counts.flows + counts.exchange_flows)
        measured.append(flows)
    assert counts.exchange_flows == exchanges
    assert sum(any(tag in label for tag in EXCHANGE) for label in labels) == exchanges
    if compared:
        assert measured[1] - measured[0] == estimated[1] - estimated[0]


def cp_gather_scenario(recompute: str):
    """t 2, cp 2 (--cp-comm-type allgather), d 2 on 4-GPU nodes with --overlap-grad-reduce: the
    gradient rings meet the K/V all-gathers, so the CP groups step (tests/test_cp_shortcuts.py's
    layout); 2 layers, 2 micro-batches."""
    parallel = {"tensor_model_parallel_size": 2, "context_parallel_size": 2,
                "cp_comm_type": "allgather", "data_parallel_size": 2, "global_batch_size": 4,
                "overlap_grad_reduce": True, "distributed_optimizer": True,
                "ddp_bucket_size": 20_000, "sequence_parallel": True,
                "recompute_granularity": recompute}
    overrides = {("model", "num_layers"): 2, ("model", "hidden_size"): 96,
                 ("model", "num_attention_heads"): 12, ("model", "seq_length"): 96,
                 ("model", "group_query_attention"): True, ("model", "num_query_groups"): 4,
                 ("model", "attention_backend"): "flash", ("model", "vocab_size"): 256,
                 ("run", "mode"): "meta", ("cluster", "gpus_per_node"): 4,
                 ("cluster", "nodes"): 2}
    overrides.update({("parallel", k): v for k, v in parallel.items()})
    return load_scenario(None, overrides)


@pytest.mark.parametrize("recompute, phases", [("none", 3), ("selective", 4), ("full", 4)])
def test_cp_all_gather_rings_count_their_phases(recompute, phases):
    """Hand-counted: per layer-step a CP all-gather group gathers K/V forward and again
    backward and reduce-scatters dK/dV (the forward's gather again where the core attention is
    recomputed: full, or selective's default core_attn), each
    a ring phase of 2 positions x 1 step; the 4 CP groups all step, 4 layer-steps: 4 x 4 x
    phases x 2 flows, equal to the CP transfers the run starts."""
    sc = cp_gather_scenario(recompute)
    shortcuts = Shortcuts.for_scale(sc)
    grid = RankGrid(2, 1, 2, 2)
    stepped = {group for group, method in shortcuts.methods if method == "step_by_step"}
    assert set(grid.groups("cp")) <= stepped
    _, labels = flow_labels(sc, shortcuts)
    sent = sum("cp_kv_gather" in label or "cp_dkv" in label for label in labels)
    counted = cp_gather_flows(sc, shortcuts, range(grid.world_size), stepped)
    assert counted == sent == 4 * 4 * phases * 2


def test_flow_visits_count_the_flows_each_solve_takes_up():
    """Two 1 MB transfers out of GPU 0 share its NVLink from t = 0: one solve of both (2
    visits); when they drain together the solve after finds none draining (0); a third started
    alone later is one solve of one flow: 3 visits in all (engine/network.py flow_visits)."""
    import simpy
    from simsp.cluster.topology import build_topology
    from simsp.engine.network import Network
    from simsp.scenario.config import Cluster
    env = simpy.Environment()
    network = Network(env, build_topology(Cluster(nodes=1)))

    def later():
        yield env.timeout(1.0)
        yield network.transfer(0, 3, 1_000_000)

    network.transfer(0, 1, 1_000_000)
    network.transfer(0, 2, 1_000_000)
    env.process(later())
    env.run()
    assert network.flow_visits == 3


@pytest.mark.parametrize("batch", [32, 64])
def test_ep_visits_estimate_the_solves_flows_under_the_quotient(batch):
    """Under the quotient with EP groups (DeepSeek-V3's stage scaled down, DualPipe) the
    estimate of the flows (classes) the fair-share solves take up (work_counts.ep_visits) is
    within a factor of 2 of the count the run reports (measured 2,212 and 5,178 against 2,560
    and 6,140 estimated; 2,424 and 5,586 before flow classes)."""
    from test_shortcut_ep_quotient import moe_layout
    sc = moe_layout("dualpipe", 4, 1, 8, 8, global_batch_size=batch)
    shortcuts = Shortcuts.for_scale(sc)
    run = simulate_iteration(sc, shortcuts, trace="none")
    measured = run.inputs.world.network.flow_visits
    estimate = estimated_counts(sc, shortcuts).flow_visits
    assert measured / 2 <= estimate <= 2 * measured, (estimate, measured)


def test_gather_flows_count_the_token_count_all_gathers_under_the_quotient():
    """The EP groups' token-count all-gathers run as ring pieces under the quotient, one per
    forward of each MoE layer-step: doubling the micro-batches adds exactly the flows the
    estimate adds (work_counts.gather_flows), the DP ring's all-gathers (per bucket, not per
    micro-batch) staying as they were."""
    from test_shortcut_ep_quotient import moe_layout
    from simsp.engine.network import Network
    started = []
    transfer = Network.transfer

    def counted(self, *args, **kwargs):
        started.append(kwargs.get("label", args[3] if len(args) > 3 else ""))  # (src, dst,
        # nbytes, label)
        return transfer(self, *args, **kwargs)

    measured, estimated = [], []
    Network.transfer = counted
    try:
        for batch in (32, 64):
            sc = moe_layout("dualpipe", 4, 1, 8, 8, global_batch_size=batch)
            shortcuts = Shortcuts.for_scale(sc)
            started.clear()
            simulate_iteration(sc, shortcuts, trace="none")
            measured.append(sum(label.startswith("all_gather") for label in started))
            estimated.append(estimated_counts(sc, shortcuts).gather_flows)
    finally:
        Network.transfer = transfer
    assert measured[1] - measured[0] == estimated[1] - estimated[0] == 16 * 4 * 7
