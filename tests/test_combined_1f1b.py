"""Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm): the steps as Megatron
orders them (schedules.py get_pp_rank_microbatches, combined_1f1b.py), the two micro-batches on
one rank's compute and communication streams against timelines worked by hand and against
training/pipeline/ep_overlap.py's pair timing, and whole iterations: gradients equal to the
single-device reference, the same with and without shortcuts."""
from types import SimpleNamespace

import pytest
import simpy

from simsp.model.blocks.moe.comm_stream import PairedStreams
from simsp.scenario.loading import load_scenario
from simsp.shortcuts.check import Shortcuts
from simsp.training.driver.compare import compare_with_reference
from simsp.training.driver.iteration import simulate_iteration
from simsp.training.pipeline.combined_1f1b import (combined_forwards, combined_schedule,
                                                   combined_warmup)
from simsp.training.pipeline.ep_overlap import LayerPieces, pair_timeline
from simsp.training.pipeline.schedule_step import Step

MOE = "scenarios/moe-tiny-cp.toml"  # 4 experts, the alltoall dispatcher


def _f(mb, chunk=0):
    return Step("F", mb, chunk)


def _b(mb, chunk=0):
    return Step("B", mb, chunk)


def test_pp1_runs_one_forward_alone_then_pairs():
    """combined_1f1b_schedule_for_no_pipelining, m 3: F0, F1+B0, F2+B1, B2."""
    (steps,) = combined_schedule(1, 3, 1)
    assert steps == [_f(0), _f(1), _b(0), _f(2), _b(1), _b(2)]
    assert combined_forwards(steps, combined_warmup(1, 3, 1, 0)) == {_f(1), _f(2)}


def test_interleaved_warmup_has_one_forward_more():
    """get_pp_rank_microbatches, p 2, v 2, m 4: (p - r - 1)·2 + (v - 1)·p + 1 = 5 on stage 0,
    3 on stage 1; stage 1's steps by hand from Megatron's chunk and micro-batch numbering."""
    assert [combined_warmup(2, 4, 2, r) for r in (0, 1)] == [5, 3]
    assert combined_warmup(2, 2, 2, 0) == 4  # capped at m·v: every step warm-up
    stage1 = combined_schedule(2, 4, 2)[1]
    assert stage1 == [_f(0), _f(1), _f(0, 1),
                      _f(1, 1), _b(0, 1), _f(2), _b(1, 1), _f(3), _b(0), _f(2, 1), _b(1),
                      _f(3, 1), _b(2, 1),
                      _b(3, 1), _b(2), _b(3)]
    assert combined_forwards(stage1, 3) == {_f(1, 1), _f(2), _f(3), _f(2, 1), _f(3, 1)}
    assert combined_forwards(combined_schedule(2, 2, 2)[0], 4) == frozenset()


# -- the streams -------------------------------------------------------------------------------

F = LayerPieces(pre_dispatch=3.0, dispatch=2.0, mlp=4.0, combine=2.0)
B = LayerPieces(pre_dispatch=7.0, dispatch=6.0, mlp=9.0, combine=1.0)  # weight grads included
F_ORDER = (("pre_dispatch", "compute"), ("dispatch", "comm"), ("mlp", "compute"),
           ("combine", "comm"))
B_ORDER = (("combine", "comm"), ("mlp", "compute"), ("dispatch", "comm"),
           ("pre_dispatch", "compute"))


def _micro_batch(env, streams, r, who, layers, order, spans):
    """One micro-batch's layers: compute pieces on the held compute stream, all-to-alls
    through on_comm, each all-to-all's wait counted exposed as dispatch.all_to_all does."""
    for i, layer in enumerate(layers):
        for piece, stream in order:
            body = _timed(env, r, (who, i, piece), getattr(layer, piece), spans, stream)
            if stream == "comm":
                yield from streams.on_comm(r, body)
            else:
                yield from body


def _timed(env, r, key, seconds, spans, stream):
    """A piece taking `seconds`, its span recorded; a communication piece's exposed."""
    start = env.now
    yield env.timeout(seconds)
    spans[key] = (start, env.now)
    if stream == "comm":
        r.exposed_s["ep_comm"] = r.exposed_s.get("ep_comm", 0.0) + env.now - start


def assert_spans(spans: dict, want: dict) -> None:
    """Every hand-worked span in `want` is the run's, to 1e-9 (key named where one is not)."""
    for key, span in want.items():
        assert spans[key] == pytest.approx(span, abs=1e-9), key


def _paired(f_layers, b_layers):
    """The backward's process started first, then the forward's (stage_program.py)."""
    env = simpy.Environment()
    streams, spans = PairedStreams(env), {}
    r = SimpleNamespace(scope="", phase="", exposed_s={})
    streams.paired = True
    for who, layers, order in (("b", b_layers, B_ORDER), ("f", f_layers, F_ORDER)):
        env.process(streams.own(_micro_batch(env, streams, r, who, layers, order, spans)))
    env.run()
    return env.now, spans, r.exposed_s["ep_comm"]


def test_one_layer_is_ep_overlaps_pair():
    """The pair of tests/test_ep_overlap_pair.py without delayed weight gradients, worked there
    by hand: the pair ends at 25, 2 s of the 11 s of all-to-all exposed (B.dispatch [12,18]
    under F.mlp [12,16] only); every span as ep_overlap.py times it."""
    end, spans, exposed = _paired([F], [B])
    assert end == pytest.approx(25.0, abs=1e-9)
    assert exposed == pytest.approx(2.0, abs=1e-9)
    want = pair_timeline(F, B, delay_wgrad=False)
    assert want.comm_exposed_s == pytest.approx(exposed, abs=1e-9)
    for who, piece, _, start, stop in want.spans:
        assert spans[(who, 0, piece)] == pytest.approx((start, stop), abs=1e-9), (who, piece)


def test_two_layers_worked_by_hand():
    """Layer 0 as above ([0,25]). Layer 1, F.pre_dispatch 1.5: B.combine [25,26] (the comm
    stream free since F.combine ended at 20) under F.pre [25,26.5]; B.mlp once F hands the
    compute stream over for its dispatch: [26.5,35.5], F.dispatch [26.5,28.5]; F.mlp when B
    leaves for its dispatch: [35.5,39.5], B.dispatch [35.5,41.5]; F.combine behind it
    [41.5,43.5]; B.pre [41.5,48.5]. Exposed: 2 s in each layer (B.dispatch's last 2 s)."""
    f1 = LayerPieces(pre_dispatch=1.5, dispatch=2.0, mlp=4.0, combine=2.0)
    end, spans, exposed = _paired([F, f1], [B, B])
    want = {("b", 1, "combine"): (25, 26), ("f", 1, "pre_dispatch"): (25, 26.5),
            ("b", 1, "mlp"): (26.5, 35.5), ("f", 1, "dispatch"): (26.5, 28.5),
            ("f", 1, "mlp"): (35.5, 39.5), ("b", 1, "dispatch"): (35.5, 41.5),
            ("f", 1, "combine"): (41.5, 43.5), ("b", 1, "pre_dispatch"): (41.5, 48.5)}
    assert_spans(spans, want)
    assert end == pytest.approx(48.5, abs=1e-9)
    assert exposed == pytest.approx(4.0, abs=1e-9)


def test_outside_a_pair_nothing_is_handed_over():
    """A step alone (warm-up, cool-down): on_comm is the body itself, all of it exposed."""
    env = simpy.Environment()
    streams, spans = PairedStreams(env), {}
    r = SimpleNamespace(scope="", phase="", exposed_s={})
    env.process(_micro_batch(env, streams, r, "f", [F], F_ORDER, spans))
    env.run()
    assert env.now == pytest.approx(11.0, abs=1e-12)
    assert r.exposed_s["ep_comm"] == pytest.approx(4.0, abs=1e-12)


# -- whole iterations --------------------------------------------------------------------------

def _scenario(pp: int, mode: str = "numeric", **parallel):
    """The tiny MoE model with EP 2 and the overlap: t 1, d 2; PP 2 with two chunks of one
    layer each (4 layers), m 4."""
    overrides = {("parallel", "overlap_moe_expert_parallel_comm"): True,
                 ("parallel", "tensor_model_parallel_size"): 1,
                 ("parallel", "sequence_parallel"): False,
                 ("parallel", "context_parallel_size"): 1,
                 ("parallel", "data_parallel_size"): 2,
                 ("parallel", "micro_batch_size"): 1,
                 ("parallel", "global_batch_size"): 8,
                 ("parallel", "pipeline_model_parallel_size"): pp,
                 ("run", "mode"): mode}
    if pp > 1:
        overrides[("parallel", "num_layers_per_virtual_pipeline_stage")] = 1
        overrides[("model", "num_layers")] = 4
    overrides.update({("parallel", k): v for k, v in parallel.items()})
    return load_scenario(MOE, overrides)


@pytest.mark.parametrize("pp", [1, 2])
def test_gradients_equal_the_reference(pp):
    """PP 1 (F0, then pairs) and PP 2 with two virtual stages: loss and every gradient within
    1e-12 of the single-device reference, with combined steps run on every stage."""
    run = simulate_iteration(_scenario(pp))
    errors = compare_with_reference(run)
    assert max(errors.values()) <= 1e-12, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    for rank, plan in run.inputs.plans.items():
        warmup = combined_warmup(pp, 4, plan.v, plan.pp)
        assert len(combined_forwards(list(plan.steps), warmup)) == 4 * plan.v - warmup > 0
        assert run.inputs.world.ranks[rank].ep_streams.held_s() > 0  # pairs shared streams
        assert len(run.results.steps[rank]) == 2 * 4 * plan.v


def test_the_overlap_hides_all_to_all_and_equals_without_shortcuts():
    """Meta mode, PP 2 × 2 chunks: the same iteration time and exposure with every shortcut
    as with none (to rounding: the rings' closed form sums in another order); and less
    exposed EP communication than the same layout without the overlap
    (the steady state's all-to-alls run beside the other micro-batch's compute)."""
    sc = _scenario(2, "meta")
    fast = simulate_iteration(sc, Shortcuts.for_scale(sc))
    full = simulate_iteration(sc)
    assert max(fast.results.end_s.values()) == pytest.approx(max(full.results.end_s.values()),
                                                             rel=1e-12)
    for rank, r in fast.inputs.world.ranks.items():
        twin = full.inputs.world.ranks[rank].exposed_s
        assert r.exposed_s == pytest.approx(twin, rel=1e-9, abs=1e-15)
    plain = simulate_iteration(_scenario(2, "meta", overlap_moe_expert_parallel_comm=False))
    assert fast.inputs.world.ranks
    for rank, r in fast.inputs.world.ranks.items():
        assert r.exposed_s["ep_comm"] < plain.inputs.world.ranks[rank].exposed_s["ep_comm"]
