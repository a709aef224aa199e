"""DualPipe's F&B pair as the run executes it (model/blocks/moe/comm_stream.py PairedStreams
with `beside_weights`): a backward's deferred weight gradients run on the compute stream beside
its next collective, and the pair's pieces fall where training/pipeline/ep_overlap.py
`dualpipe_pair_seconds` (DeepSeek-V3 report Figure 4) puts them, checked against timelines
worked by hand; whole DualPipe / DualPipeV runs whose pairs overlap their collectives."""
from types import SimpleNamespace

import pytest
import simpy

from simsp.model.base.wgrad_store import WeightGradStore
from simsp.model.blocks.moe.comm_stream import PairedStreams
from simsp.training.driver.compare import compare_with_reference
from simsp.training.driver.iteration import simulate_iteration
from simsp.training.pipeline.ep_overlap import LayerPieces, dualpipe_pair_seconds, issued_timeline
from tests.test_combined_1f1b import (  # a piece of given seconds, span checks
    _timed, assert_spans)
from tests.test_two_chunk_moe import moe_layout

F = LayerPieces(pre_dispatch=3.0, dispatch=2.0, mlp=4.0, combine=2.0)
# B's mlp and pre_dispatch: input gradients only; their weight gradients in *_dw (deferred)
B = LayerPieces(pre_dispatch=5.0, dispatch=8.0, mlp=7.0, combine=1.0, mlp_dw=2.0,
                pre_dispatch_dw=2.0)
F_ORDER = (("pre_dispatch", "compute"), ("dispatch", "comm"), ("mlp", "compute"),
           ("combine", "comm"))
B_ORDER = (("combine", "comm"), ("mlp", "compute"), ("dispatch", "comm"),
           ("pre_dispatch", "compute"))


def _micro_batch(env, streams, r, who, layers, spans, store=None):
    """One micro-batch's layers as the model runs them: compute pieces on the held compute
    stream, collectives through on_comm; a backward defers each compute piece's weight
    gradient into `store` (a split backward's B) and runs what is left at its end (W)."""
    order = B_ORDER if who == "b" else F_ORDER
    for i, layer in enumerate(layers):
        for piece, stream in order:
            body = _timed(env, r, (who, i, piece), getattr(layer, piece), spans, stream)
            if stream == "comm":
                yield from streams.on_comm(r, body)
                continue
            yield from body
            if store is not None:
                store.defer(r, (), lambda i=i, piece=piece: _timed(
                    env, r, ("b", i, piece + "_dw"), getattr(layers[i], piece + "_dw"), spans,
                    "compute"))
    if store is not None:
        yield from store.run(r)


def _pair(f_layers, b_layers):
    """The pair on one rank from 0, the backward's process first (stage_program.py)."""
    env = simpy.Environment()
    streams, spans, store = PairedStreams(env, beside_weights=True), {}, WeightGradStore()
    r = SimpleNamespace(scope="", phase="", exposed_s={}, free=lambda *tensors: None)
    streams.paired = True
    env.process(streams.own(_micro_batch(env, streams, r, "b", b_layers, spans, store),
                            lambda: store))
    env.process(streams.own(_micro_batch(env, streams, r, "f", f_layers, spans)))
    env.run()
    return env.now, spans, r.exposed_s["ep_comm"]


def test_one_layer_worked_by_hand():
    """B.combine [0,1] under F.pre [0,3]; B.mlp [3,10], F.dispatch [3,5] beside it; B.dispatch
    [10,18] with B.mlp_dw [10,12] and F.mlp [12,16] beside it (Figure 4's MLP(B), MLP(W),
    MLP(F)); F.combine [18,20] under B.pre [18,23]; B.pre_dw [23,25]. Exposed: B.dispatch's
    [16,18]."""
    end, spans, exposed = _pair([F], [B])
    want = {("b", 0, "combine"): (0, 1), ("f", 0, "pre_dispatch"): (0, 3),
            ("b", 0, "mlp"): (3, 10), ("f", 0, "dispatch"): (3, 5),
            ("b", 0, "dispatch"): (10, 18), ("b", 0, "mlp_dw"): (10, 12),
            ("f", 0, "mlp"): (12, 16), ("f", 0, "combine"): (18, 20),
            ("b", 0, "pre_dispatch"): (18, 23), ("b", 0, "pre_dispatch_dw"): (23, 25)}
    assert sorted(spans) == sorted(want)
    assert_spans(spans, want)
    assert end == pytest.approx(25.0, abs=1e-9)
    assert exposed == pytest.approx(2.0, abs=1e-9)


@pytest.mark.parametrize("f_count,b_count", [(1, 1), (2, 2), (3, 2), (2, 3)])
def test_the_pair_is_dualpipe_pair_seconds(f_count, b_count):
    """Chunks of 1-3 layers (the later layers' pieces scaled apart): every piece's span, the
    pair's end and its exposed all-to-all as ep_overlap.dualpipe_pair_seconds times them, to
    1e-9 (a layer's ATTN(W) runs beside the next layer's COMBINE(B))."""
    f_layers = [LayerPieces(*(x * (1 + 0.3 * i) for x in (3.0, 2.0, 4.0, 2.0)))
                for i in range(f_count)]
    b_layers = [LayerPieces(*(x * (1 - 0.2 * i) for x in (5.0, 8.0, 7.0, 1.0, 2.0, 2.0)))
                for i in range(b_count)]
    end, spans, exposed = _pair(f_layers, b_layers)
    issued = []
    for i in range(max(f_count, b_count)):  # which layer each issued piece belongs to
        issued += [i] * len(dualpipe_pair_seconds(f_layers[i:i + 1], b_layers[i:i + 1]))
    want = issued_timeline(dualpipe_pair_seconds(f_layers, b_layers))
    for layer, (who, piece, _, start, stop) in zip(issued, want.spans):
        assert spans[(who, layer, piece)] == pytest.approx((start, stop), abs=1e-9)
    assert end == pytest.approx(want.end_s, abs=1e-9)
    assert exposed == pytest.approx(want.comm_exposed_s, abs=1e-9)


def test_tp_collectives_stay_on_compute_outside_dualpipe():
    """Megatron's combined 1F1B (no `beside_weights`) hands over only at all-to-alls: a TP
    collective there runs as it is, the compute stream kept; in a DualPipe pair it goes on
    the communication stream, the other micro-batch computing beside it."""
    for beside, want_end in ((False, 4.0), (True, 3.0)):
        env = simpy.Environment()
        streams = PairedStreams(env, beside_weights=beside)
        r = SimpleNamespace(scope="", phase="", exposed_s={})
        streams.paired = True
        spans = {}
        tp = _timed(env, r, "tp", 1.0, spans, "comm")
        env.process(streams.own(_tp_then_compute(env, streams, r, tp, spans)))
        env.process(streams.own(_timed(env, r, "other", 2.0, spans, "compute")))
        env.run()
        assert env.now == pytest.approx(want_end, abs=1e-12)


def _tp_then_compute(env, streams, r, tp, spans):
    """A TP collective of 1 s, then 1 s of compute."""
    yield from streams.on_comm(r, tp, tp=True)
    yield from _timed(env, r, "after", 1.0, spans, "compute")


# -- whole iterations --------------------------------------------------------------------------

def _sequential_pairs(monkeypatch):
    """Every collective run where it is called, nothing handed over: a pair's backward and
    forward one after the other (the run before pairs overlapped)."""
    monkeypatch.setattr(PairedStreams, "on_comm",
                        lambda self, r, body, key="ep_comm", tp=False: body)


@pytest.mark.parametrize("schedule", ["dualpipe", "dualpipev"])
def test_pairs_hide_all_to_all_and_keep_the_gradients(schedule, monkeypatch):
    """The MoE layout of tests/test_two_chunk_moe.py (EP 2 over DP 2, PP 4, 8 layers, m 8):
    every gradient within 1e-10 of the single-device reference with pairs overlapped; in meta
    mode every rank's exposed all-to-all is less than with the pairs run one after the other,
    and the iteration no longer."""
    run = simulate_iteration(moe_layout(schedule))
    errors = compare_with_reference(run)
    assert max(errors.values()) <= 1e-10, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    overlapped = simulate_iteration(moe_layout(schedule, mode="meta"))
    _sequential_pairs(monkeypatch)
    sequential = simulate_iteration(moe_layout(schedule, mode="meta"))
    for rank, r in overlapped.inputs.world.ranks.items():
        alone = sequential.inputs.world.ranks[rank]
        assert r.exposed_s["ep_comm"] < alone.exposed_s["ep_comm"], rank
        assert r.ep_streams.held_s() > 0
    assert max(overlapped.results.end_s.values()) <= max(sequential.results.end_s.values())


def test_sm_contention_slows_the_compute_beside_a_collective():
    """--sm-contention (engine/sm_share.py): the all-to-alls' NCCL channels take SMs from the
    compute running beside them in the pairs, so the iteration is longer than without it, and
    its exposed all-to-all the same (the collectives themselves are not slowed)."""
    plain = simulate_iteration(moe_layout("dualpipe", mode="meta"))
    shared = simulate_iteration(moe_layout("dualpipe", mode="meta", sm_contention=True))
    assert max(shared.results.end_s.values()) > max(plain.results.end_s.values())
    for rank, r in shared.inputs.world.ranks.items():
        assert r.exposed_s["ep_comm"] == pytest.approx(
            plain.inputs.world.ranks[rank].exposed_s["ep_comm"], rel=1e-12)
