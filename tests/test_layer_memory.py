"""Activation bytes of one layer, measured from the ledger, against K22's formulas (REFERENCE §1).

The simulated numbers are read from the ledger (what the layer saved for backward); the
expected numbers are written out here from K22 §4 and App. A (docs/MODEL.md#activation-memory),
independently of simsp.analytic.
"""

from fractions import Fraction
from pathlib import Path
import time

from hypothesis import given, settings, strategies as st
import pytest

from simsp import analytic
from simsp.scenario.loading import load_scenario
from simsp.model import layer as layer_module
from simsp.model.blocks.attention import core as attention_core, mha
from simsp.model.blocks.mlp import dense as dense_mlp
from simsp.training.driver.layer_sim import simulate_layer
from simsp.training.driver.iteration import simulate_iteration

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def scenario(s=32, b=1, h=64, a=4, t=1, sp=False, recompute="none", mode="numeric",
             extra=None):
    overrides = {("model", "seq_length"): s, ("model", "hidden_size"): h,
                 ("model", "num_attention_heads"): a, ("model", "vocab_size"): 8 * t,
                 ("parallel", "micro_batch_size"): b, ("parallel", "tensor_model_parallel_size"): t,
                 ("parallel", "sequence_parallel"): sp,
                 ("parallel", "recompute_granularity"): recompute, ("run", "mode"): mode}
    overrides.update(extra or {})
    return load_scenario(None, overrides)


def k22_bytes(s, b, h, a, t=1, sp=False, recompute="none") -> Fraction:
    """K22 Table 2, exactly (dropout on, ffn 4h). Full recompute keeps the layer input: 2sbh,
    sharded along the sequence (2sbh/t) when SP holds the layer input in s/t slices."""
    sbh = Fraction(s * b * h)
    if recompute == "full":
        return 2 * sbh / (t if sp else 1)
    if recompute == "selective":
        return 34 * sbh / t if sp else sbh * (10 + Fraction(24, t))
    if sp:
        return sbh / t * (34 + Fraction(5 * a * s, h))
    return sbh * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t))


def expected_saved(s, b, h, a, t=1, sp=False) -> dict:
    """Per-tensor bytes of the docstring tables of layer.py and its blocks (REFERENCE §1 with
    TP/SP sharding)."""
    rep = s * b * h // (t if sp else 1)  # replicated under TP, split along s under SP
    sharded = s * b * h // t
    core = a * s * s * b // t
    return {"ln1_input": 2 * rep, "qkv_input": 2 * rep, "q": 2 * sharded, "k": 2 * sharded,
            "v": 2 * sharded, "softmax_output": 2 * core, "softmax_dropout_mask": core,
            "attention_dropout_output": 2 * core, "proj_input": 2 * sharded,
            "attn_dropout_mask": rep, "ln2_input": 2 * rep, "fc1_input": 2 * rep,
            "gelu_input": 8 * sharded, "fc2_input": 8 * sharded, "mlp_dropout_mask": rep}


CORE = ("softmax_output", "softmax_dropout_mask", "attention_dropout_output")


def measured(result) -> list[int]:
    return [rec.activation_bytes for rec in result.records]


# --- t = 1, dropout on: sbh(34 + 5as/h), 34sbh, 2sbh for arbitrary valid shapes -------------

shapes = st.tuples(st.integers(1, 64), st.integers(1, 4), st.integers(1, 16), st.integers(1, 16))


@settings(max_examples=40, deadline=None)
@given(shape=shapes, recompute=st.sampled_from(["none", "selective", "full"]))
def test_one_layer_bytes_match_k22_for_any_shape_meta(shape, recompute):
    s, b, a, head_dim = shape
    h = a * head_dim
    s *= 16  # meta mode: realistic sequence lengths cost nothing
    result = simulate_layer(scenario(s, b, h, a, recompute=recompute, mode="meta"))
    expected = {"none": s * b * h * 34 + 5 * a * s * s * b,  # sbh(34 + 5as/h)
                "selective": 34 * s * b * h, "full": 2 * s * b * h}[recompute]
    assert measured(result) == [expected]


@settings(max_examples=25, deadline=None)
@given(s=st.integers(1, 12), b=st.integers(1, 3), a=st.integers(1, 4), head_dim=st.integers(1, 6),
       recompute=st.sampled_from(["none", "selective", "full"]))
def test_one_layer_bytes_match_k22_for_any_shape_numeric(s, b, a, head_dim, recompute):
    h = a * head_dim
    result = simulate_layer(scenario(s, b, h, a, recompute=recompute))
    assert measured(result) == [k22_bytes(s, b, h, a, recompute=recompute)]
    assert result.max_rel_err < 1e-10  # the same layer matches the single-device reference


# --- TP, SP and recompute: every row of K22 Table 2 ----------------------------------------

@settings(max_examples=40, deadline=None)
@given(t=st.sampled_from([2, 4, 8]), sp=st.booleans(),
       recompute=st.sampled_from(["none", "selective", "full"]),
       s_per_t=st.integers(1, 64), b=st.integers(1, 2), heads_per_t=st.integers(1, 4),
       head_dim=st.integers(1, 32))
def test_tp_and_sp_bytes_per_rank_match_k22_table2(t, sp, recompute, s_per_t, b, heads_per_t,
                                                   head_dim):
    s, a = 8 * s_per_t * t, heads_per_t * t
    h = a * head_dim
    result = simulate_layer(scenario(s, b, h, a, t, sp, recompute, mode="meta"))
    assert measured(result) == [k22_bytes(s, b, h, a, t, sp, recompute)] * t


@pytest.mark.parametrize("t,sp", [(1, False), (2, False), (4, False), (2, True), (4, True)])
@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_saved_tensors_have_the_reference_names_and_sizes(t, sp, recompute):
    s, b, h, a = 16, 2, 32, 4
    result = simulate_layer(scenario(s, b, h, a, t, sp, recompute))
    expected = expected_saved(s, b, h, a, t, sp)
    if recompute == "selective":
        expected = {n: v for n, v in expected.items() if n not in CORE}
    for rec in result.records:
        assert dict(rec.saved) == expected
        assert len(rec.saved) == len(expected)  # no name twice
        assert rec.activation_bytes == sum(expected.values())


def test_saved_tensor_names_are_the_ones_in_the_layer_and_block_docstrings():
    doc = "".join(module.__doc__ for module in (layer_module, mha, attention_core, dense_mlp))
    for name in expected_saved(1, 1, 1, 1):
        assert f"{name} " in doc or f"{name}," in doc, name


def test_full_recompute_keeps_only_the_layer_input():
    result = simulate_layer(scenario(recompute="full"))
    assert result.records[0].saved == [("layer_input", 2 * 32 * 64)]
    sp = simulate_layer(scenario(t=2, sp=True, recompute="full"))
    assert [rec.saved for rec in sp.records] == [[("layer_input", 2 * 32 * 64 // 2)]] * 2


def test_dropout_off_drops_the_masks_and_the_dropout_output():
    s, b, h, a = 16, 2, 32, 4
    result = simulate_layer(scenario(s, b, h, a, extra={("model", "hidden_dropout"): 0.0,
                                                        ("model", "attention_dropout"): 0.0}))
    names = [name for name, _ in result.records[0].saved]
    assert not {"softmax_dropout_mask", "attention_dropout_output", "attn_dropout_mask",
                "mlp_dropout_mask"} & set(names)
    # sbh(34 + 5as/h) less two sbh masks, the as²b mask and the 2as²b dropout output
    assert measured(result) == [32 * s * b * h + 2 * a * s * s * b]
    assert measured(result) == [analytic.layer_activation_bytes(s, b, h, a, hidden_dropout=False,
                                                                attention_dropout=False)]


def test_non_default_ffn_width_changes_only_the_mlp_terms():
    s, b, h, a, f = 16, 1, 32, 4, 96
    result = simulate_layer(scenario(s, b, h, a, extra={("model", "ffn_hidden_size"): f}))
    saved = dict(result.records[0].saved)
    assert saved["gelu_input"] == saved["fc2_input"] == 2 * s * b * f
    assert measured(result) == [s * b * h * 18 + 4 * s * b * f + 5 * a * s * s * b]


def test_every_activation_and_temporary_is_freed_after_backward():
    for sc in (scenario(), scenario(t=2, sp=True, recompute="selective"),
               scenario(t=4, recompute="full")):
        for r in simulate_layer(sc).ranks:
            assert r.ledger.live_bytes("activations") == 0
            assert r.ledger.live_bytes("temporaries") == 0
            assert r.ledger.live_bytes("communication") == 0


def test_layer_weights_and_fp32_gradients_are_12h2_plus_13h_parameters():
    h = 64
    ledger = simulate_layer(scenario(h=h)).ranks[0].ledger
    params = 12 * h * h + 13 * h  # REFERENCE §1
    assert ledger.current["weights"] == 2 * params
    assert ledger.current["gradients"] == 4 * params


# --- the paper's ratios (REFERENCE §1 table, K22 Fig. 7), measured in meta mode --------------

PAPER = {  # model: (a, h, [+SP, +selective, SP+selective, full recompute] as % of TP baseline)
    "22B": (64, 6144, [66.8, 49.4, 16.1, 7.6]),
    "175B": (96, 12288, [62.0, 56.5, 18.5, 8.7]),
    "530B": (128, 20480, [58.3, 61.9, 20.2, 9.5]),
}


@pytest.mark.parametrize("model", PAPER)
def test_measured_ratios_to_the_tp_baseline_match_k22_figure_7(model):
    a, h, published = PAPER[model]

    def bytes_of(sp, recompute):
        sc = scenario(2048, 1, h, a, 8, sp, recompute, mode="meta")
        return measured(simulate_layer(sc))[0]

    baseline = bytes_of(False, "none")
    ratios = [bytes_of(True, "none"), bytes_of(False, "selective"), bytes_of(True, "selective"),
              bytes_of(False, "full")]
    assert [round(100 * r / baseline, 1) for r in ratios] == published


# --- full recompute: what the activations category holds at the backward's peak -------------

def activation_curve(ledger):
    """[(event, activations bytes after it)] for the activations category."""
    level, curve = 0, []
    for event in ledger.events:
        if event.category == "activations":
            level += event.delta_bytes
            curve.append((event, level))
    return curve


def test_full_recompute_backward_peak_of_one_layer_is_its_whole_saved_set():
    """Forward keeps 2sbh. The backward re-runs the forward from that input, and the kept input
    *becomes* `ln1_input` (a retag of the same buffer, not a copy), so the peak is the layer's
    full set sbh(34 + 5as/h) = 2sbh (the kept input) + sbh(32 + 5as/h) recomputed, reached when
    the recomputed forward has saved its last tensor (the MLP dropout mask)."""
    s, b, h, a = 32, 2, 64, 4
    sbh = s * b * h
    result = simulate_layer(scenario(s, b, h, a, recompute="full"))
    ledger = result.ranks[0].ledger
    full_set = sbh * 34 + 5 * a * s * s * b
    assert result.records[0].activation_bytes == 2 * sbh
    assert ledger.peak_by_category["activations"] == full_set
    curve = activation_curve(ledger)
    # the retag: -2sbh layer_input then +2sbh ln1_input at the same time, level unchanged
    retag = [i for i, (e, _) in enumerate(curve) if e.op == "retag"]
    assert len(retag) == 1
    gone, back = curve[retag[0]], curve[retag[0] + 1]
    assert gone[0].delta_bytes == -2 * sbh and back[0].key == "ln1_input"
    assert back[0].delta_bytes == 2 * sbh and back[0].time_s == gone[0].time_s
    assert back[1] == 2 * sbh
    # the peak comes after the forward ended (during the recompute), at the last save
    peak_index = max(range(len(curve)), key=lambda i: curve[i][1])
    peak_event = curve[peak_index][0]
    assert peak_event.time_s > result.records[0].forward_end_s
    assert peak_event.key == "mlp_dropout_mask"
    assert sum(e.delta_bytes for e, _ in curve[retag[0] + 2:peak_index + 1]) == full_set - 2 * sbh


def test_full_recompute_backward_peak_with_sp_is_the_sharded_full_set():
    s, b, h, a, t = 32, 1, 64, 4, 2
    result = simulate_layer(scenario(s, b, h, a, t, True, "full"))
    for r in result.ranks:
        assert r.ledger.peak_by_category["activations"] == k22_bytes(s, b, h, a, t, True)


def test_full_recompute_peak_in_a_two_layer_model_is_2sbh_plus_one_full_set():
    """Whole iteration, 2 layers, p = 1, one micro-batch: while layer 1 is recomputed, layer 0's
    kept input (2sbh) and the embedding dropout mask (sbh, K22 §4.3) are live besides layer 1's
    full set; the head's tensors (final LN input, output-projection input, fp32 logits) were
    freed by the head's backward before layer 1's recompute started."""
    s, b, h, a = 32, 1, 64, 4
    sbh = s * b * h
    run = simulate_iteration(scenario(s, b, h, a, recompute="full", mode="meta"))
    ledger = run.inputs.world.ranks[0].ledger
    assert ledger.peak_by_category["activations"] == sbh + 2 * sbh + (34 * sbh + 5 * a * s * s * b)


# --- the 530B layer in meta mode ---------------------------------------------------------------

def test_530b_layer_in_meta_mode_saves_34sbh_over_t(capsys):
    s, b, h, a, t = 2048, 1, 20480, 128, 8
    sc = scenario(s, b, h, a, t, True, "selective", mode="meta")
    start = time.perf_counter()
    result = simulate_layer(sc)
    elapsed = time.perf_counter() - start
    assert measured(result) == [34 * s * b * h // t] * t
    assert all(rec.out is None for rec in result.records)  # no arrays in meta mode
    with capsys.disabled():
        print(f"\n530B layer (t=8, SP, selective) meta simulate_layer: {elapsed * 1e3:.1f} ms")


# --- `simsp layer` on the shipped scenarios ---------------------------------------------------

@pytest.mark.parametrize("name", ["paper-22b", "paper-1t"])
def test_layer_runs_on_the_shipped_pipeline_scenarios(name):
    sc = load_scenario(SCENARIOS / f"{name}.toml")
    result = simulate_layer(sc)
    m, p = sc.model, sc.parallel
    expected = k22_bytes(m.seq_length, p.micro_batch_size, m.hidden_size, m.num_attention_heads,
                         p.tp, p.sequence_parallel, p.recompute_granularity)
    assert measured(result) == [expected] * p.tp


@pytest.mark.parametrize("name", ["paper-175b", "paper-530b"])
def test_layer_runs_on_the_shipped_interleaved_scenarios(name):
    sc = load_scenario(SCENARIOS / f"{name}.toml")
    result = simulate_layer(sc)
    assert measured(result) == [34 * sc.model.seq_length * sc.model.hidden_size // 8] * 8


def test_layer_runs_in_numeric_mode_with_pipeline_stages():
    sc = load_scenario(SCENARIOS / "tiny.toml")  # t 2, SP, p 2, d 2, selective, numeric
    result = simulate_layer(sc)
    assert measured(result) == [k22_bytes(32, 2, 64, 4, 2, True, "selective")] * 2
