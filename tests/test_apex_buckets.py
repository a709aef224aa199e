"""--bucket-cap-mb: Apex DistributedFusedAdam's buckets as NeMo lays them out, against sizes and
counts worked by hand from NVIDIA/apex distributed_fused_adam.py (810ffae3: bucket_cap_mb MiB of
grad_sync_dtype, the shard rounded down to 128 bytes' worth of elements, fragments aligned) and
NVIDIA/NeMo megatron_gpt_model.py configure_optimizers (one call per layer, in reverse; the first
layer's takes the rest; fp32 embedding gradients in buckets of their own)."""

import pytest

from simsp.errors import UserError
from simsp.model.sharding import needs_sp_grad_sync
from simsp.scenario.loading import load_scenario
from simsp.shortcuts.check import Shortcuts
from simsp.training.data_parallel.apex_buckets import (bucket_elements, buckets_filled,
                                                        layer_groups)
from simsp.training.driver.iteration import simulate_iteration


@pytest.mark.parametrize("cap,grad_bytes,d,elements", [
    (400, 2, 64, 209_715_200),  # 400 MiB / 2 B = 209,715,200 = 64 x 3,276,800 (64 | shard)
    (220, 2, 32, 115_343_360),  # 220 MiB / 2 B / 32 = 3,604,480 = 64 x 56,320
    (1, 2, 3, 524_160),  # 524,288 / 3 = 174,762.7 -> 174,762 -> down to 64 x 2730 = 174,720
    (0.001, 4, 2, 256)])  # 1048.576 B / 4 / 2 = 131.07 -> 131 -> down to 32 x 4 = 128
def test_bucket_elements(cap, grad_bytes, d, elements):
    """The shard int(cap MiB / bytes / d) rounded down to 128 / bytes elements, times d."""
    assert bucket_elements(cap, grad_bytes, d) == elements


@pytest.mark.parametrize("numels,count", [
    ([], 0), ([100, 100], 1),  # the second starts at 128, ends at 228 <= 256
    ([100, 200], 2),  # the second: 128 elements at 128..256, 72 in a new bucket
    ([256, 1], 2), ([600], 3)])
def test_buckets_filled(numels, count):
    """Buckets of 256 elements, fragments aligned to 64."""
    assert buckets_filled(numels, 256, 64) == count


def five_b():
    """NeMo's GPT3-5B row (t 1, d 64, 24 layers, h 4096) with NeMo's bucket_cap_mb 400."""
    from simsp.validation.runner import BUNDLED, data_path
    from simsp.validation.measurements import read_measurements
    from simsp.validation.scenarios import scenario_of
    mset = read_measurements(data_path(BUNDLED))
    row = next(r for r in mset.rows if r.scenario == "nemo-gpt3-5b")
    return scenario_of(mset, row, row.flags)


def test_gpt3_5b_buckets_by_hand():
    """A layer holds 12h² + 13h = 201,379,840 weights: one bucket of 209,715,200 each (BF16
    gradients) for layers 23..1; layer 0's call takes the word and position embeddings (fp32
    gradients: 50,257 x 4096 + 2048 x 4096 = 214,241,280 > 209,715,200, two buckets) and the
    rest (layer 0 and the final norm, one). Every bucket is reduce-scattered and gathered whole
    over d = 64: (63/64) x elements x bytes sent per rank."""
    sc = five_b()
    assert sc.parallel.bucket_cap_mb == 400
    run = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none")
    rank, state = next(iter(run.states.items()))
    buckets = state.ddp_buckets.buckets
    assert [b.grad_bytes for b in buckets] == [2] * 23 + [4, 4, 2]
    assert {b.numel for b in buckets} == {209_715_200}
    assert [len(b.names) for b in buckets] == [12] * 23 + [16] * 3
    sent = run.inputs.world.ranks[rank].comm_bytes
    assert sent[("backward", "reduce_scatter_dp")] == 63 * 209_715_200 * (23 * 2 + 2 * 4 + 2) // 64
    gathered = sum(v for (phase, kind), v in sent.items() if kind == "all_gather_dp")
    assert gathered == 63 * 209_715_200 * 26 * 2 // 64


def test_sequence_parallel_gradients_go_to_the_first_layers_call():
    """llama-tiny (TP 2 + SP, PP 2, DP 2), stage 0: its layers' calls hold no SP-partial
    parameter (NeMo disables their overlapped sync); the last call (its first layer) holds them
    and everything else; the calls partition the rank's parameters."""
    sc = load_scenario("scenarios/llama-tiny.toml", {
        ("run", "mode"): "meta", ("parallel", "distributed_optimizer"): True,
        ("parallel", "overlap_grad_reduce"): True, ("parallel", "bucket_cap_mb"): 1.0})
    run = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none")
    state = run.states[0]
    groups = layer_groups(state.ddp_buckets.plan, state.grads, True)
    names = [n for _, group in groups for n in group]
    assert sorted(names) == sorted(state.grads) and len(names) == len(set(names))
    assert not any(needs_sp_grad_sync(n) for _, group in groups[:-1] for n in group)
    assert any(needs_sp_grad_sync(n) for n in groups[-1][1])
    assert "embedding.word" in groups[-1][1]


@pytest.mark.parametrize("parallel,reason", [
    ({"distributed_optimizer": False}, "needs distributed_optimizer"),
    ({"distributed_optimizer": True, "ddp_bucket_size": 1000}, "replaces ddp_bucket_size")])
def test_refusals(parallel, reason):
    overrides = {("parallel", k): v for k, v in parallel.items()}
    overrides[("parallel", "bucket_cap_mb")] = 100.0
    with pytest.raises(UserError) as caught:
        load_scenario("scenarios/llama-tiny.toml", overrides)
    assert caught.value.field == "parallel.bucket_cap_mb"
    assert reason in str(caught.value)


SMALL = ["scenarios/paper-22b.toml", "--micro-batch-size", "1", "--system", "dgx-h100",
         "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "512",
         "--num-layers", "4", "--tensor-model-parallel-size", "4", "--sequence-parallel",
         "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
         "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
         "--global-batch-size", "16", "--world-size", "32", "--mode", "meta"]


@pytest.mark.parametrize("flags", [["--bucket-cap-mb", "1"], ["--bucket-cap-mb", "16"],
                                   ["--bucket-cap-mb", "3", "--grad-reduce-in-bf16"]])
def test_work_counts_count_the_buckets_the_ranks_build(flags):
    """The work estimate's count per stage (shortcuts/bucket_counts.py stage_buckets, from the
    scenario's sizes) against the buckets every simulated rank builds (t 4 SP, p 2, v 2, d 4,
    tied embeddings: stage 0 holds the tables' fp32 buckets, stage 1 its copy of the word
    table)."""
    from simsp.cli import build_parser
    from simsp.cluster.grid import RankGrid
    from simsp.scenario.outside import scenario_from_args
    from simsp.shortcuts.bucket_counts import stage_buckets
    sc = scenario_from_args(build_parser().parse_args(["run", *SMALL, *flags]))
    run = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none")
    grid = RankGrid(sc.parallel.tp, sc.parallel.pp, sc.parallel.dp, sc.parallel.cp)
    for rank, state in run.states.items():
        built = state.ddp_buckets.buckets
        assert any(b.grad_bytes == 4 for b in built)  # the embeddings' fp32 buckets
        assert stage_buckets(sc, grid.coords(rank).pp) == len(built), (rank, flags)
