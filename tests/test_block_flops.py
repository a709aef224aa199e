"""Every block's counted GEMM FLOPs, forward, backward and recompute, against a hand count from
its shapes (2·m·k·n per GEMM; a backward GEMM layer does dgrad and wgrad, each as large as its
forward). Counted by `simsp layer`'s simulate_layer (one rank: t = 1) and, for multi-token
prediction and the closed forms the reports print, by `simsp run --json`. A block whose
forward or backward count is off moves its layer's total: each test sums the blocks by hand.
"""

import json

import pytest

from simsp.scenario.loading import load_scenario
from simsp.training.driver.layer_sim import simulate_layer
from inprocess import cli

S, B, H, A, F, V = 256, 2, 64, 4, 96, 128  # s = 256: two 128-row flash tiles
T = S * B  # tokens
D = H // A  # head dim


def gemm(m: int, k: int, n: int) -> int:
    """FLOPs of an (m, k) × (k, n) product."""
    return 2 * m * k * n


def linear(m: int, k: int, n: int) -> dict:
    """A weight GEMM: forward y = x W; backward dx = dy Wᵀ and dW = xᵀ dy."""
    return {"forward": gemm(m, k, n), "backward": 2 * gemm(m, k, n), "recompute": 0}


def blocks(*parts: dict) -> dict:
    """The layer's counts: the blocks' sums per phase."""
    return {phase: sum(p[phase] for p in parts) for phase in ("forward", "backward", "recompute")}


def unfused_core(heads: int, d_qk: int, d_v: int) -> dict:
    """QKᵀ (s×d_qk by d_qk×s) and P·V (s×s by s×d_v) per (sample, head); backward dP = dO Vᵀ,
    dV = Pᵀ dO, dQ = dS K, dK = dSᵀ Q. The unfused core computes the whole s × s square."""
    forward = B * heads * (gemm(S, d_qk, S) + gemm(S, S, d_v))
    backward = B * heads * (gemm(S, d_v, S) + gemm(S, S, d_v) + gemm(S, S, d_qk)
                            + gemm(S, S, d_qk))
    return {"forward": forward, "backward": backward, "recompute": 0}


# causal FlashAttention on s = 256 in 128 × 128 tiles: query tile 0 runs key tile 0, query
# tile 1 runs key tiles 0 and 1 (tile (0, 1) lies above the diagonal): 3 of the 4 tiles
FLASH_AREA = 3 * 128 * 128


def flash_core(heads: int, d_qk: int, d_v: int) -> dict:
    """The same GEMMs on the causal tiles only; backward recomputes QKᵀ (counted as
    recompute: hardware FLOPs)."""
    per_width = 2 * B * heads * FLASH_AREA  # FLOPs per unit of contracted/produced width
    return {"forward": per_width * (d_qk + d_v), "backward": per_width * (2 * d_v + 2 * d_qk),
            "recompute": per_width * d_qk}


def mlp(tokens: int, f: int, swiglu: bool) -> dict:
    """fc1 (h -> f, or 2f for SwiGLU's gate and up) and fc2 (f -> h)."""
    return blocks(linear(tokens, H, 2 * f if swiglu else f), linear(tokens, f, H))


def layer_flops(**fields) -> dict:
    """One layer's counted FLOPs on one rank (meta mode) for the model fields given."""
    overrides = {("model", "seq_length"): S, ("model", "hidden_size"): H,
                 ("model", "num_attention_heads"): A, ("model", "ffn_hidden_size"): F,
                 ("model", "vocab_size"): V, ("parallel", "micro_batch_size"): B,
                 ("run", "mode"): "meta"}
    overrides.update({("model", k): v for k, v in fields.items()})
    return simulate_layer(load_scenario(None, overrides)).ranks[0].flops


LLAMA = dict(swiglu=True, normalization="RMSNorm", position_embedding_type="rope",
             add_bias_linear=False)


def test_gpt_layer():
    """Fused QKV (h -> 3h), unfused core, projection, GeLU MLP (K22 App. A's 24bsh² + 4bs²h
    with f = 4h)."""
    expected = blocks(linear(T, H, 3 * H), unfused_core(A, D, D), linear(T, H, H),
                      mlp(T, F, swiglu=False))
    assert layer_flops() == expected


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_gqa_layer_unfused(groups):
    """QKV h -> (a + 2G)·d: a query heads, G key and G value heads; SwiGLU fc1 h -> 2f."""
    expected = blocks(linear(T, H, (A + 2 * groups) * D), unfused_core(A, D, D),
                      linear(T, A * D, H), mlp(T, F, swiglu=True))
    assert layer_flops(**LLAMA, group_query_attention=True, num_query_groups=groups) == expected


def test_gqa_layer_flash():
    expected = blocks(linear(T, H, (A + 2 * 2) * D), flash_core(A, D, D), linear(T, A * D, H),
                      mlp(T, F, swiglu=True))
    assert layer_flops(**LLAMA, group_query_attention=True, num_query_groups=2,
                       attention_backend="flash") == expected


MLA = dict(**LLAMA, multi_latent_attention=True, kv_lora_rank=32, qk_head_dim=16,
           qk_pos_emb_head_dim=8, v_head_dim=12)
RQ, RKV, DN, DR, DV = 48, 32, 16, 8, 12


@pytest.mark.parametrize("backend", ["unfused", "flash"])
def test_mla_layer_with_query_latent(backend):
    """q down h -> r_q, q up r_q -> a(d_n + d_r), kv down h -> r_kv + d_r, kv up
    r_kv -> a(d_n + d_v), core on width d_n + d_r (QKᵀ) and d_v (P·V), projection a·d_v -> h."""
    core = (flash_core if backend == "flash" else unfused_core)(A, DN + DR, DV)
    expected = blocks(linear(T, H, RQ), linear(T, RQ, A * (DN + DR)), linear(T, H, RKV + DR),
                      linear(T, RKV, A * (DN + DV)), core, linear(T, A * DV, H),
                      mlp(T, F, swiglu=True))
    assert layer_flops(**MLA, q_lora_rank=RQ, attention_backend=backend) == expected


def test_mla_layer_without_query_latent():
    """Without --q-lora-rank one query projection h -> a(d_n + d_r)."""
    expected = blocks(linear(T, H, A * (DN + DR)), linear(T, H, RKV + DR),
                      linear(T, RKV, A * (DN + DV)), unfused_core(A, DN + DR, DV),
                      linear(T, A * DV, H), mlp(T, F, swiglu=True))
    assert layer_flops(**MLA) == expected


E, TOPK, F_MOE, F_SHARED = 8, 2, 40, 24


def router() -> dict:
    """Logits x W_r (h -> E); backward d x and d W_r."""
    return linear(T, H, E)


def experts(rows: int, swiglu: bool) -> dict:
    """The routed experts' fc1 and fc2 on the rows they compute (all experts together)."""
    return mlp(rows, F_MOE, swiglu)


def moe_layer_flops(**fields) -> dict:
    return layer_flops(num_experts=E, moe_router_topk=TOPK, moe_ffn_hidden_size=F_MOE,
                       add_bias_linear=False, **fields)


def mha_attention(core=None) -> list:
    return [linear(T, H, 3 * H), core or unfused_core(A, D, D), linear(T, H, H)]


@pytest.mark.parametrize("swiglu", [False, True])
def test_moe_layer_dropless(swiglu):
    """Balanced routing, no capacity: every token's k experts compute it, T·k rows."""
    expected = blocks(*mha_attention(), router(), experts(T * TOPK, swiglu))
    assert moe_layer_flops(swiglu=swiglu) == expected


def test_moe_layer_padded_to_capacity():
    """Capacity C = ceil(T·k/E · 0.5) = ceil(512·2/8 · 0.5) = 64 rows per expert, padded."""
    expected = blocks(*mha_attention(), router(), experts(E * 64, False))
    assert moe_layer_flops(moe_expert_capacity_factor=0.5,
                           moe_pad_expert_input_to_capacity=True) == expected


@pytest.mark.parametrize("swiglu", [False, True])
def test_moe_layer_with_shared_experts(swiglu):
    """The shared experts: a dense MLP of width f_s on every token."""
    expected = blocks(*mha_attention(), router(), experts(T * TOPK, swiglu),
                      mlp(T, F_SHARED, swiglu))
    assert moe_layer_flops(swiglu=swiglu,
                           moe_shared_expert_intermediate_size=F_SHARED) == expected


def run_json(*flags) -> dict:
    """`simsp run --json` of a one-rank meta run with these flags."""
    rc, out, err = cli(["run", "--json", "--mode", "meta", "--num-layers", "2",
                        "--hidden-size", str(H), "--num-attention-heads", str(A),
                        "--ffn-hidden-size", str(F), "--seq-length", str(S),
                        "--vocab-size", str(V), "--micro-batch-size", str(B),
                        "--global-batch-size", str(B), *flags])
    assert rc == 0, err
    return json.loads(out)


def test_whole_run_with_multi_token_prediction():
    """Two layers, the logits (h -> v), and one MTP depth: its projection of [embedding |
    hidden] (2h -> h), its layer and its own logits, each forward once and backward twice."""
    layer = blocks(*mha_attention(), mlp(T, F, swiglu=False))
    logits = linear(T, H, V)
    depth = blocks(linear(T, 2 * H, H), layer, logits)
    expected = blocks(layer, layer, logits, depth)
    metrics = run_json("--position-embedding-type", "rope", "--mtp-num-layers", "1")
    assert metrics["counted_model_flops"] == expected["forward"] + expected["backward"]
    assert metrics["counted_hardware_flops"] == metrics["counted_model_flops"]


MLA_MOE_MTP = ["--multi-latent-attention", "--q-lora-rank", str(RQ), "--kv-lora-rank", str(RKV),
               "--qk-head-dim", str(DN), "--qk-pos-emb-head-dim", str(DR), "--v-head-dim",
               str(DV), "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type",
               "rope", "--disable-bias-linear", "--num-experts", str(E), "--moe-router-topk",
               str(TOPK), "--moe-ffn-hidden-size", str(F_MOE),
               "--moe-shared-expert-intermediate-size", str(F_SHARED), "--moe-layer-freq",
               "[0,1]", "--mtp-num-layers", "1"]


def megatron_per_token() -> dict:
    """The weights one token meets, by block, for the model of MLA_MOE_MTP: layer 0 dense,
    layer 1 MoE, the MTP depth built as the last (MoE) layer. Megatron's count (training.py
    num_floating_point_operations) adds 1 per LoRA rank row (the latents' norms) and 3h per
    MTP depth (its norms) to the GEMM weights; the router and the other norms are not counted."""
    mla = (H * RQ + RQ * A * (DN + DR) + RQ  # q down, q up, + r_q
           + H * (RKV + DR) + RKV * A * (DN + DV) + RKV  # kv down (latent + RoPE key), kv up, + r_kv
           + A * DV * H)  # projection
    dense_mlp, routed, shared = 3 * H * F, TOPK * 3 * H * F_MOE, 3 * H * F_SHARED  # SwiGLU: 3hf
    mtp_own = 2 * H * H + 3 * H  # eh_proj (2h -> h) and Megatron's 3h
    return {"attention": 3 * mla, "mlp": dense_mlp + 2 * (routed + shared),
            "logits": 2 * H * V, "mtp": mtp_own}


def test_reported_model_and_hardware_flops_of_mla_moe_mtp():
    """model_flops = 6 × tokens × the weights a token meets + the causal core: QKᵀ on
    d_n + d_r and P·V on d_v per head, halved by the mask, 3 layers (2 + the MTP depth).
    FlashAttention's backward recomputes QKᵀ (the whole s × s, 2·B·s²·a·(d_n + d_r) per
    layer, the MTP depth's layer too): hardware_flops adds that."""
    per_token = sum(megatron_per_token().values())
    core = B * S * S * 6 * (A * (DN + DR) / 2 + A * DV / 2)  # per layer
    model = 6 * T * per_token + 3 * core
    metrics = run_json(*MLA_MOE_MTP, "--attention-backend", "flash")
    assert metrics["model_flops"] == pytest.approx(model, rel=1e-12)
    recompute = 2 * B * S * S * A * (DN + DR) * 3
    assert metrics["hardware_flops"] == pytest.approx(model + recompute, rel=1e-12)


def test_reported_hardware_flops_of_selective_recompute_with_mtp():
    """A dense MLA model with one MTP depth, --recompute-modules core_attn mlp: the core's
    forward again (QKᵀ and P·V, the whole s × s) and the MLPs' forward again (SwiGLU: fc1 2f
    wide, fc2), in the 2 layers and the depth's layer."""
    dense = MLA_MOE_MTP[:MLA_MOE_MTP.index("--num-experts")] + ["--mtp-num-layers", "1"]
    metrics = run_json(*dense, "--recompute-granularity", "selective", "--recompute-modules",
                       "core_attn", "mlp")
    core_again = B * A * (gemm(S, DN + DR, S) + gemm(S, S, DV)) * 3
    mlp_again = (gemm(T, H, 2 * F) + gemm(T, F, H)) * 3
    assert metrics["hardware_flops"] - metrics["model_flops"] == pytest.approx(
        core_again + mlp_again, rel=1e-12)
    assert metrics["counted_hardware_flops"] - metrics["counted_model_flops"] == \
        core_again + mlp_again  # the simulation re-runs the same GEMMs
