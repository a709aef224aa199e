"""Llama-class layers: ledger bytes vs the closed forms of docs/llama.md, the numeric layer vs
the single-device reference, exact parameter counts, FLOPs formulas reducing to K22's.

The closed form under test (simsp.analytic.llama_layer_activation_bytes) is also rebuilt here
tensor by tensor from the docs/llama.md table, so the ledger, the formula and the table must
all agree."""

import itertools
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings, strategies as st
import numpy as np

from simsp import analytic
from simsp.scenario.config import Model, Parallel
from simsp.scenario.loading import load_scenario
from simsp.model.base.kernels import dropout_backward, dropout_forward, keep_mask
from simsp.model.blocks.attention.core import (attention_context_backward,
                                               attention_scores_backward, attention_scores_forward,
                                               causal_softmax_forward, softmax_backward)
from simsp.model.blocks.attention.flash import flash_backward, flash_forward
from simsp.model.blocks.attention.heads import expand_kv, reduce_kv
from simsp.training.driver.layer_sim import simulate_layer
from simsp.model.params import param_shapes



def count_params(model) -> int:
    """Total parameters, summed over param_shapes."""
    return sum(int(np.prod(shape)) for shape in param_shapes(model).values())

def llama(t=1, sp=False, recompute="none", groups=None, swiglu=True, rms=True, rope=True,
          flash=False, bias=False, dropout=0.0, s=32, h=64, a=8, b=1, kv=None, mode="meta",
          f=96, modules=None):
    o = {("model", "seq_length"): s, ("model", "hidden_size"): h,
         ("model", "num_attention_heads"): a, ("model", "vocab_size"): 64,
         ("model", "ffn_hidden_size"): f, ("model", "swiglu"): swiglu,
         ("model", "normalization"): "RMSNorm" if rms else "LayerNorm",
         ("model", "position_embedding_type"): "rope" if rope else "learned_absolute",
         ("model", "attention_backend"): "flash" if flash else "unfused",
         ("model", "add_bias_linear"): bias, ("model", "hidden_dropout"): dropout,
         ("model", "attention_dropout"): dropout, ("model", "kv_channels"): kv,
         ("parallel", "micro_batch_size"): b, ("parallel", "tensor_model_parallel_size"): t,
         ("parallel", "sequence_parallel"): sp,
         ("parallel", "recompute_granularity"): recompute, ("run", "mode"): mode,
         ("parallel", "recompute_modules"): modules}
    if groups is not None:
        o[("model", "group_query_attention")] = True
        o[("model", "num_query_groups")] = groups
    return load_scenario(None, o)


def table_bytes(m: Model, b: int, t: int, sp: bool, recompute: str, modules=None) -> dict:
    """docs/llama.md's per-tensor table, {name: bytes per rank}."""
    rebuilt = set((modules or "core_attn").split()) if recompute == "selective" else set()
    s, h, a, d, f = m.seq_length, m.hidden_size, m.num_attention_heads, m.head_dim, m.ffn
    rep = s * b * h // (t if sp else 1)
    if recompute == "full":
        return {"layer_input": 2 * rep}
    kv = (m.query_groups if m.flash else a) // t
    out = {"ln1_input": 2 * rep, "qkv_input": 2 * rep, "q": 2 * s * b * a // t * d,
           "k": 2 * s * b * kv * d, "v": 2 * s * b * kv * d, "proj_input": 2 * s * b * a // t * d,
           "ln2_input": 2 * rep, "fc1_input": 2 * rep, "fc2_input": 2 * s * b * f // t}
    out["swiglu_input" if m.swiglu else "gelu_input"] = (4 if m.swiglu else 2) * s * b * f // t
    if m.hidden_dropout > 0:
        out["attn_dropout_mask"] = out["mlp_dropout_mask"] = rep
    if "layernorm" in rebuilt:
        del out["qkv_input"], out["fc1_input"]
    if "mlp" in rebuilt:
        del out["fc2_input"], out["swiglu_input" if m.swiglu else "gelu_input"]
    if "core_attn" not in rebuilt:
        if m.flash:
            out["softmax_lse"] = 4 * b * a // t * s
        else:
            core = a // t * s * s * b
            out["softmax_output"] = 2 * core
            if m.attention_dropout > 0:
                out["softmax_dropout_mask"], out["attention_dropout_output"] = core, 2 * core
    return out


LAYOUTS = st.sampled_from([(1, False), (2, False), (2, True), (4, True)])
RECOMPUTE = st.sampled_from([("none", None), ("selective", None), ("full", None),
                             ("selective", "mlp"), ("selective", "layernorm"),
                             ("selective", "core_attn mlp layernorm"),
                             ("selective", "layernorm mlp")])


@settings(max_examples=20, deadline=None)
@given(layout=LAYOUTS, recompute=RECOMPUTE,
       kind=st.sampled_from(["mha", "gqa", "mqa"]), swiglu=st.booleans(), rms=st.booleans(),
       rope=st.booleans(), flash=st.booleans(), bias=st.booleans(),
       dropout=st.sampled_from([0.0, 0.1]), b=st.integers(1, 2), kv=st.sampled_from([None, 12]),
       s=st.sampled_from([16, 24, 40]), h=st.sampled_from([32, 64]))
def test_ledger_equals_closed_form(layout, recompute, kind, swiglu, rms, rope, flash, bias,
                                   dropout, b, kv, s, h):
    """Random draws over the same factors plus t 4 with SP and two-module recompute sets: the
    ledger's activation bytes after forward equal the closed form and the docs table, tensor by
    tensor, to the byte (meta mode, one TP group)."""
    t, sp = layout
    recompute, modules = recompute
    groups = {"mha": None, "gqa": 4, "mqa": 1}[kind]
    if kind == "mqa" and t > 1:
        t, sp = 1, False  # Megatron needs t | G
    sc = llama(t, sp, recompute, groups, swiglu, rms, rope, flash, bias, dropout, b=b, kv=kv,
               modules=modules, s=s, h=h)
    result = simulate_layer(sc)
    measured = result.records[0].activation_bytes
    formula = analytic.llama_layer_activation_bytes(sc.model, b, t, sp, recompute,
                                                    sc.parallel.recompute_module_set)
    table = table_bytes(sc.model, b, t, sp, recompute, modules)
    assert measured == formula == sum(table.values())
    assert dict(result.records[0].saved) == table


ARCHITECTURES = list(itertools.product(["mha", "gqa", "mqa"], [False, True], [False, True],
                                       [False, True], [False, True]))
EVERY_RECOMPUTE = [("none", None), ("selective", None), ("full", None), ("selective", "mlp"),
                   ("selective", "layernorm"), ("selective", "core_attn mlp layernorm")]


def test_ledger_equals_closed_form_for_every_combination():
    """Exhaustively, MHA/GQA/MQA x GeLU/SwiGLU x LayerNorm/RMSNorm x learned/rope x flash or
    not x (t 1, t 2, t 2 with SP; MQA t 1 only: Megatron needs t | G) x each recompute choice:
    ledger = closed form = docs table, tensor by tensor. Each combination's shape (s, h, b,
    head dimension, dropout, bias) is drawn from a seeded generator, so the shapes vary too."""
    rng = np.random.default_rng(24)
    checked = 0
    for (kind, swiglu, rms, rope, flash), (recompute, modules) in itertools.product(
            ARCHITECTURES, EVERY_RECOMPUTE):
        layouts = [(1, False)] if kind == "mqa" else [(1, False), (2, False), (2, True)]
        for t, sp in layouts:
            s, h, b = (int(rng.choice(values)) for values in ([16, 24, 40], [32, 64], [1, 2]))
            kv, dropout, bias = rng.choice([None, 12]), rng.choice([0.0, 0.1]), rng.integers(2)
            sc = llama(t, sp, recompute, {"mha": None, "gqa": 4, "mqa": 1}[kind], swiglu, rms,
                       rope, flash, bool(bias), float(dropout), s=s, h=h, b=b, kv=kv,
                       modules=modules)
            record = simulate_layer(sc).records[0]
            formula = analytic.llama_layer_activation_bytes(sc.model, b, t, sp, recompute,
                                                            sc.parallel.recompute_module_set)
            table = table_bytes(sc.model, b, t, sp, recompute, modules)
            combination = (kind, swiglu, rms, rope, flash, t, sp, recompute, modules)
            assert record.activation_bytes == formula == sum(table.values()), combination
            assert dict(record.saved) == table
            checked += 1
    assert checked == (2 * 3 + 1) * 16 * len(EVERY_RECOMPUTE)


@settings(max_examples=30, deadline=None)
@given(layout=LAYOUTS, recompute=st.sampled_from(["none", "selective", "full"]),
       s=st.sampled_from([16, 32, 48]), h=st.sampled_from([32, 64]), a=st.sampled_from([4, 8]),
       dropout=st.booleans(), b=st.integers(1, 3))
def test_closed_form_is_k22_for_gpt(layout, recompute, s, h, a, dropout, b):
    """With G = a, GeLU, LayerNorm, learned positions, unfused, the Llama closed form is
    K22's layer_activation_bytes (analytic.py) for every layout."""
    t, sp = layout
    p = 0.1 if dropout else 0.0
    m = Model(seq_length=s, hidden_size=h, num_attention_heads=a, hidden_dropout=p,
              attention_dropout=p)
    assert analytic.llama_layer_activation_bytes(m, b, t, sp, recompute) == \
        analytic.layer_activation_bytes(s, b, h, a, t, sp, recompute, None, dropout, dropout)


VARIANTS = [dict(groups=2), dict(groups=1, swiglu=False), dict(flash=True, dropout=0.1),
            dict(flash=True, groups=2, recompute="selective"), dict(rope=False, rms=False),
            dict(bias=True, dropout=0.1, groups=4), dict(kv=12, groups=4, flash=True),
            dict(groups=4, recompute="selective", dropout=0.1),
            dict(recompute="selective", modules="mlp layernorm", dropout=0.1, bias=True),
            dict(recompute="selective", modules="core_attn mlp layernorm", flash=True)]


def test_numeric_layer_matches_reference():
    """Each variant's parallel layer (t = 2 with SP; MQA at t = 1) equals the single-device
    reference to rounding: output, input gradient and every weight gradient."""
    for variant in VARIANTS:
        t = 1 if variant.get("groups") == 1 else 2
        sc = llama(t, t > 1, mode="numeric", s=40, **variant)
        assert simulate_layer(sc).max_rel_err < 1e-12, variant


def test_flash_kernel_equals_plain_attention():
    """The blockwise (tiled, online-softmax) attention equals softmax(QKᵀ/√d)·V and its
    gradients, with GQA and a dropout mask, to rounding (s not a multiple of the tile)."""
    rng = np.random.default_rng(0)
    b, a, G, s, d = 2, 4, 2, 37, 8
    q, k, v, dout = (rng.normal(size=(b, n, s, d)) for n in (a, G, G, a))
    full_keep = keep_mask(0.2, 3, 5, (0, 0, 0, 0), (b, a, s, s))
    keep = lambda i0, i1, j0, j1: full_keep[:, :, i0:i1, j0:j1]
    out, lse = flash_forward(q, k, v, keep, 0.2)
    kx, vx = expand_kv(k, a // G), expand_kv(v, a // G)
    probs = causal_softmax_forward(attention_scores_forward(q, kx))
    dropped = dropout_forward(probs, full_keep, 0.2)
    assert np.abs(out - dropped @ vx).max() < 1e-13
    dq, dk, dv = flash_backward(dout, q, k, v, out, lse, keep, 0.2)
    dprobs_d, dvx = attention_context_backward(dout, dropped, vx)
    dscores = softmax_backward(dropout_backward(dprobs_d, full_keep, 0.2), probs)
    dq_ref, dkx = attention_scores_backward(dscores, q, kx)
    assert np.abs(dq - dq_ref).max() < 1e-12
    assert np.abs(dk - reduce_kv(dkx, a // G)).max() < 1e-12
    assert np.abs(dv - reduce_kv(dvx, a // G)).max() < 1e-12


def test_flash_skips_the_tiles_above_the_diagonal():
    """Causal FlashAttention runs each 128-row query block against the keys up to its last row:
    at s = 300 the blocks see 128, 256 and 300 keys, 128·128 + 128·256 + 44·300 = 62,352 of
    the 90,000 score elements (by hand); the unfused core computes all s². Per rank (t 2: 4
    heads, d 8) flash's forward has 2 core GEMMs less by 2·4·8·(90,000 − 62,352) FLOPs each,
    its backward 4, and its backward's recomputed QKᵀ is 2·4·8·62,352."""
    for groups in (None, 4):
        flash, unfused = (simulate_layer(llama(2, True, groups=groups, flash=f, s=300))
                          .ranks[0].flops for f in (True, False))
        gemm = 2 * 4 * 8 * (300 * 300 - 62_352)
        assert unfused["forward"] - flash["forward"] == 2 * gemm
        assert unfused["backward"] - flash["backward"] == 4 * gemm
        assert flash["recompute"] == 2 * 4 * 8 * 62_352 and unfused["recompute"] == 0


PUBLISHED = {  # Meta's model cards (Llama 2, Llama 3, Llama 3.1): exact parameter counts
    "llama2-7b": 6_738_415_616, "llama2-70b": 68_976_648_192, "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496, "llama3.1-405b": 405_853_388_800}


def test_bundled_llama_parameter_counts_are_published():
    """The bundled scenarios' architectures have exactly the published parameter counts
    (unpadded vocabulary), by the shapes and by the closed form."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "scenarios"
    for name, published in PUBLISHED.items():
        m = load_scenario(root / f"{name}.toml").model
        assert count_params(m) == analytic.llama_parameter_count(m) == published, name


def test_megatron_flops_reduce_to_k22():
    """num_floating_point_operations with G = a, GeLU, f = 4h is K22's 72BLsh²(1 + s/6h +
    v/12hL) (relative 1e-15: float order)."""
    m, p = Model(num_layers=96, hidden_size=12288, num_attention_heads=96, seq_length=2048,
                 vocab_size=51200), Parallel(tensor_model_parallel_size=8, global_batch_size=64)
    assert abs(analytic.megatron_model_flops(m, p) / analytic.model_flops(m, p) - 1) < 1e-14


def test_megatron_flops_llama3_8b_by_hand():
    """Llama 3 8B, B = 1, s = 8192, padded v = 128256 (t = 1): the formula's terms by hand."""
    m = Model(num_layers=32, hidden_size=4096, num_attention_heads=32, seq_length=8192,
              vocab_size=128256, ffn_hidden_size=14336, swiglu=True, group_query_attention=True,
              num_query_groups=8)
    p = Parallel(global_batch_size=1)
    s, L, h = 8192, 32, 4096
    per_layer = 2 * s * (h * 6144 + 4096 * h + 3 * h * 14336) * 3 + 3 * 4 * s * s * 4096
    logits = 6 * s * h * 128256
    assert abs(analytic.megatron_model_flops(m, p) / (per_layer * L + logits) - 1) < 1e-14


def test_hardware_flops_formula_equals_counted():
    """The run's counted GEMM FLOPs (forward + backward + recompute, from the cost model's
    calls) equal llama_hardware_flops less the logits' share (the head is counted by the run
    too: both sides include it) for flash, selective modules and full recompute."""
    for extra in ({("model", "attention_backend"): "flash"},
                  {("parallel", "recompute_granularity"): "selective",
                   ("parallel", "recompute_modules"): "core_attn mlp layernorm"},
                  {("parallel", "recompute_granularity"): "full"}):
        sc = llama_run(extra)
        from simsp.metrics.flops import counted_flops
        from simsp.training.driver.iteration import Shortcuts, simulate_iteration
        run = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none")
        model, hardware = counted_flops(run)
        m, p = sc.padded_model, sc.parallel
        assert abs(model / analytic.megatron_model_flops(m, p) - 1) < 1e-12, extra
        assert abs(hardware / analytic.llama_hardware_flops(m, p) - 1) < 1e-12, extra


def llama_run(extra: dict):
    o = {("model", "seq_length"): 64, ("model", "hidden_size"): 64,
         ("model", "num_attention_heads"): 8, ("model", "vocab_size"): 256,
         ("model", "ffn_hidden_size"): 96, ("model", "swiglu"): True,
         ("model", "group_query_attention"): True, ("model", "num_query_groups"): 2,
         ("model", "num_layers"): 4, ("model", "add_bias_linear"): False,
         ("parallel", "tensor_model_parallel_size"): 2, ("parallel", "sequence_parallel"): True,
         ("parallel", "pipeline_model_parallel_size"): 2, ("parallel", "global_batch_size"): 4,
         ("run", "mode"): "meta"}
    return load_scenario(None, {**o, **extra})


def test_pipeline_layer_counts_follow_megatron():
    """Megatron's get_num_layers_to_build, worked by hand: 405B's (126 + 2) / 8 = 16 with the
    embedding and loss stages one short; a given first stage with the rest spread evenly; a
    given last stage; both given on two stages."""
    from simsp.scenario.pipeline_split import pipeline_layer_counts
    sc = load_scenario(Path(__file__).resolve().parents[1] / "scenarios" / "llama3.1-405b.toml")
    assert pipeline_layer_counts(sc.model, sc.parallel) == (15,) + (16,) * 6 + (15,)
    m = Model(num_layers=10)
    assert pipeline_layer_counts(m, Parallel(pipeline_model_parallel_size=4,
                                             decoder_first_pipeline_num_layers=1)) == (1, 3, 3, 3)
    assert pipeline_layer_counts(m, Parallel(pipeline_model_parallel_size=3,
                                             decoder_last_pipeline_num_layers=2)) == (4, 4, 2)
    assert pipeline_layer_counts(m, Parallel(pipeline_model_parallel_size=2,
                                             decoder_first_pipeline_num_layers=3,
                                             decoder_last_pipeline_num_layers=7)) == (3, 7)


def test_uneven_pipeline_runs_its_layers_and_errors_name_the_field():
    """The plans hold each stage's layers once, in order; impossible splits are one error."""
    import pytest
    from simsp.cluster.grid import RankGrid
    from simsp.errors import UserError
    from simsp.training.pipeline.plan import stage_plans
    sc = load_scenario(None, {("model", "num_layers"): 8,
                              ("parallel", "pipeline_model_parallel_size"): 3,
                              ("parallel", "account_for_embedding_in_pipeline_split"): True,
                              ("parallel", "global_batch_size"): 3, ("run", "mode"): "meta"})
    plans = stage_plans(sc, RankGrid(1, 3, 1))
    assert [list(plans[r].all_layers()) for r in range(3)] == [[0, 1], [2, 3, 4], [5, 6, 7]]
    sc = load_scenario(None, {("model", "num_layers"): 6,
                              ("parallel", "pipeline_model_parallel_size"): 2,
                              ("parallel", "schedule"): "interleaved",
                              ("parallel", "num_layers_per_virtual_pipeline_stage"): 2,
                              ("parallel", "account_for_embedding_in_pipeline_split"): True,
                              ("parallel", "account_for_loss_in_pipeline_split"): True,
                              ("parallel", "global_batch_size"): 4, ("run", "mode"): "meta"})
    plans = stage_plans(sc, RankGrid(1, 2, 1))  # Megatron's get_transformer_layer_offset
    assert [[list(plans[r].layers(c)) for c in range(2)] for r in range(2)] == \
        [[[0], [3, 4]], [[1, 2], [5]]]
    sc = load_scenario(None, {("model", "num_layers"): 8,
                              ("parallel", "pipeline_model_parallel_size"): 3,
                              ("parallel", "decoder_first_pipeline_num_layers"): 2,
                              ("parallel", "decoder_last_pipeline_num_layers"): 2,
                              ("parallel", "num_virtual_stages_per_pipeline_rank"): 2,
                              ("parallel", "global_batch_size"): 3, ("run", "mode"): "meta"})
    plans = stage_plans(sc, RankGrid(1, 3, 1))  # offsets worked by hand from Megatron's formula
    assert [[list(plans[r].layers(c)) for c in range(2)] for r in range(3)] == \
        [[[0], [4]], [[1, 2], [5, 6]], [[3], [7]]]
    bad = [({("parallel", "decoder_first_pipeline_num_layers"): 3}, "decoder_first"),
           ({("parallel", "decoder_last_pipeline_num_layers"): 7}, "decoder_last"),
           ({("parallel", "account_for_loss_in_pipeline_split"): True,
             ("parallel", "account_for_embedding_in_pipeline_split"): True}, "account_for"),
           ({("parallel", "decoder_first_pipeline_num_layers"): 2,
             ("parallel", "account_for_loss_in_pipeline_split"): True}, "decoder_first"),
           ({("parallel", "decoder_first_pipeline_num_layers"): 2,
             ("parallel", "schedule"): "interleaved",
             ("parallel", "num_layers_per_virtual_pipeline_stage"): 1}, "num-virtual-stages"),
           ({("parallel", "decoder_first_pipeline_num_layers"): 2,
             ("parallel", "num_virtual_stages_per_pipeline_rank"): 2}, "num_virtual_stages")]
    for extra, field in bad:
        with pytest.raises(UserError) as info:
            load_scenario(None, {("model", "num_layers"): 8,
                                 ("parallel", "pipeline_model_parallel_size"): 3, **extra})
        assert field in info.value.args[0] or field in str(info.value)


SPLITS = {"first": {"decoder_first_pipeline_num_layers": 2},
          "last": {"decoder_last_pipeline_num_layers": 2},
          "both": {"decoder_first_pipeline_num_layers": 2, "decoder_last_pipeline_num_layers": 4},
          "embedding": {"account_for_embedding_in_pipeline_split": True},
          "loss": {"account_for_loss_in_pipeline_split": True},
          "embedding and loss": {"account_for_embedding_in_pipeline_split": True,
                                 "account_for_loss_in_pipeline_split": True}}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(shape=st.sampled_from([(6, 2), (8, 3), (10, 3), (12, 4), (14, 4)]),
       split=st.sampled_from(sorted(SPLITS)), schedule=st.sampled_from(["gpipe", "1f1b",
                                                                        "interleaved"]),
       recompute=st.sampled_from(["none", "selective", "full"]), batches=st.integers(1, 2))
def test_uneven_stage0_activation_peak_equals_formula(shape, split, schedule, recompute, batches):
    """Megatron's uneven splits under every schedule: stage 0's ledger activation peak over a
    whole meta iteration equals analytic.first_stage_activation_bytes to the byte (a Llama
    layer: SwiGLU, RMSNorm, RoPE, flash). Interleaving takes 2 chunks a stage for given
    first/last counts, 2 layers a virtual stage with the accounted embedding/loss (chunks of
    1 and 2 layers, as 405B's)."""
    from simsp.errors import UserError
    from simsp.training.driver.iteration import Shortcuts, simulate_iteration
    layers, p = shape
    fields = {("model", "num_layers"): layers, ("parallel", "pipeline_model_parallel_size"): p,
              ("parallel", "global_batch_size"): batches * p, ("run", "mode"): "meta",
              ("model", "swiglu"): True, ("model", "normalization"): "RMSNorm",
              ("model", "attention_backend"): "flash", ("model", "position_embedding_type"): "rope",
              ("parallel", "recompute_granularity"): recompute, ("parallel", "schedule"): schedule,
              **{("parallel", k): v for k, v in SPLITS[split].items()}}
    accounted = split in ("embedding", "loss", "embedding and loss")
    if schedule == "interleaved" and accounted:
        fields[("parallel", "num_layers_per_virtual_pipeline_stage")] = 2
    elif schedule == "interleaved":
        fields[("parallel", "num_virtual_stages_per_pipeline_rank")] = 2
    try:
        sc = load_scenario(None, fields)
    except UserError:
        assume(False)  # Megatron (and simsp) reject this split
    run = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none")
    stage0 = run.inputs.world.ranks[run.inputs.rank_of(0, 0, 0)]
    assert stage0.ledger.peak_by_category["activations"] == \
        analytic.first_stage_activation_bytes(sc)


def test_accounted_split_on_one_stage_is_megatrons_even_split():
    """At p = 1 Megatron's get_num_layers_to_build gives the one stage (L + 1 + 1) − 1 − 1 = L
    layers: the accounted embedding and loss are accepted (a search keeps its p = 1 layouts)
    and the iteration is the plain one, to the number."""
    import simsp
    base = {"mode": "meta", "num_layers": 3, "global_batch_size": 2}
    plain = simsp.run(None, **base)
    accounted = simsp.run(None, **base, account_for_embedding_in_pipeline_split=True,
                          account_for_loss_in_pipeline_split=True)
    assert accounted["iteration_time_s"] == plain["iteration_time_s"]
    assert [r["peak_bytes"] for r in accounted["ranks"]] == \
        [r["peak_bytes"] for r in plain["ranks"]]


def test_search_takes_every_llama_field():
    """A search over 2 GPUs with every Llama field and Megatron's accounted split keeps its
    p = 1 layouts (the even split there) and splits p = 2 as (4 + 2)/2 − 1 = 2 layers a stage."""
    import simsp
    frame = simsp.search(None, gpus=2, global_batch_size=4, num_layers=4, hidden_size=64,
                         num_attention_heads=4, seq_length=32, swiglu=True,
                         normalization="RMSNorm", position_embedding_type="rope",
                         group_query_attention=True, num_query_groups=2, kv_channels=8,
                         attention_backend="flash", untie_embeddings_and_output_weights=True,
                         add_bias_linear=False, account_for_embedding_in_pipeline_split=True,
                         account_for_loss_in_pipeline_split=True,
                         recompute_granularity="selective", recompute_modules="mlp layernorm",
                         micro_batch_size=1, exhaustive=True, workers=0)
    assert set(frame["status"]) == {"ok"}
    assert set(frame["pipeline_model_parallel_size"]) == {1, 2}
    split = frame[frame["pipeline_model_parallel_size"] == 2]
    assert set(split["layout.stage_layers_stage0"]) == set(split["layout.stage_layers_stage1"]) \
        == {2}
    assert set(frame["layout.recompute_modules"]) == {"mlp layernorm"}
    assert set(frame["architecture"]) == {"GQA 4/2 d = 8, SwiGLU f = 256, RMSNorm, RoPE base "
                                          "10000, untied, no bias, flash"}


def test_report_layout_names_recompute_modules_and_uneven_split():
    """405B's report line says which modules selective recompute rebuilds and how many layers
    each stage holds (Megatron's split, worked in test_pipeline_layer_counts_follow_megatron);
    K22's layouts carry neither (their reports stay as they were)."""
    from simsp.metrics.layout import layout
    from simsp.report.run.summary_md import _header
    root = Path(__file__).resolve().parents[1] / "scenarios"
    lay = layout(load_scenario(root / "llama3.1-405b.toml"))
    assert lay["stage_layers"] == [15] + [16] * 6 + [15] and lay["recompute_modules"] == "mlp"
    line = _header({"scenario": "405b", "mode": "meta", "layout": lay})[2]
    assert "recompute selective (mlp), schedule interleaved (layers per stage 15 + 16 x 6 + 15)," \
        in line
    gpt = layout(load_scenario(root / "paper-175b.toml"))
    assert "stage_layers" not in gpt and "recompute_modules" not in gpt


def _cli(capsys, argv):
    from simsp.cli import main
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_llama_flags(capsys):
    """Megatron's flag spellings reach the layer (one `simsp layer --json`), and bad
    combinations are one `error:` line naming the field, exit 2."""
    import json
    rc, out, _ = _cli(capsys, [
        "layer", "--json", "--mode", "meta", "--group-query-attention", "--num-query-groups", "2",
        "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
        "--use-flash-attn", "--disable-bias-linear", "--recompute-granularity", "selective",
        "--recompute-modules", "mlp", "layernorm"])
    report = json.loads(out)
    assert rc == 0 and report["formula_bytes"] == report["activation_bytes_per_rank"][0]
    assert report["recompute_modules"] == "mlp layernorm"
    assert report["architecture"] == ("GQA 4/2, SwiGLU f = 256, RMSNorm, RoPE base 10000, "
                                      "tied, no bias, flash")
    for argv, field in ((["--num-query-groups", "3", "--group-query-attention"],
                         "num_query_groups"),
                        (["--num-query-groups", "2"], "group_query_attention"),
                        (["--group-query-attention", "--num-query-groups", "1",
                          "--tensor-model-parallel-size", "2"], "tensor_model_parallel_size"),
                        (["--use-flash-attn", "--attention-backend", "unfused"],
                         "--use-flash-attn"),
                        (["--recompute-granularity", "selective", "--recompute-modules", "moe"],
                         "recompute_modules"),
                        (["--normalization", "rmsnorm"], "--normalization"),
                        (["--position-embedding-type", "rope", "--rotary-percent", "0.01"],
                         "rotary_percent")):
        rc, out, err = _cli(capsys, ["layer", "--mode", "meta", *argv])
        assert rc == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1
        assert field in err, (argv, err)


def test_bundled_stage0_activation_peak_equals_formula():
    """Llama 3 70B (interleaved, equal chunks) and 3.1 405B (interleaved, accounted
    embedding/loss: chunks of 1 and 2 layers; mlp recompute): the ledger's stage-0 activation
    peak of a whole meta iteration equals analytic.first_stage_activation_bytes to the byte."""
    from simsp.training.driver.iteration import Shortcuts, simulate_iteration
    root = Path(__file__).resolve().parents[1] / "scenarios"
    for name in ("llama3-70b", "llama3.1-405b"):
        sc = load_scenario(root / f"{name}.toml")
        run = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none")
        stage0 = run.inputs.world.ranks[run.inputs.rank_of(0, 0, 0)]
        measured = stage0.ledger.peak_by_category["activations"]
        assert measured == analytic.first_stage_activation_bytes(sc), name
