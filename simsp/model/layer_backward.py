"""Backward pass of one transformer layer on one TP rank, freeing saved tensors as it uses them.

Overlap as Megatron-LM's column-parallel backward does it (K22 §4.2.2, §5): under SP the
LN output is all-gathered again while the input-gradient GEMM runs, and the input gradient's
all-reduce (TP) or reduce-scatter (SP) runs while the weight-gradient GEMM runs.
"""

from simsp.model import mappings, ops
from simsp.model.layer import (LayerSpec, act_input_name, attention_core, attention_keep,
                               cp_attention_keep, fc1_views, kv_names, layer_forward,
                               merge_qkv_grads, mlp_inner, norm, rope_angles)
import math


def column_parallel_backward(r, dy, saved_input, w: dict, g: dict, prefix: str,
                             has_bias: bool = True):
    """dy (s, b, n/t) of y = x W + b with x kept as `saved_input` -> dx (s_l, b, k)."""
    weight = w[f"{prefix}.weight"]
    gather = None
    if r.tp.sequence_parallel:
        gather = mappings.start(r, mappings.all_gather_seq(
            r, saved_input, f"{prefix}_regather", label="all_gather_ln_output", blocking=False))
    dx_full = yield from ops.linear_grad_input(r, dy, weight, f"d_{prefix}_input")  # (s, b, k)
    x_full = (yield from mappings.finish(r, gather)) if gather else saved_input  # (s, b, k)
    reduce = mappings.start(r, mappings.enter_backward(r, dx_full, f"{prefix}_enter_grad",
                                                       blocking=False))
    yield from ops.linear_grad_weight(r, dy, x_full, g, f"{prefix}.weight",
                                      f"{prefix}.bias" if has_bias else None,
                                      f"d_{prefix}_weight")
    dx = yield from mappings.finish(r, reduce)  # (s_l, b, k)
    if x_full is not saved_input:
        r.free(x_full)
    if dx is not dx_full:
        r.free(dx_full)
    r.free(saved_input, dy)
    return dx


def row_parallel_backward(r, spec, dout, mask, saved_input, w: dict, g: dict, prefix: str,
                          keep_input: bool = False):
    """Through hidden dropout, bias, f̄/ḡ and x W: dout (s_l, b, h) -> dx (s, b, k/t).
    `keep_input`: the saved input outlives this (FlashAttention's output is the proj input)."""
    dropped = yield from ops.dropout_backward(r, dout, mask, spec.model.hidden_dropout,
                                              f"d_{prefix}_dropout")
    r.free(mask)
    if f"{prefix}.bias" in g:
        yield from ops.bias_grad(r, dropped, g, f"{prefix}.bias", f"d_{prefix}_bias")
    dfull = yield from mappings.exit_backward(r, dropped, f"{prefix}_exit_grad")  # (s, b, h)
    if dfull is not dropped and dropped is not dout:
        r.free(dropped)
    dx = yield from ops.linear_grad_input(r, dfull, w[f"{prefix}.weight"], f"d_{prefix}_input")
    yield from ops.linear_grad_weight(r, dfull, saved_input, g, f"{prefix}.weight", None,
                                      f"d_{prefix}_weight")
    if not keep_input:
        r.free(saved_input)
    if dfull is not dout:
        r.free(dfull)
    return dx


def norm_backward(r, m, dy, x, w: dict, g: dict, prefix: str, name: str):
    """dx of LayerNorm or RMSNorm at the kept input x; the weight gradients accumulate in g."""
    if m.normalization == "RMSNorm":
        return (yield from ops.rmsnorm_backward(r, dy, x, w[f"{prefix}.gamma"], m.norm_epsilon,
                                                g, prefix, name))
    return (yield from ops.layernorm_backward(r, dy, x, w[f"{prefix}.gamma"], m.norm_epsilon,
                                              g, prefix, name))


def mlp_backward(r, spec, w, g, saved, dout):
    """MLP block backward; dout (s_l, b, h) -> gradient at the block input (s_l, b, h)."""
    m = spec.model
    if "fc1_input" not in saved:  # layernorm recomputed
        saved["fc1_input"] = yield from recompute_norm(r, m, w, saved["ln2_input"], "ln2",
                                                        "fc1_input")
    if "fc2_input" not in saved:  # mlp recomputed
        yield from _recompute_mlp(r, spec, w, saved)
    dg = yield from row_parallel_backward(r, spec, dout, saved.pop("mlp_dropout_mask", None),
                                          saved.pop("fc2_input"), w, g, "mlp.fc2")
    if m.swiglu:
        dh = yield from ops.swiglu_backward(r, dg, saved["swiglu_input"], "d_swiglu_input")
        r.free(dg, saved.pop("swiglu_input"))
    else:
        dh = yield from ops.gelu_backward(r, dg, saved["gelu_input"], "d_gelu_input")
        r.free(dg, saved.pop("gelu_input"))
    dy2 = yield from column_parallel_backward(r, dh, saved.pop("fc1_input"), fc1_views(m, w),
                                              fc1_views(m, g), "mlp.fc1", "mlp.fc1.bias" in g)
    dln = yield from norm_backward(r, m, dy2, saved["ln2_input"], w, g, "ln2", "d_ln2_input")
    r.free(dy2, saved.pop("ln2_input"))
    dres = yield from ops.add(r, dout, dln, "d_residual")
    r.free(dout, dln)
    return dres


def core_backward(r, spec, q, k, v, probs, mask, dropped, dctx):
    """Backward of softmax(QKᵀ/√d) -> dropout -> ·V. All (b, a/t, s, ·); returns dq, dk, dv."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    ddropped = yield from ops.batched_matmul(r, dctx, v, "d_attention_dropout_output",
                                             transpose_b=True)  # (b, a/t, s, s)
    dv = yield from ops.batched_matmul(r, dropped, dctx, "d_v", transpose_a=True)
    r.free(dctx, v, None if dropped is probs else dropped)
    dprobs = yield from ops.dropout_backward(r, ddropped, mask, spec.model.attention_dropout,
                                             "d_softmax_output")
    if dprobs is not ddropped:
        r.free(ddropped)
    r.free(mask)
    dscores = yield from ops.softmax_backward(r, dprobs, probs, "d_attention_scores")
    r.free(dprobs, probs)
    dq = yield from ops.batched_matmul(r, dscores, k, "d_q", scale=scale)
    dk = yield from ops.batched_matmul(r, dscores, q, "d_k", transpose_a=True, scale=scale)
    r.free(dscores, q, k)
    return dq, dk, dv


def attention_backward(r, spec, w, g, saved, dres):
    """Attention block backward; dres (s_l, b, h) -> gradient at the layer input (s_l, b, h)."""
    m = spec.model
    flash = m.flash
    proj_in = saved.pop("proj_input")
    dproj = yield from row_parallel_backward(r, spec, dres, saved.pop("attn_dropout_mask", None),
                                             proj_in, w, g, "attn.proj", keep_input=flash)
    if m.multi_latent_attention:  # simsp/model/blocks/attention/mla.py (import cycle: imported here)
        from simsp.model.blocks.attention.mla import mla_attention_backward
        dy1 = yield from mla_attention_backward(r, spec, w, g, saved, dproj, proj_in)
    else:
        if m.llama_layer:
            dqkv = yield from _llama_core_backward(r, spec, saved, dproj, proj_in)
        else:
            dqkv = yield from _gpt_core_backward(r, spec, saved, dproj)
        if "qkv_input" not in saved:  # layernorm recomputed
            saved["qkv_input"] = yield from recompute_norm(r, m, w, saved["ln1_input"], "ln1",
                                                           "qkv_input")
        dy1 = yield from column_parallel_backward(r, dqkv, saved.pop("qkv_input"), w, g,
                                                  "attn.qkv", "attn.qkv.bias" in g)
    dln = yield from norm_backward(r, m, dy1, saved["ln1_input"], w, g, "ln1", "d_ln1_input")
    r.free(dy1, saved.pop("ln1_input"))
    dx = yield from ops.add(r, dres, dln, "d_layer_input")
    r.free(dres, dln)
    return dx


def _heads_grad(r, dproj, heads: int, d: int):
    """d proj_input (s, b, a·d/t) -> d context (b, a/t, s, d)."""
    s, b, _ = dproj.shape
    dctx = yield from ops.reshape_copy(r, dproj, (s, b, heads, d), None, "d_context_heads")
    r.free(dproj)
    dctx_t = yield from ops.reshape_copy(r, dctx, (b, heads, s, d), (1, 2, 0, 3),
                                         "d_context")  # (b, a/t, s, d)
    r.free(dctx)
    return dctx_t


def _gpt_core_backward(r, spec, saved, dproj):
    """K22's core backward -> d(qkv) (s, b, 3h/t)."""
    s, b, width = dproj.shape
    q, k, v = saved.pop("q"), saved.pop("k"), saved.pop("v")
    dctx = yield from ops.reshape_copy(r, dproj, (s, b, q.shape[1], q.shape[3]), None,
                                       "d_context_heads")
    r.free(dproj)
    dctx_t = yield from ops.reshape_copy(r, dctx, (b, q.shape[1], s, q.shape[3]), (1, 2, 0, 3),
                                         "d_context")  # (b, a/t, s, d)
    r.free(dctx)
    probs, mask, dropped = yield from _core_tensors(r, spec, saved, q, k, v)
    dq, dk, dv = yield from core_backward(r, spec, q, k, v, probs, mask, dropped, dctx_t)
    dqkv = yield from merge_qkv_grads(r, dq, dk, dv)  # (s, b, 3h/t)
    r.free(dq, dk, dv)
    return dqkv


def core_grads(r, spec, saved, dproj, proj_in):
    """The flash or unfused core's backward on saved q, k (b, a/t, s, d), v (b, a/t, s, d_v)
    (no group reduction, no RoPE): d proj_input (s, b, a·d_v/t) -> dq, dk, dv."""
    m = spec.model
    q, k, v = saved.pop("q"), saved.pop("k"), saved.pop("v")
    if not m.flash:
        dctx = yield from _heads_grad(r, dproj, q.shape[1], v.shape[-1])
        probs, mask, dropped = yield from _core_tensors(r, spec, saved, q, k, v)
        return (yield from core_backward(r, spec, q, k, v, probs, mask, dropped, dctx))
    lse = saved.pop("softmax_lse", None)
    keep = attention_keep(r, spec, q.shape[0], q.shape[1])
    if lse is None:  # core_attn recomputed: the flash forward again, for its logsumexp
        phase, r.phase = r.phase, "recompute"
        again, lse = yield from ops.flash_attention(r, q, k, v, keep, m.attention_dropout,
                                                    "flash_output", "softmax_lse")
        r.free(again)
        r.phase = phase
    grads = yield from ops.flash_attention_backward(r, dproj, q, k, v, proj_in, lse, keep,
                                                    m.attention_dropout)
    r.free(dproj, proj_in, lse, q, k, v)
    return grads


def _llama_core_backward(r, spec, saved, dproj, proj_in):
    """Flash or unfused core backward, K/V group reduction, inverse RoPE -> d(qkv)."""
    m = spec.model
    heads, d = m.num_attention_heads // r.tp.size, m.head_dim
    groups = m.query_groups // r.tp.size
    q, k, v = saved.pop("q"), saved.pop("k"), saved.pop("v")
    if m.flash and r.cp is not None:
        dq, dk, dv = yield from _cp_core_backward(r, spec, saved, dproj, q, k, v, proj_in)
    elif m.flash:
        lse = saved.pop("softmax_lse", None)
        keep = attention_keep(r, spec, q.shape[0], heads)
        if lse is None:  # core_attn recomputed: the flash forward again, for its logsumexp
            phase, r.phase = r.phase, "recompute"
            again, lse = yield from ops.flash_attention(r, q, k, v, keep, m.attention_dropout,
                                                        "flash_output", "softmax_lse")
            r.free(again)
            r.phase = phase
        dq, dk, dv = yield from ops.flash_attention_backward(r, dproj, q, k, v, proj_in, lse,
                                                             keep, m.attention_dropout)
        r.free(dproj, proj_in, lse, q, k, v)
    else:
        dctx = yield from _heads_grad(r, dproj, heads, d)
        probs, mask, dropped = yield from _core_tensors(r, spec, saved, q, k, v)
        dq, dk, dv = yield from core_backward(r, spec, q, k, v, probs, mask, dropped, dctx)
        if groups != heads:
            k_name, v_name = kv_names(m)
            dk_g = yield from ops.reduce_kv(r, dk, heads // groups, f"d_{k_name}")
            dv_g = yield from ops.reduce_kv(r, dv, heads // groups, f"d_{v_name}")
            r.free(dk, dv)
            dk, dv = dk_g, dv_g
    if m.position_embedding_type == "rope":
        cos, sin = rope_angles(m, q.shape[2], r.cp) if r.numeric else (None, None)
        dq_in = yield from ops.rope(r, dq, cos, sin, "d_q_unrotated", inverse=True)
        dk_in = yield from ops.rope(r, dk, cos, sin, "d_k_unrotated", inverse=True)
        r.free(dq, dk)
        dq, dk = dq_in, dk_in
    dqkv = yield from merge_qkv_grads(r, dq, dk, dv)  # (s, b, (a + 2G)d/t)
    r.free(dq, dk, dv)
    return dqkv


def _cp_core_backward(r, spec, saved, dproj, q, k, v, proj_in):
    """Context parallelism: the ring (or all-to-all) attention backward over the CP group (its
    forward again first when core_attn is recomputed); it frees what its forward kept itself."""
    keep, p = cp_attention_keep(r, spec, q.shape[0], q.shape[1]), spec.model.attention_dropout
    lse = saved.pop("softmax_lse", None)
    if lse is None:  # core_attn recomputed: the ring forward again, for its logsumexp
        phase, r.phase = r.phase, "recompute"
        again, lse = yield from r.cp.forward(r, q, k, v, "flash_output", "softmax_lse", keep, p)
        r.free(again)
        r.phase = phase
    else:
        kept = saved.pop(r.cp.saved_name, None)
        if kept is not None:
            kept.key = None  # freed by the CP attention's backward
    dq, dk, dv = yield from r.cp.backward(r, dproj, q, k, v, proj_in, lse, keep, p)
    r.free(dproj, proj_in, lse, q, k, v)
    return dq, dk, dv


def recompute_norm(r, m, w, x, prefix: str, name: str):
    """--recompute-modules layernorm: the norm's output again from its kept input (Megatron's
    CheckpointWithoutOutput), just before the GEMM backward that reads it."""
    phase, r.phase = r.phase, "recompute"
    y = yield from norm(r, m, x, w, prefix, name)
    r.phase = phase
    return y


def _recompute_mlp(r, spec, w, saved):
    """--recompute-modules mlp: Megatron checkpoints the whole MLP, so backward re-runs all of
    its forward from the kept fc1 input (fc2 and its f̄/ḡ included, its output dropped) and
    keeps the activation's input and output for the MLP backward."""
    phase, r.phase = r.phase, "recompute"
    h1, g = yield from mlp_inner(r, spec.model, w, saved["fc1_input"])
    partial = yield from ops.linear(r, g, w["mlp.fc2.weight"], None, "mlp_output")  # (s, b, h)
    reduced = yield from mappings.exit_forward(r, partial, "mlp_exit")  # (s_l, b, h)
    r.free(partial, None if reduced is partial else reduced)
    saved[act_input_name(spec.model)], saved["fc2_input"] = h1, g
    r.phase = phase


def _core_tensors(r, spec, saved, q, k, v):
    """The softmax output, mask and dropout output: saved, or recomputed (selective)."""
    if "softmax_output" in saved:
        probs = saved.pop("softmax_output")
        mask = saved.pop("softmax_dropout_mask", None)
        dropped = saved.pop("attention_dropout_output", probs)
        return probs, mask, dropped
    phase, r.phase = r.phase, "recompute"
    probs, mask, dropped, context = yield from attention_core(r, spec, q, k, v)
    r.free(context)
    r.phase = phase
    return probs, mask, dropped


def layer_backward(r, spec: LayerSpec, w: dict, g: dict, saved: dict, dout):
    """dout (s_l, b, h) -> dx (s_l, b, h); frees every saved tensor as backward consumes it.

    Full recompute first re-runs the forward from the kept `layer_input`, saving as usual."""
    if spec.recompute == "full":
        phase, r.phase = r.phase, "recompute"
        layer_input = saved.pop("layer_input")
        out, saved = yield from layer_forward(r, spec, w, layer_input, keep=True)
        r.free(out)
        r.phase = phase
    saved = dict(saved)
    if spec.moe:
        from simsp.model.blocks.moe.layer import moe_mlp_backward  # MoE models only (import cycle)
        dres = yield from moe_mlp_backward(r, spec, w, g, saved, dout)
    else:
        dres = yield from mlp_backward(r, spec, w, g, saved, dout)
    dx = yield from attention_backward(r, spec, w, g, saved, dres)
    assert not saved, f"saved tensors left after backward: {sorted(saved)}"
    return dx
