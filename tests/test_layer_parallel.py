"""One layer on t = 1, 2, 4, 8 ranks, SP on/off, each recompute mode.

Numeric mode against the single-device reference; ledger-measured activation bytes against
K22 Table 2 (simsp.analytic); meta and numeric modes give the same ledger; communication bytes
per rank against the ring closed forms of docs/MODEL.md#collectives.
"""

from hypothesis import given, settings, strategies as st
import pytest

from simsp import analytic
from simsp.commands.layer import layer_report
from simsp.scenario.loading import load_scenario
from simsp.training.driver.layer_sim import simulate_layer

RECOMPUTE = ("none", "selective", "full")
LAYOUTS = [(1, False), (2, False), (2, True), (4, False), (4, True), (8, False), (8, True)]
SMALL = dict(s=16, b=2, h=64, a=8)  # small enough for numeric mode, a divisible by t = 8


def scenario(s, b, h, a, t=1, sp=False, recompute="none", mode="numeric"):
    """One layer, dropout on (p = 0.1 in both places), on one TP group of t ranks."""
    return load_scenario(None, {
        ("model", "num_layers"): 1, ("model", "seq_length"): s, ("model", "hidden_size"): h,
        ("model", "num_attention_heads"): a, ("model", "vocab_size"): 8 * t,
        ("model", "hidden_dropout"): 0.1, ("model", "attention_dropout"): 0.1,
        ("parallel", "micro_batch_size"): b, ("parallel", "tensor_model_parallel_size"): t,
        ("parallel", "sequence_parallel"): sp, ("parallel", "recompute_granularity"): recompute,
        ("run", "mode"): mode})


def measured(result) -> list[int]:
    """Activation bytes each rank's ledger held at the end of the forward pass."""
    return [rec.activation_bytes for rec in result.records]


# --- numeric: every layout computes what one device computes --------------------------------

@pytest.mark.parametrize("recompute", RECOMPUTE)
@pytest.mark.parametrize("t,sp", LAYOUTS)
def test_parallel_layer_matches_the_single_device_reference(t, sp, recompute):
    result = simulate_layer(scenario(**SMALL, t=t, sp=sp, recompute=recompute))
    assert result.max_rel_err <= 1e-10  # output, input gradient and every weight gradient


# --- activation bytes: the ledger equals K22 Table 2 -----------------------------------------

@st.composite
def layouts(draw):
    """A valid (s, b, h, a, t, sp): a divisible by t, h by a, s by t under SP."""
    t = draw(st.sampled_from([1, 2, 4, 8]))
    sp = t > 1 and draw(st.booleans())
    a = t * draw(st.integers(1, 4))
    h = a * draw(st.integers(1, 16))
    s = t * draw(st.integers(1, 64))
    return s, draw(st.integers(1, 4)), h, a, t, sp


@settings(max_examples=40, deadline=None)
@given(layout=layouts(), recompute=st.sampled_from(RECOMPUTE))
def test_ledger_activation_bytes_equal_k22_table2_meta(layout, recompute):
    s, b, h, a, t, sp = layout
    result = simulate_layer(scenario(s, b, h, a, t, sp, recompute, mode="meta"))
    formula = analytic.layer_activation_bytes(s, b, h, a, t, sp, recompute)
    assert measured(result) == [formula] * t
    if not (recompute == "full" and sp):  # K22's full-recompute row is 2sbh without SP
        table2 = analytic.table2_bytes(s, b, h, a, t, sp, recompute)
        assert measured(result) == [pytest.approx(table2, rel=1e-12)] * t


@pytest.mark.parametrize("t,sp,recompute", [(1, False, "none"), (2, True, "selective"),
                                            (4, False, "full"), (4, True, "none"),
                                            (8, True, "full")])
def test_meta_and_numeric_modes_give_identical_ledgers(t, sp, recompute):
    numeric = simulate_layer(scenario(**SMALL, t=t, sp=sp, recompute=recompute))
    meta = simulate_layer(scenario(**SMALL, t=t, sp=sp, recompute=recompute, mode="meta"))
    for r_numeric, r_meta in zip(numeric.ranks, meta.ranks, strict=True):
        assert r_numeric.ledger.events == r_meta.ledger.events  # names, bytes, times, order
    assert measured(numeric) == measured(meta)


# --- communication bytes per rank, one layer, one micro-batch (docs/MODEL.md#collectives) ---

def comm(t, sp, recompute="none", s=32, b=2, h=64, a=8) -> list[dict]:
    """`simsp layer --json`'s comm_bytes_per_rank: [{phase: {kind: bytes sent}}] per rank."""
    result = simulate_layer(scenario(s, b, h, a, t, sp, recompute, mode="meta"))
    return layer_report(result)["comm_bytes_per_rank"]


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tp_sends_four_all_reduces_of_2sbh_bytes(t):
    s, b, h = 32, 2, 64
    S = 2 * s * b * h  # one (s, b, h) fp16 activation
    all_reduce = 2 * (t - 1) * S // t  # ring: 2(t-1) steps of S/t
    for per_rank in comm(t, sp=False):
        assert per_rank == {"forward": {"all_reduce": 2 * all_reduce},
                            "backward": {"all_reduce": 2 * all_reduce}}


@pytest.mark.parametrize("t", [2, 4, 8])
def test_sp_replaces_each_all_reduce_by_an_all_gather_and_a_reduce_scatter(t):
    s, b, h = 32, 2, 64
    S = 2 * s * b * h
    half = (t - 1) * S // t  # all-gather or reduce-scatter: t-1 steps of S/t
    for tp, sp in zip(comm(t, sp=False), comm(t, sp=True), strict=True):
        assert sp["forward"] == {"all_gather": 2 * half, "reduce_scatter": 2 * half}
        assert sp["backward"]["all_gather"] == sp["backward"]["reduce_scatter"] == 2 * half
        # the extra backward all-gather of the LN outputs Y (K22 §4.2.2), under its own key
        assert sp["backward"]["all_gather_ln_output"] == 2 * half
        moved = sum(sp[p]["all_gather"] + sp[p]["reduce_scatter"] for p in sp)
        assert moved == sum(tp[p]["all_reduce"] for p in tp) == 4 * 2 * half


def test_sp_all_reduces_only_the_small_sequence_partial_gradients():
    """LN gammas/betas and the row-parallel biases: 6 vectors of h fp32 values."""
    t, h = 4, 64
    for per_rank in comm(t, sp=True, h=h):
        assert per_rank["backward"]["all_reduce_sp_grads"] == 6 * 2 * (t - 1) * 4 * h // t


def test_full_recompute_repeats_the_forward_all_reduces_in_backward():
    t = 4
    plain, full = comm(t, sp=False)[0], comm(t, sp=False, recompute="full")[0]
    assert full["forward"] == plain["forward"]
    assert full["backward"]["all_reduce"] == 2 * plain["backward"]["all_reduce"]
