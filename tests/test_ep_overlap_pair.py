"""One layer's F&B pair on the compute and communication streams (Megatron-Core's
TransformerLayerSchedulePlan.run order), against timelines worked by hand below."""

import pytest

from simsp.training.pipeline.ep_overlap import (LayerPieces, dualpipe_pair_seconds,
                                                issued_timeline, pair_timeline)

F = LayerPieces(pre_dispatch=3.0, dispatch=2.0, mlp=4.0, combine=2.0)
B = LayerPieces(pre_dispatch=5.0, dispatch=6.0, mlp=6.0, combine=1.0, mlp_dw=3.0,
                pre_dispatch_dw=2.0)


def _spans(timeline) -> dict:
    return {(who, piece): (start, end) for who, piece, _, start, end in timeline.spans}


def test_delayed_wgrad_hides_every_all_to_all():
    """By hand: comm B.combine [0,1]; compute F.pre [0,3]; B.mlp after B.combine, the compute
    stream free at 3: [3,9]; F.dispatch after F.pre: [3,5]; B.mlp_dw [9,12]; B.dispatch after
    B.mlp (not its dw): [9,15]; F.mlp after F.dispatch, compute free at 12: [12,16]; F.combine
    [16,18]; B.pre after B.dispatch (15), compute free 16: [16,21]; B.pre_dw [21,23]. Every
    all-to-all lies under compute: 11 s hidden, none exposed."""
    t = pair_timeline(F, B, delay_wgrad=True)
    want = {("b", "combine"): (0, 1), ("f", "pre_dispatch"): (0, 3), ("b", "mlp"): (3, 9),
            ("f", "dispatch"): (3, 5), ("b", "mlp_dw"): (9, 12), ("b", "dispatch"): (9, 15),
            ("f", "mlp"): (12, 16), ("f", "combine"): (16, 18), ("b", "pre_dispatch"): (16, 21),
            ("b", "pre_dispatch_dw"): (21, 23)}
    got = _spans(t)
    assert set(got) == set(want)
    for key, span in want.items():
        assert got[key] == pytest.approx(span, abs=1e-9), key
    assert t.end_s == pytest.approx(23.0, abs=1e-9)
    assert (t.comm_hidden_s, t.comm_exposed_s) == pytest.approx((11.0, 0.0), abs=1e-9)


def test_without_delay_the_backward_dispatch_waits_for_the_weight_gradients():
    """By hand: B.mlp carries its dw: [3,12]; B.dispatch [12,18]; F.mlp [12,16]; F.combine queued
    behind B.dispatch on the comm stream: [18,20]; B.pre (with its dw) after B.dispatch:
    [18,25]. B.dispatch is under F.mlp for 4 s of 6: of the 11 s of all-to-all 2 s are exposed,
    9 hidden; the pair ends at 25."""
    t = pair_timeline(F, B, delay_wgrad=False)
    s = _spans(t)
    assert s[("b", "mlp")] == pytest.approx((3, 12), abs=1e-9)
    assert s[("b", "dispatch")] == pytest.approx((12, 18), abs=1e-9)
    assert s[("f", "combine")] == pytest.approx((18, 20), abs=1e-9)
    assert s[("b", "pre_dispatch")] == pytest.approx((18, 25), abs=1e-9)
    assert t.end_s == pytest.approx(25.0, abs=1e-9)
    assert (t.comm_hidden_s, t.comm_exposed_s) == pytest.approx((9.0, 2.0), abs=1e-9)


def test_a_forward_alone_exposes_its_all_to_all():
    """No backward to hide behind: 3 + 2 + 4 + 2 = 11 s, both all-to-alls exposed."""
    t = pair_timeline(F, None, delay_wgrad=True)
    assert t.end_s == pytest.approx(11.0, abs=1e-9)
    assert (t.comm_hidden_s, t.comm_exposed_s) == pytest.approx((0.0, 4.0), abs=1e-9)


def test_the_last_backward_layer_keeps_its_attention_wgrad():
    """is_last_layer_in_bwd: B.pre_dispatch_dw is left for later, the pair ends at 21."""
    t = pair_timeline(F, B, delay_wgrad=True, last_in_backward=True)
    assert ("b", "pre_dispatch_dw") not in _spans(t)
    assert t.end_s == pytest.approx(21.0, abs=1e-9)


def test_the_combine_kernel_takes_its_sms_from_the_forward_attention():
    """4 SMs, the all-to-all holds 1 for its 1 s: F.pre does 3/4 s of work in [0,1], its other
    2.25 s after, ending at 3.25 (engine/sm_share.py)."""
    f = LayerPieces(pre_dispatch=3.0, dispatch=0.0, mlp=0.0, combine=0.0)
    b = LayerPieces(pre_dispatch=0.0, dispatch=0.0, mlp=0.0, combine=1.0)
    t = pair_timeline(f, b, delay_wgrad=True, sm_count=4, comm_sms=1)
    assert _spans(t)[("f", "pre_dispatch")] == pytest.approx((0.0, 3.25), abs=1e-9)
    assert t.end_s == pytest.approx(3.25, abs=1e-9)


# DualPipe's F&B pair of two chunks (DeepSeek-V3 report §3.2.1, Figure 4): per layer the
# streams above (its W inside the pair: a pair's backward is full), layer after layer, then the
# two PP sends on the communication stream.
F_LAYER = LayerPieces(pre_dispatch=3.0, dispatch=2.0, mlp=4.0, combine=2.0)
B_LAYER = LayerPieces(pre_dispatch=5.0, dispatch=2.0, mlp=6.0, combine=2.0, mlp_dw=3.0,
                      pre_dispatch_dw=2.0)


def test_dualpipe_chunk_pair_hides_every_all_to_all_and_pp_send():
    """Two layers a chunk, PP sends of 1 s, by hand. Layer 0: B.combine [0,2], F.pre [0,3],
    B.mlp [3,9], F.dispatch [3,5], B.mlp_dw [9,12], B.dispatch [9,11], F.mlp [12,16],
    F.combine [16,18], B.pre [16,21], B.pre_dw [21,23]. Layer 1: B.combine after B.pre (21),
    the comm stream free at 18: [21,23]; F.pre after the compute stream's 23: [23,26]; B.mlp
    [26,32]; F.dispatch after F.pre: [26,28]; B.mlp_dw [32,35]; B.dispatch after B.mlp:
    [32,34]; F.mlp [35,39]; F.combine [39,41]; B.pre [39,44]; B.pre_dw [44,46]. PP: F's send
    after F.combine [41,42], B's after B.pre [44,45]. The pair ends at 46, its compute
    (2 x (3 + 4) + 2 x (6 + 3 + 5 + 2)), every one of the 18 s of communication hidden; run
    apart, F then BW and the sends take 2 x 11 + 2 x 20 + 2 = 64."""
    t = issued_timeline(dualpipe_pair_seconds([F_LAYER] * 2, [B_LAYER] * 2, 1.0, 1.0))
    spans = [(who, piece, start, end) for who, piece, _, start, end in t.spans]
    want = [("b", "combine", 0, 2), ("f", "pre_dispatch", 0, 3), ("b", "mlp", 3, 9),
            ("f", "dispatch", 3, 5), ("b", "mlp_dw", 9, 12), ("b", "dispatch", 9, 11),
            ("f", "mlp", 12, 16), ("f", "combine", 16, 18), ("b", "pre_dispatch", 16, 21),
            ("b", "pre_dispatch_dw", 21, 23),
            ("b", "combine", 21, 23), ("f", "pre_dispatch", 23, 26), ("b", "mlp", 26, 32),
            ("f", "dispatch", 26, 28), ("b", "mlp_dw", 32, 35), ("b", "dispatch", 32, 34),
            ("f", "mlp", 35, 39), ("f", "combine", 39, 41), ("b", "pre_dispatch", 39, 44),
            ("b", "pre_dispatch_dw", 44, 46), ("f", "pp", 41, 42), ("b", "pp", 44, 45)]
    assert [s[:2] for s in spans] == [w[:2] for w in want]
    for got, expected in zip(spans, want):
        assert got[2:] == pytest.approx(expected[2:], abs=1e-9), expected
    assert t.end_s == pytest.approx(46.0, abs=1e-9)
    assert (t.comm_hidden_s, t.comm_exposed_s) == pytest.approx((18.0, 0.0), abs=1e-9)


def test_dualpipe_pair_exposes_a_dispatch_longer_than_the_backward_mlp():
    """One layer, F.dispatch 12 s, by hand: F.dispatch [3,15] under B.mlp and B.mlp_dw until
    12, then 3 s alone; B.dispatch queued behind it: [15,17]; F.mlp after F.dispatch: [15,19];
    F.combine [19,21]; B.pre [19,24]; B.pre_dw [24,26]; F's PP send [21,22], B's [24,25]. Of
    20 s of communication 3 are exposed; the pair ends at 26."""
    long_dispatch = LayerPieces(pre_dispatch=3.0, dispatch=12.0, mlp=4.0, combine=2.0)
    t = issued_timeline(dualpipe_pair_seconds([long_dispatch], [B_LAYER], 1.0, 1.0))
    got = {(who, piece): (start, end) for who, piece, _, start, end in t.spans}
    for key, span in {("f", "dispatch"): (3, 15), ("b", "dispatch"): (15, 17),
                      ("f", "mlp"): (15, 19), ("f", "combine"): (19, 21),
                      ("b", "pre_dispatch"): (19, 24), ("b", "pre_dispatch_dw"): (24, 26),
                      ("f", "pp"): (21, 22), ("b", "pp"): (24, 25)}.items():
        assert got[key] == pytest.approx(span, abs=1e-9), key
    assert t.end_s == pytest.approx(26.0, abs=1e-9)
    assert (t.comm_hidden_s, t.comm_exposed_s) == pytest.approx((17.0, 3.0), abs=1e-9)


def test_dualpipe_pair_with_sms_taken_by_communication():
    """One layer, PP sends 1 s, 4 SMs of which each communication kernel holds 1: compute runs
    at 3/4 while one is in flight (engine/sm_share.py). By hand: B.combine [0,2] (comm);
    F.pre does 1.5 of its 3 s by 2, the rest alone: [0,3.5]; F.dispatch [3.5,5.5]; B.mlp from
    3.5, 1.5 s of work under it, 4.5 alone: [3.5,10]; B.dispatch [10,12]; B.mlp_dw 1.5 under
    it, 1.5 alone: [10,13.5]; F.mlp alone [13.5,17.5]; F.combine [17.5,19.5] then F's send
    [19.5,20.5]; B.pre 2.25 of 5 s under them: [17.5,23.25]; B's send [23.25,24.25]; B.pre_dw
    0.75 under it: [23.25,25.5]. The 10 s of communication under compute cost a quarter of
    their length: 23 + 2.5."""
    t = issued_timeline(dualpipe_pair_seconds([F_LAYER], [B_LAYER], 1.0, 1.0), sm_count=4,
                        comm_sms=1)
    got = {(who, piece): (start, end) for who, piece, _, start, end in t.spans}
    for key, span in {("b", "combine"): (0, 2), ("f", "pre_dispatch"): (0, 3.5),
                      ("f", "dispatch"): (3.5, 5.5), ("b", "mlp"): (3.5, 10),
                      ("b", "dispatch"): (10, 12), ("b", "mlp_dw"): (10, 13.5),
                      ("f", "mlp"): (13.5, 17.5), ("f", "combine"): (17.5, 19.5),
                      ("f", "pp"): (19.5, 20.5), ("b", "pre_dispatch"): (17.5, 23.25),
                      ("b", "pp"): (23.25, 24.25),
                      ("b", "pre_dispatch_dw"): (23.25, 25.5)}.items():
        assert got[key] == pytest.approx(span, abs=1e-9), key
    assert t.end_s == pytest.approx(25.5, abs=1e-9)
