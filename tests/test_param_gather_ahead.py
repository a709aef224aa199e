"""The distributed optimizer's overlapped parameter all-gather under the interleaved schedule,
timed by hand: Megatron-LM's aligned chunk-ahead dispatch (megatron/core/pipeline_parallel/
schedules.py param_sync_func) against the per-chunk bucket chain (megatron/core/distributed/
param_and_grad_buffer.py finish_param_sync)."""

import pytest

from simsp.scenario.loading import load_scenario
from simsp.engine.group_timing import RING_ALONE, EveryGroup
from simsp.engine.collectives.ring_timing import collective_time
from simsp.hardware.costmodel import kernel_time
from simsp.model.params import param_shapes
from simsp.model.tensor import FP32, Tensor
from simsp.training.driver.world import build_world
from simsp.training.data_parallel.grad_buckets import DDPBuckets
from simsp.training.pipeline.plan import stage_plans

EMBEDDING_S, LAYER_S = 10e-6, 40e-6


def bucket_seconds(world, r):
    """(reduce_s, scale_s): a bucket's fp32 reduce-scatter over ranks 0 and 1 alone, and its
    scaling kernel (grad_data *= 1/2 on the 4-byte bucket: read and written), each of a bucket."""
    def reduce_s(bucket):
        return collective_time("reduce_scatter", world.network.graph, [0, 1], 4 * bucket.numel,
                               world.network.calibration, 4)

    def scale_s(bucket):
        return kernel_time("elementwise", 0, 2 * 4 * bucket.numel, cal=r.compute_cal)
    return reduce_s, scale_s


def interleaved_overrides(**parallel) -> dict:
    """p = 2, v = 2 (one layer per chunk), d = 2, m = 2, overlapped reduce and gather with the
    distributed optimizer; `parallel` fields override."""
    overrides = {("model", "num_layers"): 4, ("model", "hidden_size"): 64,
                 ("run", "mode"): "meta", ("parallel", "data_parallel_size"): 2,
                 ("parallel", "pipeline_model_parallel_size"): 2,
                 ("parallel", "num_layers_per_virtual_pipeline_stage"): 1,
                 ("parallel", "overlap_p2p_communication"): True,
                 ("parallel", "global_batch_size"): 4, ("parallel", "overlap_grad_reduce"): True,
                 ("parallel", "distributed_optimizer"): True,
                 ("parallel", "overlap_param_gather"): True}
    overrides.update({("parallel", k): v for k, v in parallel.items()})
    return overrides


def interleaved_world(**parallel):
    """p = 2, v = 2 (one layer per chunk), d = 2, m = 2 on one node; stage 0 holds the
    embedding and layer 0 (chunk 0) and layer 2 (chunk 1); buckets of one layer."""
    sc = load_scenario(None, interleaved_overrides(**{"ddp_bucket_size": 49_984, **parallel}))
    world = build_world(sc, simulated=[0], timing_of=EveryGroup(RING_ALONE))
    plan = stage_plans(sc, world.grid)[0]
    grads = {n: Tensor.meta(shape, FP32, n) for n, shape in param_shapes(sc.model).items()}
    return sc, world, plan, grads


def run_forwards(world, plan, sync) -> float:
    """The stage's forwards (chunk 0, 0, 1, 1 for m = p = 2): each waits in its pre-hooks
    (embedding 10 µs, then its layer 40 µs); returns when the last one ends."""
    r, env, done = world.ranks[0], world.env, []
    forwards = [step.chunk for step in plan.steps if step.kind == "F"]
    assert forwards == [0, 0, 1, 1]
    ahead = sync.chunk_ahead_triggers(forwards)

    def program():
        sync.start_param_gather(r)
        for index, chunk in enumerate(forwards):
            if index in ahead:
                sync.gather_chunk(r, ahead[index])
            if chunk == 0:
                yield from sync.params_needed(r, 0, ["embedding"])
                yield env.timeout(EMBEDDING_S)
            layer = plan.layers(chunk)[0]
            yield from sync.params_needed(r, chunk, [layer])
            yield env.timeout(LAYER_S)
        done.append(env.now)

    env.process(program())
    env.run()
    return done[0]


def gather_s(world, bucket) -> float:
    """One bucket's ring all-gather of 2-byte parameters over the 2 DP ranks."""
    return collective_time("all_gather", world.network.graph, [0, 1], 2 * bucket.numel,
                           world.network.calibration, 2)


def buckets_of(sync):
    """(embedding bucket, layer 0 bucket, layer 2 bucket) in the order the forward uses them."""
    order = sync._forward_order()
    assert [b.chunk for b in order] == [0, 0, 1]
    assert order[0].names[-1] == "embedding.word" and "layers.2.attn.qkv.weight" in order[2].names
    return order


def test_aligned_gather_issues_both_first_chunks_at_the_start_by_hand():
    """Aligned (Megatron's default when interleaved): chunks 0 and 1 all-gathered from time 0
    back to back on the DP stream (E1, E2, E3), the pre-hooks only wait. Forward 1 (chunk 0)
    waits E1 for the embedding and E2 for layer 0; chunk 1's first forward starts at
    2·(10 + 40) µs and waits for E3 if it is later."""
    sc, world, plan, grads = interleaved_world()
    sync = DDPBuckets(world.ranks[0], sc.parallel, world.grid, plan, grads)
    emb, layer0, layer2 = buckets_of(sync)
    e1 = gather_s(world, emb)
    e2 = e1 + gather_s(world, layer0)
    e3 = e2 + gather_s(world, layer2)
    layer0_start = max(e1 + EMBEDDING_S, e2)
    chunk1_start = layer0_start + LAYER_S + EMBEDDING_S + LAYER_S
    exposed = e1 + (layer0_start - e1 - EMBEDDING_S) + max(e3 - chunk1_start, 0.0)
    end = run_forwards(world, plan, sync)
    assert end == pytest.approx(max(chunk1_start, e3) + 2 * LAYER_S, rel=1e-9)
    assert world.ranks[0].exposed_s["dp_comm"] == pytest.approx(exposed, rel=1e-9)
    assert e3 < chunk1_start  # the tiny layout hides chunk 1's gather entirely
    report = sync.overlap_report()["all_gather"]  # metrics/sections.py dp_overlap_per_stage
    assert report["comm_s"] == pytest.approx(e3, rel=1e-9)
    assert report["exposed_s"] == pytest.approx(exposed, rel=1e-9)
    assert report["hidden_s"] == pytest.approx(e3 - exposed, rel=1e-9)


def test_unaligned_gather_chains_within_a_chunk_by_hand():
    """--no-align-param-gather: the embedding bucket issued at time 0, its pre-hook issues
    layer 0's (same chunk, next_param_gather_bucket_group); chunk 1's bucket is issued only by
    its own first pre-hook, so its whole all-gather is exposed."""
    sc, world, plan, grads = interleaved_world(align_param_gather=False)
    sync = DDPBuckets(world.ranks[0], sc.parallel, world.grid, plan, grads)
    emb, layer0, layer2 = buckets_of(sync)
    e1 = gather_s(world, emb)
    e2 = e1 + gather_s(world, layer0)
    layer0_start = max(e1 + EMBEDDING_S, e2)
    chunk1_start = layer0_start + LAYER_S + EMBEDDING_S + LAYER_S
    exposed = e1 + (layer0_start - e1 - EMBEDDING_S) + gather_s(world, layer2)
    end = run_forwards(world, plan, sync)
    assert end == pytest.approx(chunk1_start + gather_s(world, layer2) + 2 * LAYER_S,
                                rel=1e-9)
    assert world.ranks[0].exposed_s["dp_comm"] == pytest.approx(exposed, rel=1e-9)


@pytest.mark.parametrize("pp,v,expected", [
    (0, 3, {2: 2}), (1, 3, {1: 2}),  # chunk 2 issued where stage pp + index reaches chunk 1
    (1, 4, {1: 2, 3: 3}), (0, 2, {})])
def test_chunk_ahead_triggers_follow_megatrons_rule(pp, v, expected):
    """p = 2, m = 4: forwards run chunks (k // 2) % v; chunk c first runs at forward 2c. Megatron
    issues chunk c+1 (1 < c+1 < v) at the forward whose index + pp is 2c."""
    sync = DDPBuckets.__new__(DDPBuckets)
    sync.align_gather = True
    sync.plan = type("Plan", (), {"pp": pp, "v": v})()
    forwards = [(k // 2) % v for k in range(4 * v)]
    assert sync.chunk_ahead_triggers(forwards) == expected


@pytest.mark.parametrize("p,d,align", [(2, 2, True), (3, 2, True), (2, 2, False)])
def test_shortcuts_equal_the_full_run_with_chunk_ahead_gathers(p, d, align):
    """v = 3 interleaved layouts (chunk 2 issued mid-forward by the aligned schedule), with
    overlapped reduction and gather: the shortcut run (one rank per stage) equals
    `--no-shortcuts` to 1e-9 in iteration time and every stage's exposure."""
    from simsp.metrics.collect import collect
    from simsp.shortcuts.check import Shortcuts
    from simsp.training.driver.iteration import simulate_iteration
    parallel = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": p,
                "data_parallel_size": d, "global_batch_size": d * 2 * p,
                "num_layers_per_virtual_pipeline_stage": 1, "overlap_p2p_communication": True,
                "overlap_grad_reduce": True, "distributed_optimizer": True,
                "overlap_param_gather": True, "align_param_gather": align,
                "ddp_bucket_size": 20_000}
    overrides = {("model", "num_layers"): 3 * p, ("model", "hidden_size"): 96,
                 ("model", "num_attention_heads"): 12, ("model", "seq_length"): 48,
                 ("model", "vocab_size"): 256, ("run", "mode"): "meta",
                 ("cluster", "gpus_per_node"): 2, ("cluster", "nodes"): p * d // 2}
    overrides.update({("parallel", k): v for k, v in parallel.items()})
    sc = load_scenario(None, overrides)
    fast = Shortcuts.for_scale(sc)
    mine = collect(simulate_iteration(sc, fast, trace="none"), fast)
    full = collect(simulate_iteration(sc, Shortcuts(), trace="none"), Shortcuts())
    assert mine["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-9)
    for a, b in zip(mine["exposed_s_per_stage"], full["exposed_s_per_stage"]):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-15)
    assert max(stage["dp_comm"] for stage in full["exposed_s_per_stage"]) > 0


@pytest.mark.parametrize("pp,v,expected", [
    (0, 2, {5: 1, 7: 0}), (1, 2, {6: 1}),  # chunk 0's last backward + 1 is past the end
    (0, 3, {7: 2, 9: 1, 11: 0}), (1, 3, {8: 2, 10: 1})])
def test_chunk_reduce_triggers_follow_megatrons_rule(pp, v, expected):
    """p = 2, m = 4: backwards run chunks v − 1 − (k // 2) % v; Megatron launches chunk c's
    reductions after the backward whose index − pp is chunk c's last."""
    sync = DDPBuckets.__new__(DDPBuckets)
    sync.align_reduce = True
    sync.plan = type("Plan", (), {"pp": pp, "v": v})()
    backwards = [v - 1 - (k // 2) % v for k in range(4 * v)]
    assert sync.chunk_reduce_triggers(backwards) == expected


def test_aligned_reductions_launch_chunk_by_chunk_by_hand():
    """Aligned, interleaved, stage 0 (backwards run chunks 1, 1, 0, 0, 40 µs each): no
    bucket launches from the backward itself; chunk 1's bucket reduce-scatters after backward
    1 (chunk 1's last) and its scaling kernel S2 (1/d on the compute stream), chunk 0's two
    buckets after backward 3, each after its kernel (S0, then SE), behind it on the DP stream
    (layer 0's, then the embeddings'); finish waits for the last."""
    sc, world, plan, grads = interleaved_world()
    r, env = world.ranks[0], world.env
    sync = DDPBuckets(r, sc.parallel, world.grid, plan, grads)
    emb, layer0, layer2 = buckets_of(sync)
    backwards = [step.chunk for step in plan.steps if step.kind == "B"]
    assert backwards == [1, 1, 0, 0]
    after = sync.chunk_reduce_triggers(backwards)
    assert after == {1: 1, 3: 0}
    done = []

    def program():
        for index, chunk in enumerate(backwards):
            layers = list(plan.layers(chunk)) + (["embedding"] if chunk == 0 else [])
            yield from sync.grads_ready(r, plan, chunk, index // 2, layers)
            yield env.timeout(LAYER_S)
            if index in after:
                yield from sync.reduce_chunk(r, after[index])
        yield from sync.finish(r)
        done.append(env.now)

    reduce_s, scale_s = bucket_seconds(world, r)
    env.process(program())
    env.run()
    chunk1_end = 2 * LAYER_S + scale_s(layer2) + reduce_s(layer2)
    layer0_launch = 4 * LAYER_S + scale_s(layer2) + scale_s(layer0)
    layer0_end = max(layer0_launch, chunk1_end) + reduce_s(layer0)
    emb_launch = layer0_launch + scale_s(emb)
    end = max(emb_launch, layer0_end) + reduce_s(emb)
    assert done == [pytest.approx(end, rel=1e-9)]
    assert r.exposed_s["dp_comm"] == pytest.approx(end - emb_launch, rel=1e-9)


def test_unaligned_reductions_launch_bucket_by_bucket_by_hand():
    """--no-align-grad-reduce, interleaved, stage 0 (backwards: chunk 1 mb 0, 1, then chunk 0
    mb 0, 1; layers 40 µs, the embedding 10 µs): Megatron enables grad sync in each chunk's
    last micro-batch (schedules.py backward_step_helper_preprocess), so a bucket launches as
    soon as that backward has made its gradients, after its scaling kernel: layer 2's at 80 µs,
    layer 0's before the embedding's backward, the embeddings' last."""
    sc, world, plan, grads = interleaved_world(align_grad_reduce=False)
    r, env = world.ranks[0], world.env
    sync = DDPBuckets(r, sc.parallel, world.grid, plan, grads)
    emb, layer0, layer2 = buckets_of(sync)
    backwards = [(step.chunk, step.micro_batch) for step in plan.steps if step.kind == "B"]
    assert backwards == [(1, 0), (1, 1), (0, 0), (0, 1)]
    assert sync.chunk_reduce_triggers([c for c, _ in backwards]) == {}
    done = []

    def program():
        for chunk, mb in backwards:
            yield env.timeout(LAYER_S)
            yield from sync.grads_ready(r, plan, chunk, mb, list(plan.layers(chunk)))
            if chunk == 0:
                yield env.timeout(EMBEDDING_S)
                yield from sync.grads_ready(r, plan, chunk, mb, ["embedding"])
        yield from sync.finish(r)
        done.append(env.now)

    reduce_s, scale_s = bucket_seconds(world, r)
    env.process(program())
    env.run()
    layer2_launch = 2 * LAYER_S + scale_s(layer2)
    layer0_launch = layer2_launch + 2 * LAYER_S + EMBEDDING_S + scale_s(layer0)
    emb_launch = layer0_launch + EMBEDDING_S + scale_s(emb)
    layer0_end = max(layer0_launch, layer2_launch + reduce_s(layer2)) + reduce_s(layer0)
    end = max(emb_launch, layer0_end) + reduce_s(emb)
    assert done == [pytest.approx(end, rel=1e-9)]
    assert r.exposed_s["dp_comm"] == pytest.approx(end - emb_launch, rel=1e-9)
