"""--overlap-param-gather-with-optimizer-step timed by hand: Megatron-LM's ChainedOptimizer
steps the first model chunk's dense parameters, issues that chunk's all-gather at once
(megatron/core/optimizer/optimizer.py _step, d98e8a64), then steps the other chunks; the
interleaved schedule then issues only chunk 1 at the start (DDP.start_param_sync returns early
for the first chunk), and bucketing is off for every chunk (megatron/training/training.py)."""

from hypothesis import given, settings, strategies as st
import pytest

from simsp.errors import UserError
from simsp.scenario.loading import load_scenario, with_overrides
from simsp.engine.collectives.ring_timing import collective_time
from simsp.hardware.costmodel import kernel_time
from simsp.training.data_parallel.grad_buckets import DDPBuckets
from simsp.training.data_parallel.optimizer import allocate_optimizer, chained_step
from simsp.model.tensor import FP16, Tensor

from tests.test_param_gather_ahead import (EMBEDDING_S, LAYER_S, interleaved_overrides,
                                           interleaved_world, run_forwards)
from tests.test_shortcut_layouts import assert_same, fast_and_full, layout_scenario

ADAM_BYTES = 16 + 12 + 2  # reads grad, master, m, v (4 B); writes master, m, v, the 2-B weight


def step_world():
    """p = 2, v = 2, d = 2, stage 0: chunk 0 = embedding + layer 0, chunk 1 = layer 2."""
    return interleaved_world(overlap_param_gather_with_optimizer_step=True)


def gather_s(world, numel: int) -> float:
    """One bucket's ring all-gather of 2-byte parameters over the 2 DP ranks."""
    return collective_time("all_gather", world.network.graph, [0, 1], 2 * numel,
                           world.network.calibration, 2)


def padded(numel: int) -> int:
    """Megatron pads a distributed-optimizer bucket to lcm(d, 128) = 128 elements (d = 2)."""
    return -(-numel // 128) * 128


def test_every_chunk_is_one_bucket():
    """Bucketing off (training.py per_chunk_disable_bucketing): the 49,984-parameter bucket
    size that cuts chunk 0 in two without the flag leaves it whole; one bucket per chunk."""
    sc, world, plan, grads = step_world()
    sync = DDPBuckets(world.ranks[0], sc.parallel, world.grid, plan, grads)
    chunk0 = [n for n in grads if n.startswith(("embedding.", "layers.0."))]
    chunk1 = [n for n in grads if n.startswith("layers.2.")]
    assert [(b.chunk, set(b.names)) for b in sync.buckets] == [(0, set(chunk0)), (1, set(chunk1))]
    assert sync.buckets[0].numel == padded(sum(grads[n].numel for n in chunk0))
    assert sync.first_chunk_dense() == set(chunk0)
    sc2, world2, plan2, grads2 = interleaved_world()  # without the flag: chunk 0 cut in two
    assert len(DDPBuckets(world2.ranks[0], sc2.parallel, world2.grid, plan2, grads2).buckets) == 3


def test_forwards_wait_only_for_chunk_one_by_hand():
    """Chunk 0 was gathered by the step before: the schedule issues chunk 1 alone at time 0
    (E1); the forwards of chunk 0 (2 x (10 + 40) µs) wait for nothing, chunk 1's first forward
    at 100 µs waits for E1 if it is later."""
    sc, world, plan, grads = step_world()
    sync = DDPBuckets(world.ranks[0], sc.parallel, world.grid, plan, grads)
    e1 = gather_s(world, sync.buckets[1].numel)
    chunk1_start = 2 * (EMBEDDING_S + LAYER_S)
    end = run_forwards(world, plan, sync)
    assert end == pytest.approx(max(chunk1_start, e1) + 2 * LAYER_S, rel=1e-9)
    assert e1 < chunk1_start  # chunk 1's gather hidden behind chunk 0's forwards
    assert world.ranks[0].exposed_s.get("dp_comm", 0.0) == 0.0  # nothing waited on
    assert sync.overlap_report()["all_gather"]["comm_s"] == pytest.approx(e1, rel=1e-9)


def test_chained_step_issues_chunk_zero_between_the_two_steps_by_hand():
    """The gradient norm over both chunks' shards (N: 4 B per shard parameter, read once), Adam
    over chunk 0's shard (S1 = its parameters / 2, each rounded up, at 30 B each), then chunk
    0's all-gather G0 on the DP stream from N + S1, beside Adam over chunk 1's shard (S2); the
    iteration ends at N + S1 + max(S2, G0), the tail max(G0 − S2, 0) waited on (exposed
    dp_comm), the norm and the two steps exposed as optimizer time."""
    sc, world, plan, grads = step_world()
    r, env = world.ranks[0], world.env
    sync = DDPBuckets(r, sc.parallel, world.grid, plan, grads)
    weights = {n: Tensor.meta(g.shape, FP16, n) for n, g in grads.items()}
    optimizer = allocate_optimizer(r, weights, shard_over=2)
    first = sync.first_chunk_dense()
    s1 = kernel_time("elementwise", 0, ADAM_BYTES * sum(-(-grads[n].numel // 2) for n in first),
                     cal=r.compute_cal)
    s2 = kernel_time("elementwise", 0, ADAM_BYTES * sum(-(-grads[n].numel // 2)
                                                         for n in grads if n not in first),
                     cal=r.compute_cal)
    norm = kernel_time("elementwise", 0, 4 * sum(-(-g.numel // 2) for g in grads.values()),
                       cal=r.compute_cal)
    g0 = gather_s(world, sync.buckets[0].numel)
    done = []

    def program():
        yield from chained_step(r, optimizer, weights, grads, sync)
        done.append(env.now)

    env.process(program())
    env.run()
    assert g0 > s2  # the tiny layout's gather outlasts the second step: a tail is exposed
    assert done == [pytest.approx(norm + s1 + max(s2, g0), rel=1e-9)]
    assert r.exposed_s["optimizer"] == pytest.approx(norm + s1 + s2, rel=1e-9)
    assert r.exposed_s["dp_comm"] == pytest.approx(g0 - s2, rel=1e-9)
    report = sync.overlap_report()["all_gather"]
    assert report["hidden_s"] == pytest.approx(s2, rel=1e-9)


@pytest.mark.parametrize("parallel,reason", [
    ({"distributed_optimizer": False, "overlap_param_gather": False},
     "only supported with distributed optimizer"),
    ({"overlap_param_gather": False}, "needs overlap_param_gather"),
    ({"num_layers_per_virtual_pipeline_stage": None, "overlap_p2p_communication": False},
     "only supported with interleaved pipeline parallelism")])
def test_megatrons_refusals_in_its_order(parallel, reason):
    """megatron/training/arguments.py (d98e8a64): distributed optimizer, then
    --overlap-param-gather, then interleaving."""
    overrides = interleaved_overrides(overlap_param_gather_with_optimizer_step=True, **parallel)
    with pytest.raises(UserError) as caught:
        load_scenario(None, overrides)
    assert caught.value.field == "parallel.overlap_param_gather_with_optimizer_step"
    assert reason in str(caught.value)


@settings(max_examples=4, deadline=None)
@given(gpn=st.sampled_from([2, 4]), t=st.sampled_from([1, 2]), p=st.integers(2, 3),
       d=st.integers(2, 3), align=st.booleans(), average=st.booleans())
def test_shortcuts_equal_the_full_run_on_random_layouts(gpn, t, p, d, align, average):
    """Random interleaved layouts with overlapped reduction and gather, the step overlap and
    (or not) the average in the collective: the fast path equals `--no-shortcuts` (time and
    every stage's exposure within 1%, tests/test_shortcut_layouts.py)."""
    sc = with_overrides(layout_scenario(gpn, t, p, d, True, True, True, 2 * p), parallel={
        "overlap_param_gather": True, "align_param_gather": align,
        "overlap_param_gather_with_optimizer_step": True, "ddp_average_in_collective": average})
    assert_same(*fast_and_full(sc))
