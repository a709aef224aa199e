"""The simulated model's FLOPs (a scenario's config.Model) as Megatron-LM counts them
(megatron/training/training.py num_floating_point_operations, transformer_flops, BSHD), summed
from its blocks' counts: each attention block's projections and causal core (`flop_terms`),
each MLP block's GEMMs (`token_flops`: the dense MLP's, a MoE layer's top-k routed and shared
experts), the logits (blocks/head.py); the router, norms and embedding lookup are not counted.
Multi-token prediction's D depths count as D more layers of the last layer's kind, plus
6·D·(3h + 2h²) (their norms and projection) and D more logits (docs/mtp.md).
"""

from simsp.model.blocks import head
from simsp.model.blocks.mlp import dense as dense_mlp
from simsp.model.blocks.variants import attention_block


def _layer_kinds(m) -> tuple[int, int]:
    """(dense MLP layers, MoE layers) of model m (--moe-layer-freq), the multi-token
    prediction depths' layers included (each built as the last layer)."""
    moe = sum(m.is_moe_layer(i) for i in range(m.num_layers))
    dense = m.num_layers - moe
    depths = getattr(m, "mtp_num_layers", None) or 0
    if m.is_moe_layer(m.num_layers - 1):
        return dense, moe + depths
    return dense + depths, moe


def _mlp_token_flops(m, dense: int, moe: int) -> int:
    """Every layer's MLP GEMMs per token, forward and backward: dense layers' and MoE layers'."""
    flops = dense_mlp.token_flops(m) * dense
    if moe:
        from simsp.model.blocks.moe.layer import token_flops as moe_token_flops  # MoE only
        flops += moe_token_flops(m) * moe
    return flops


def megatron_flops(m, global_batch: int, padded_vocab: int) -> float:
    """Model FLOPs of one iteration of `global_batch` sequences, Megatron-LM's
    num_floating_point_operations: 6·h·(f·F·dense + (f_moe·k + f_shared)·F·MoE layers) +
    attention + 6·h·v per token, F = 3 with SwiGLU else 2, plus B·s²·core."""
    s, h = m.seq_length, m.hidden_size
    depths = getattr(m, "mtp_num_layers", None) or 0
    dense, moe = _layer_kinds(m)
    layers = m.num_layers + depths
    projections, core = attention_block(m).flop_terms(m)
    per_token = (_mlp_token_flops(m, dense, moe) + projections * layers
                 + 6 * depths * (3 * h + 2 * h * h)
                 + head.token_flops(m, padded_vocab) * (1 + depths))
    return global_batch * s * per_token + global_batch * s * s * core * layers


def recomputed_flops(m, global_batch: int, modules: frozenset, recomputed_layers: int) -> float:
    """FLOPs computed again beyond the model's (hardware FLOPs = model + these): FlashAttention's
    backward recomputes QKᵀ (2Bs²·a·(d_n + d_r) per layer); selective core_attn re-runs the
    core's forward (QKᵀ and ·V); selective mlp re-runs the dense MLPs; full recompute re-runs the
    forward of `recomputed_layers` layers, each at the model's per-layer average (exact when
    every layer is recomputed, Megatron's uniform method). The MTP depths' layers count as
    layers throughout (they run the same attention, MLP and recompute)."""
    B, s, a, L = global_batch, m.seq_length, m.num_attention_heads, m.num_layers
    depths = getattr(m, "mtp_num_layers", None) or 0
    qk, v_width = attention_block(m).core_widths(m)
    extra = 2 * B * s * s * a * qk * (L + depths) if m.flash else 0
    if "core_attn" in modules:
        extra += 2 * B * s * s * a * (qk + v_width) * (L + depths)
    if "mlp" in modules:
        dense, _ = _layer_kinds(m)
        extra += dense_mlp.forward_token_flops(m) * B * s * dense
    if recomputed_layers and depths:  # full recompute of every layer: the MTP layers' too
        h = m.hidden_size
        forward = (megatron_flops(m, B, 0) - 6 * B * s * depths * (3 * h + 2 * h * h)) / 3
        again = recomputed_layers + (depths if recomputed_layers == L else 0)
        extra += forward * again / (L + depths)
    elif recomputed_layers:
        layers_forward = (megatron_flops(m, B, 0) / 3) * recomputed_layers / L
        extra += layers_forward
    return extra
