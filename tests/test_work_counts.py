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
from simsp.shortcuts.work_counts import estimated_counts, ring_flows, stage_buckets
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
    matrix, timed alone once per placement (engine/communicator.py): EP 16 on two nodes, one
    group, 16 x 15 transfers; EP 8 on each of two stages' nodes, both groups one placement up
    to moving by whole nodes, 8 x 7 once. Equal to the flows the private runs started."""
    sc = scenario(moe_flags(ep, pp))
    shortcuts = Shortcuts.for_scale(sc)
    run = simulate_iteration(sc, shortcuts, trace="none")
    counts = estimated_counts(sc, shortcuts)
    assert counts.a2a_flows == flows == run.inputs.world.comm.alone_flows
    assert counts.checked_pairs == pp * ep * (ep - 1)  # every EP group's ordered pairs
