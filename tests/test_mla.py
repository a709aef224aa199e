"""Multi-head latent attention (simsp/model/blocks/attention/mla.py; docs/mla.md): the
math against central finite differences, every layout against the single-device reference,
the kept bytes against docs/mla.md's closed form, the GEMM FLOPs against a hand count, and
`simsp verify` on scenarios/mla-tiny.toml."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from simsp import analytic
from simsp.commands.verify import verify_report
from simsp.scenario.loading import load_scenario
from simsp.model.blocks.attention.rope import rope_angles
from simsp.model.blocks.attention import mla
from simsp.model.flops import megatron_flops
from simsp.model.params import param_shapes
from simsp.training.driver.layer_sim import simulate_layer

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
TINY = SCENARIOS / "mla-tiny.toml"
SMALL = {("model", "hidden_size"): 32, ("model", "num_attention_heads"): 4,
         ("model", "q_lora_rank"): 12, ("model", "kv_lora_rank"): 8, ("model", "qk_head_dim"): 6,
         ("model", "qk_pos_emb_head_dim"): 4, ("model", "v_head_dim"): 5}


@pytest.mark.parametrize("latent_q", [True, False])
def test_mla_kernels_match_finite_differences(latent_q):
    """mla_forward's q, k, v against mla_backward on a random linear functional, float64; with
    a query latent, and with Megatron's plain query projection (--q-lora-rank unset)."""
    m = SimpleNamespace(num_attention_heads=3, qk_head_dim=4, qk_pos_emb_head_dim=6,
                        v_head_dim=5, kv_lora_rank=7, norm_epsilon=1e-5)
    rng = np.random.default_rng(0)
    s, B, h, rq = 5, 2, 8, 9
    P = ({"attn.q_down.weight": rng.normal(size=(h, rq)),
          "attn.q_norm.gamma": 1 + 0.1 * rng.normal(size=rq),
          "attn.q_up.weight": rng.normal(size=(rq, 3 * 10))} if latent_q else
         {"attn.q_proj.weight": rng.normal(size=(h, 3 * 10))})
    P |= {"attn.kv_down.weight": rng.normal(size=(h, 7 + 6)),
         "attn.kv_norm.gamma": 1 + 0.1 * rng.normal(size=7),
         "attn.kv_up.weight": rng.normal(size=(7, 3 * 9))}
    cos, sin = rope_angles(s, 6, 10000)
    y = rng.normal(size=(s, B, h))
    R = [rng.normal(size=(B, 3, s, w)) for w in (10, 10, 5)]  # weights of q, k, v

    def loss(params, x):
        return sum(float((t * r).sum()) for t, r in
                   zip(mla.mla_forward(x, params, m, cos, sin)[:3], R))

    cache = mla.mla_forward(y, P, m, cos, sin)[3]
    dy, grads = mla.mla_backward(*R, cache, P, m, cos, sin)
    grads["y"] = dy
    for name, grad in grads.items():
        base = y if name == "y" else P[name]
        u, eps = rng.normal(size=base.shape), 1e-6

        def at(value):
            return loss(P, value) if name == "y" else loss({**P, name: value}, y)
        numeric = (at(base + eps * u) - at(base - eps * u)) / (2 * eps)
        assert numeric == pytest.approx(float((grad * u).sum()), rel=1e-8), name


def test_rope_deinterleave_is_a_permutation():
    x = np.arange(12.0).reshape(1, 1, 1, 12)
    assert mla.deinterleave(x)[0, 0, 0].tolist() == [0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11]
    assert np.array_equal(mla.reinterleave(mla.deinterleave(x)), x)


LAYOUTS = {
    "t2_sp": {},
    "t2_no_sp": {("parallel", "sequence_parallel"): False},  # k_pe's gradient all-reduced
    "t1": {("parallel", "tensor_model_parallel_size"): 1,
           ("parallel", "sequence_parallel"): False},
    "flash_dropout": {("model", "attention_backend"): "flash"},
    "selective_all": {("parallel", "recompute_granularity"): "selective",
                      ("parallel", "recompute_modules"): "core_attn layernorm mlp"},
    "selective_flash": {("model", "attention_backend"): "flash",
                        ("parallel", "recompute_granularity"): "selective",
                        ("parallel", "recompute_modules"): "core_attn layernorm"},
    "full": {("parallel", "recompute_granularity"): "full"},
}
NO_Q_LATENT = {("model", "q_lora_rank"): None}  # Megatron's linear_q_proj
LAYOUTS |= {f"{name}_no_q_latent": {**LAYOUTS[name], **NO_Q_LATENT}
            for name in ("t2_sp", "t2_no_sp", "selective_all", "full")}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_layer_matches_reference(name):
    """One layer on the ranks of a TP group: output, input and weight gradients vs one device."""
    sc = load_scenario(TINY, {**SMALL, **LAYOUTS[name]})
    assert simulate_layer(sc).max_rel_err < 1e-12


@pytest.mark.parametrize("name", ["t2_sp", "t2_no_sp", "flash_dropout", "selective_flash",
                                  "t2_sp_no_q_latent"])
def test_kept_bytes_match_formula(name):
    """The ledger's kept activations of one layer (meta) equal docs/mla.md's closed form."""
    sc = load_scenario(TINY, {**LAYOUTS[name], ("run", "mode"): "meta",
                              ("parallel", "micro_batch_size"): 2})
    p = sc.parallel
    formula = analytic.llama_layer_activation_bytes(
        sc.model, p.micro_batch_size, p.tp, p.sequence_parallel, p.recompute_granularity,
        p.recompute_module_set or frozenset(("core_attn",)))
    assert simulate_layer(sc).records[0].activation_bytes == formula


@pytest.mark.parametrize("latent_q", [True, False])
def test_forward_gemm_flops_hand_count(latent_q):
    """Forward GEMM FLOPs one TP rank counts for one layer, worked by hand: q down, kv down
    (replicated: all of the rank's tokens), q up (or without a query latent one column-parallel
    q projection from h), kv up, QKᵀ, ·V, output projection (a/t heads), SwiGLU MLP."""
    sc = load_scenario(TINY, {("run", "mode"): "meta", **({} if latent_q else NO_Q_LATENT)})
    m, t = sc.model, sc.parallel.tp
    s, b, h, a = m.seq_length, sc.parallel.micro_batch_size, m.hidden_size, m.num_attention_heads
    T, local = s * b, a // t
    tokens_down = T // t  # SP: the down projections see the rank's s/t tokens
    dn, dr, dv, rkv = m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim, m.kv_lora_rank
    query = (2 * tokens_down * h * 64 + 2 * T * 64 * local * (dn + dr) if latent_q
             else 2 * T * h * local * (dn + dr))  # r_q = 64 in mla-tiny
    expected = (query + 2 * tokens_down * h * (rkv + dr) + 2 * T * rkv * local * (dn + dv)
                + 2 * b * local * s * s * (dn + dr + dv) + 2 * T * local * dv * h
                + 2 * T * h * 3 * m.ffn // t)
    assert simulate_layer(sc).ranks[0].flops["forward"] == expected


def test_mla_tiny_verifies():
    """MLA with t = 2 and SP, p = 2, d = 2, dropout: every gradient against central finite
    differences (1e-5) and the single-device reference (1e-10)."""
    report = verify_report(load_scenario(TINY))
    assert report["passed"], (report["max_rel_err"], report["max_rel_err_vs_reference"])
    assert report["max_rel_err_vs_reference"] < 1e-13
    assert "layers.1.attn.kv_up.weight" in report["checked"]


def test_mla_without_a_query_latent_verifies():
    """--q-lora-rank unset (Megatron's linear_q_proj), t = 2 with SP, p = 2: every gradient,
    the query projection's included, against finite differences and the reference."""
    sc = load_scenario(TINY, {**SMALL, **NO_Q_LATENT, ("parallel", "data_parallel_size"): 1,
                              ("parallel", "global_batch_size"): 2})
    report = verify_report(sc)
    assert report["passed"], (report["max_rel_err"], report["max_rel_err_vs_reference"])
    assert report["max_rel_err_vs_reference"] < 1e-13
    assert "layers.1.attn.q_proj.weight" in report["checked"]
    assert not any("q_down" in name for name in report["checked"])


def test_parameters_and_flops_without_a_query_latent():
    """The simulated shapes' count and Megatron's FLOPs (training.py: q_term = h·a·(d_n + d_r)
    without a query latent) against the closed forms of docs/mla.md."""
    sc = load_scenario(TINY, {**SMALL, **NO_Q_LATENT, ("run", "mode"): "meta"})
    m = sc.model
    h, a, L, v = m.hidden_size, m.num_attention_heads, m.num_layers, sc.padded_model.vocab_size
    dn, dr, dv, rkv = m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim, m.kv_lora_rank
    attention = h * a * (dn + dr) + h * (rkv + dr) + rkv + rkv * a * (dn + dv) + a * dv * h
    per_layer = attention + 3 * h * m.ffn + 2 * h
    assert sum(np.prod(shape) for shape in param_shapes(sc.padded_model).values()) == \
        L * per_layer + 2 * v * h + h
    projections = h * a * (dn + dr) + rkv * (h + a * (dn + dv) + 1) + h * dr + a * dv * h
    s, B = m.seq_length, sc.parallel.global_batch
    expected = 6 * B * s * (L * (projections + 3 * h * m.ffn) + h * v) \
        + 6 * B * s * s * L * (a * (dn + dr) / 2 + a * dv / 2)
    assert megatron_flops(m, B, v) == pytest.approx(expected, rel=1e-12)


def test_deepseek_like_tiny_verifies():
    """MLA with MoE layers after a dense first one (--moe-layer-freq pattern), top-2 sigmoid
    routing with the aux loss, t = 1, p = 2: finite differences and the reference."""
    sc = load_scenario(TINY, {**SMALL, ("model", "num_layers"): 3, ("model", "num_experts"): 4,
                              ("model", "moe_router_topk"): 2,
                              ("model", "moe_ffn_hidden_size"): 24,
                              ("model", "moe_layer_freq"): "([0]*1+[1]*2)",
                              ("model", "moe_router_score_function"): "sigmoid",
                              ("model", "moe_aux_loss_coeff"): 0.01,
                              ("parallel", "tensor_model_parallel_size"): 1,
                              ("parallel", "sequence_parallel"): False,
                              ("parallel", "data_parallel_size"): 1,
                              ("parallel", "global_batch_size"): 2,
                              ("parallel", "decoder_first_pipeline_num_layers"): 1})
    report = verify_report(sc)
    assert report["passed"], (report["max_rel_err"], report["max_rel_err_vs_reference"])
    assert "layers.2.mlp.router.weight" in report["checked"]
    assert "layers.0.mlp.fc1.weight" in report["checked"]
