"""--delay-wgrad-compute under Megatron-Core's combined 1F1B: the backward's weight-gradient
GEMMs run as their own compute pieces beside its next all-to-all (model/blocks/moe/
comm_stream.py, training/pipeline/delay_wgrad.py), against timelines worked by hand and
against training/pipeline/ep_overlap.py's issue-order timing; whole iterations with gradients
equal to the single-device reference, the held inputs in the ledger until their GEMMs run, and
the flex dispatcher under the overlap."""
from types import SimpleNamespace

import pytest
import simpy
from test_combined_1f1b import (  # the pieces' order, a timed piece, span checks
    B_ORDER, F_ORDER, _timed, assert_spans)

from simsp.model.blocks.moe.comm_stream import PairedStreams
from simsp.scenario.loading import load_scenario
from simsp.shortcuts.check import Shortcuts
from simsp.training.driver.compare import compare_with_reference
from simsp.training.driver.iteration import simulate_iteration
from simsp.training.pipeline import delay_wgrad
from simsp.training.pipeline.ep_overlap import LayerPieces, issued_timeline, pair_seconds

F = LayerPieces(pre_dispatch=3.0, dispatch=2.0, mlp=4.0, combine=2.0)
B = LayerPieces(pre_dispatch=5.0, dispatch=6.0, mlp=6.0, combine=1.0, mlp_dw=3.0,
                pre_dispatch_dw=2.0)  # *_dw: the weight gradients, deferred


class _Deferred:
    """A stand-in for delay_wgrad.DelayedWgrad: (layer, piece, seconds) GEMMs waiting."""

    def __init__(self, env, spans):
        self.env, self.spans, self.work, self.owner = env, spans, [], None

    def waiting(self):
        return bool(self.work)

    def run(self, r):
        work, self.work = self.work, []
        for i, piece, seconds in work:
            start = self.env.now
            yield self.env.timeout(seconds)
            self.spans[("b", i, piece)] = (start, self.env.now)


def _micro_batch(env, streams, r, who, layers, spans, deferred=None):
    """One micro-batch's layers in Megatron's piece order; a backward defers each compute
    piece's weight gradients (`deferred`) and runs what is left at its end."""
    for i, layer in enumerate(layers):
        for piece, stream in F_ORDER if who == "f" else B_ORDER:
            body = _timed(env, r, (who, i, piece), getattr(layer, piece), spans, stream)
            if stream == "comm":
                yield from streams.on_comm(r, body)
                continue
            yield from body
            if deferred is not None:
                deferred.work.append((i, piece + "_dw", getattr(layer, piece + "_dw")))
    if deferred is not None and deferred.waiting():
        yield from deferred.run(r)


def _run(f_layers, b_layers):
    """The backward's process first, then the forward's (stage_program.py); without forward
    layers the backward runs alone (a cool-down step). Returns (end, spans, exposed)."""
    env = simpy.Environment()
    streams, spans = PairedStreams(env), {}
    r = SimpleNamespace(scope="", phase="", exposed_s={})
    deferred = streams.delayed = _Deferred(env, spans)
    streams.paired = bool(f_layers)
    body = _micro_batch(env, streams, r, "b", b_layers, spans, deferred)
    deferred.owner = env.process(streams.own(body) if f_layers else body)
    if f_layers:
        env.process(streams.own(_micro_batch(env, streams, r, "f", f_layers, spans)))
    env.run()
    return env.now, spans, r.exposed_s["ep_comm"]


def _reference(f_layers, b_layers) -> dict:
    """ep_overlap.py's timing of the same layers issued in Megatron's order."""
    issued = []
    for i in range(len(b_layers)):
        issued += pair_seconds(f_layers[i] if f_layers else None, b_layers[i], True)
    spans, layer, seen = {}, {}, set()
    timeline = issued_timeline(issued)
    for who, piece, _, start, end in timeline.spans:
        i = layer[(who, piece)] = layer.get((who, piece), -1) + 1
        spans[(who, i, piece)] = (start, end)
        seen.add((who, piece))
    return spans, timeline


def test_two_layer_pairs_worked_by_hand():
    """Layer 0 as tests/test_ep_overlap_pair.py works it (ends with B.pre [16,21]). Layer 1:
    B.combine waits only for B.pre's input gradients: [21,22], beside B.pre_dw of layer 0 on
    the compute stream [21,23]; F.pre after it [23,26]; B.mlp [26,32] (F.dispatch [26,28]);
    B.mlp_dw [32,35] beside B.dispatch [32,38]; F.mlp [35,39]; F.combine [39,41]; B.pre
    [39,44]; B.pre_dw [44,46]. No all-to-all second is exposed; every span as ep_overlap.py
    times the same pieces in Megatron's issue order."""
    end, spans, exposed = _run([F, F], [B, B])
    want = {("b", 0, "pre_dispatch"): (16, 21), ("b", 1, "combine"): (21, 22),
            ("b", 0, "pre_dispatch_dw"): (21, 23), ("f", 1, "pre_dispatch"): (23, 26),
            ("b", 1, "mlp"): (26, 32), ("f", 1, "dispatch"): (26, 28),
            ("b", 1, "mlp_dw"): (32, 35), ("b", 1, "dispatch"): (32, 38),
            ("f", 1, "mlp"): (35, 39), ("f", 1, "combine"): (39, 41),
            ("b", 1, "pre_dispatch"): (39, 44), ("b", 1, "pre_dispatch_dw"): (44, 46)}
    assert_spans(spans, want)
    assert end == pytest.approx(46.0, abs=1e-9)
    assert exposed == pytest.approx(0.0, abs=1e-9)
    reference, timeline = _reference([F, F], [B, B])
    assert set(spans) == set(reference)
    assert_spans(spans, reference)
    assert timeline.comm_exposed_s == pytest.approx(exposed, abs=1e-9)


def test_a_backward_alone_hides_its_dispatch_behind_its_expert_weight_gradients():
    """A cool-down backward, one layer: B.combine [0,1] exposed; B.mlp [1,7]; B.mlp_dw [7,10]
    beside B.dispatch [7,13] (3 of its 6 s hidden); B.pre [13,18]; B.pre_dw [18,20].
    Exposed 1 + 3 = 4 s (7 s, ending at 23, with the weight gradients inline)."""
    end, spans, exposed = _run([], [B])
    assert spans[("b", 0, "mlp_dw")] == pytest.approx((7, 10), abs=1e-9)
    assert spans[("b", 0, "dispatch")] == pytest.approx((7, 13), abs=1e-9)
    assert end == pytest.approx(20.0, abs=1e-9)
    assert exposed == pytest.approx(4.0, abs=1e-9)
    reference, _ = _reference([], [B])
    assert_spans(spans, reference)


# -- whole iterations --------------------------------------------------------------------------

MOE = "scenarios/moe-tiny-cp.toml"  # 4 experts, EP 2


_OVERRIDES = {"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True,
              "overlap_grad_reduce": True, "tensor_model_parallel_size": 1,
              "sequence_parallel": False, "context_parallel_size": 1, "data_parallel_size": 2,
              "micro_batch_size": 1, "global_batch_size": 8}


def _scenario(pp: int, mode: str = "numeric", **parallel):
    """The tiny MoE model with EP 2, the overlap and the delayed weight gradients: t 1, d 2,
    m 4, the last micro-batch's buckets launched as their gradients complete; PP 2 with two
    chunks of one layer each (4 layers)."""
    overrides = {("parallel", k): v for k, v in {**_OVERRIDES, **parallel}.items()}
    overrides.update({("parallel", "pipeline_model_parallel_size"): pp, ("run", "mode"): mode})
    if pp > 1:
        overrides[("parallel", "num_layers_per_virtual_pipeline_stage")] = 1
        overrides[("model", "num_layers")] = 4
    return load_scenario(MOE, overrides)


@pytest.mark.parametrize("pp,dispatcher", [(1, "alltoall"), (2, "alltoall"), (2, "flex")])
def test_gradients_equal_the_reference(monkeypatch, pp, dispatcher):
    """PP 1 and PP 2 × 2 chunks (and the flex dispatcher, which Megatron's
    transformer_config.py accepts with the overlap): loss and every gradient within 1e-12 of
    the single-device reference; every deferred GEMM ran while what it reads was still in its
    rank's ledger, freed after."""
    runs = []
    original = delay_wgrad.DelayedWgrad.run

    def watched(self, r):
        held = [t.key for t in self.store.held]
        assert all(r.ledger.holds(key) for key in held)
        runs.append(min(len(self.store.work), len(held)))
        yield from original(self, r)
        assert not any(r.ledger.holds(key) for key in held)
    monkeypatch.setattr(delay_wgrad.DelayedWgrad, "run", watched)
    extra = {"moe_token_dispatcher_type": "flex", "moe_enable_deepep": True} \
        if dispatcher == "flex" else {}
    run = simulate_iteration(_scenario(pp, **extra))
    errors = compare_with_reference(run)
    assert max(errors.values()) <= 1e-12, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    backwards = sum(span[0] == "B" for spans in run.results.steps.values() for span in spans)
    layers = 2 if pp == 1 else 1  # MoE layers per chunk
    # per layer: its experts' GEMMs beside its dispatch's backward, its attention's beside the
    # next layer's combine backward or after the step (the chunk's last)
    assert min(runs) > 0 and len(runs) == 2 * layers * backwards


def test_meta_mode_equals_without_shortcuts():
    """Meta mode, PP 2 × 2 chunks: the same iteration time and exposure with every shortcut as
    with none (to rounding)."""
    sc = _scenario(2, "meta")
    fast = simulate_iteration(sc, Shortcuts.for_scale(sc))
    full = simulate_iteration(sc)
    assert max(fast.results.end_s.values()) == pytest.approx(max(full.results.end_s.values()),
                                                             rel=1e-12)
    for rank, r in fast.inputs.world.ranks.items():
        assert r.exposed_s == pytest.approx(full.inputs.world.ranks[rank].exposed_s, rel=1e-9,
                                            abs=1e-15)
