"""Single-device GPT forward and backward: the oracle every parallel layout is compared against.

Straight-line code on kernels.py, params.py and dropout_sites.py only. Pre-LN GPT-2 layer,
Megatron layout (s, b, h):
  x -> LN1 -> QKV -> heads -> QK^T/sqrt(d) -> causal softmax -> dropout -> @V -> merge heads
    -> proj -> dropout -> + x -> LN2 -> fc1 -> GeLU -> fc2 -> dropout -> + residual
Embedding dropout after word + position; final LN; logits = y @ word.T (tied); mean cross entropy.
Dropout masks come from dropout_sites (global coordinates, see that module).
Llama-class variants (docs/llama.md) change single lines: RMSNorm for LN, RoPE on q and k, grouped
K/V heads expanded to their query heads, SwiGLU for GeLU, no biases, an untied output weight;
flash attention is the same math (the plain softmax here is its oracle).
"""

from types import SimpleNamespace

from dataclasses import replace

import numpy as np

from simsp.model.blocks import numerics as K
from simsp.model.base.dropout_sites import attention_keep, hidden_keep
from simsp.model.blocks.moe.router import MoeSpec, aux_loss, aux_loss_backward
from simsp.model.blocks.moe.experts import moe_backward, moe_forward
from simsp.model.blocks.moe.shared import shared_backward, shared_forward
from simsp.model.blocks.attention import mla as MLA
from simsp.model.params import layer_param_names


def _layer_params(params, i):
    """Layer i's parameters keyed by suffix (e.g. "attn.qkv.weight")."""
    prefix = f"layers.{i}."
    return {name[len(prefix):]: params[name] for name in layer_param_names(i) if name in params}


def _norm(P, x, prefix, model):
    """LayerNorm or RMSNorm of x (s, B, h)."""
    if model.normalization == "RMSNorm":
        return K.rmsnorm_forward(x, P[f"{prefix}.gamma"], model.norm_epsilon)
    return K.layernorm_forward(x, P[f"{prefix}.gamma"], P[f"{prefix}.beta"])


def _norm_backward(P, dy, x, prefix, model, g):
    """dx of _norm; its weight gradients go into g."""
    if model.normalization == "RMSNorm":
        dx, g[f"{prefix}.gamma"] = K.rmsnorm_backward(dy, x, P[f"{prefix}.gamma"],
                                                      model.norm_epsilon)
        return dx
    dx, g[f"{prefix}.gamma"], g[f"{prefix}.beta"] = K.layernorm_backward(dy, x, P[f"{prefix}.gamma"])
    return dx


def _linear_backward(P, dy, x, prefix, g, weight_shape=None):
    """dx of x @ W (+ b); dW (reshaped to the parameter's shape) and db (if W has a bias) into g."""
    w = P[f"{prefix}.weight"]
    dx, dw, db = K.linear_backward(dy, x, w.reshape(w.shape[0], -1))
    g[f"{prefix}.weight"] = dw.reshape(w.shape)
    if f"{prefix}.bias" in P:
        g[f"{prefix}.bias"] = db.reshape(P[f"{prefix}.bias"].shape)
    return dx


def _fc1(P):
    """fc1's weight (h, f) or SwiGLU's (h, 2, f) as the (h, 2f) GEMM operand [gate | up]."""
    w, b = P["mlp.fc1.weight"], P.get("mlp.fc1.bias")
    return w.reshape(w.shape[0], -1), None if b is None else b.reshape(-1)


def _rope(model, s):
    return K.rope_angles(s, int(model.head_dim * model.rotary_percent), model.rotary_base)


def _mla_rope(model, s):
    """cos, sin (s, rot) of MLA's shared RoPE key width d_r."""
    return K.rope_angles(s, int(model.qk_pos_emb_head_dim * model.rotary_percent),
                         model.rotary_base)


def _layer_forward(P, x, i, model, seed, sample_offset, moe_group=None, moe_chunks=1):
    """One transformer layer forward; returns (out (s, B, h), saved activations)."""
    a, ph, pa = model.num_attention_heads, model.hidden_dropout, model.attention_dropout
    G = model.query_groups
    c = SimpleNamespace(x=x)  # x (s, B, h)
    c.ln1 = _norm(P, x, "ln1", model)  # (s, B, h)
    if model.multi_latent_attention:  # q, k (B, a, s, d_n + d_r), v (B, a, s, d_v)
        c.q, c.k, c.v, c.mla = MLA.mla_forward(c.ln1, P, model, *_mla_rope(model, x.shape[0]))
    else:
        qkv = K.linear_forward(c.ln1, P["attn.qkv.weight"], P.get("attn.qkv.bias"))  # (s,B,(a+2G)d)
        c.q, k, v = K.split_qkv(qkv, a, G)  # q (B, a, s, d), k, v (B, G, s, d)
        if model.position_embedding_type == "rope":
            cos, sin = _rope(model, x.shape[0])
            c.q, k = K.rope_forward(c.q, cos, sin), K.rope_forward(k, cos, sin)
        c.k, c.v = K.expand_kv(k, a // G), K.expand_kv(v, a // G)  # (B, a, s, d) each
    scores = K.attention_scores_forward(c.q, c.k)  # (B, a, s, s)
    c.probs = K.causal_softmax_forward(scores)  # (B, a, s, s)
    c.keep_a = attention_keep(pa, seed, i, c.probs.shape, sample_start=sample_offset)  # bool
    c.probs_d = K.dropout_forward(c.probs, c.keep_a, pa)  # (B, a, s, s)
    context = K.attention_context_forward(c.probs_d, c.v)  # (B, a, s, d)
    c.ctx = K.merge_heads(context)  # (s, B, h)
    proj = K.linear_forward(c.ctx, P["attn.proj.weight"], P.get("attn.proj.bias"))  # (s, B, h)
    c.keep_1 = hidden_keep(ph, seed, i, "attn_out", proj.shape, sample_start=sample_offset)
    c.x1 = x + K.dropout_forward(proj, c.keep_1, ph)  # (s, B, h)
    c.ln2 = _norm(P, c.x1, "ln2", model)  # (s, B, h)
    if "mlp.router.weight" in P:
        fc2 = _moe_forward(P, c, model, moe_group, moe_chunks)  # (s, B, h)
    else:
        c.fc1 = K.linear_forward(c.ln2, *_fc1(P))  # (s, B, f), SwiGLU (s, B, 2f)
        act = K.swiglu_forward if model.swiglu else K.gelu_forward
        c.gelu = act(c.fc1)  # (s, B, f)
        fc2 = K.linear_forward(c.gelu, P["mlp.fc2.weight"], P.get("mlp.fc2.bias"))  # (s, B, h)
    c.keep_2 = hidden_keep(ph, seed, i, "mlp_out", fc2.shape, sample_start=sample_offset)
    out = c.x1 + K.dropout_forward(fc2, c.keep_2, ph)  # (s, B, h)
    return out, c


def _moe_spec(model) -> MoeSpec:
    """The layer's routing flags (simsp/model/blocks/moe/kernels.py)."""
    coeff = model.moe_aux_loss_coeff if model.moe_router_load_balancing_type == "aux_loss" else 0.0
    return MoeSpec(model.num_experts, model.moe_router_topk, model.moe_router_score_function,
                   coeff, model.moe_expert_capacity_factor,
                   model.moe_pad_expert_input_to_capacity, model.swiglu)


def _moe_weights(P) -> dict:
    """Router (h, E) and experts fc1 (E, h, f | 2f), fc2 (E, f, h) as moe_kernels reads them."""
    fc1 = P["mlp.experts.fc1.weight"]
    return {"router": P["mlp.router.weight"], "fc1": fc1.reshape(fc1.shape[0], fc1.shape[1], -1),
            "fc2": P["mlp.experts.fc2.weight"]}


def _shared_fc1(P):
    """The shared experts' fc1 as the (h, f_s | 2f_s) GEMM operand ([gate | up] for SwiGLU)."""
    fc1 = P["mlp.shared_experts.fc1.weight"]
    return fc1.reshape(fc1.shape[0], -1)


def _moe_forward(P, c, model, group, chunks: int = 1):
    """The MoE MLP on ln2 (s, B, h), routed per micro-batch of `group` samples (Megatron
    routes, drops and balances each micro-batch on its own) and, under sequence parallelism,
    per sequence chunk of s/`chunks` (each TP rank routes and drops its own shard), or per row
    set of the list `chunks` (each (tp, cp) rank's positions under context parallelism); the
    aux loss is the micro-batch's whole one (moe_utils.py get_tokens_per_expert_and_token_count).
    Returns (s, B, h)."""
    s, B, h = c.ln2.shape
    group = group or B
    spec = _moe_spec(model)
    local = replace(spec, aux_loss_coeff=0.0)
    out, c.moe, c.moe_aux = np.zeros_like(c.ln2), [], []  # (s, B, h)
    for start in range(0, B, group):
        block = c.ln2[:, start:start + group]  # (s, b, h)
        logits = block.reshape(-1, h) @ P["mlp.router.weight"]  # (s·b, E)
        c.moe_aux.append((start, logits) + (aux_loss(logits, spec)[1:]
                                            if spec.aux_loss_coeff > 0 else (None, None)))
        shards = ([slice(k * s // chunks, (k + 1) * s // chunks) for k in range(chunks)]
                  if isinstance(chunks, int) else chunks)
        for rows in shards:
            tokens = block[rows].reshape(-1, h)  # (s/chunks·b, h)
            y, _, cache = moe_forward(tokens, _moe_weights(P), local)
            if "mlp.shared_experts.fc2.weight" in P:
                shared, cache["shared_h1"], cache["shared_g"] = shared_forward(
                    tokens, _shared_fc1(P), P["mlp.shared_experts.fc2.weight"], model.swiglu)
                y = y + shared
            out[rows, start:start + group] = y.reshape(-1, group, h)
            cache["block"] = (rows, slice(start, start + group))
            c.moe.append(cache)
    return out


def _moe_backward(P, dfc2, c, model, g):
    """d ln2 (s, B, h) of _moe_forward; each micro-batch's aux loss gets gradient b/B (Megatron:
    1 / micro-batches, then the DP average), its weight gradients summed into g."""
    s, B, h = dfc2.shape
    group = B // len(c.moe_aux)
    w, spec = _moe_weights(P), _moe_spec(model)
    local = replace(spec, aux_loss_coeff=0.0)
    dln2 = np.zeros_like(dfc2)  # (s, B, h)
    for cache in c.moe:
        rows, cols = cache["block"]
        dy = dfc2[rows, cols].reshape(-1, h)  # (s/chunks·b, h)
        dx, grads = moe_backward(dy, w, cache, local)
        if "shared_h1" in cache:
            fc1 = P["mlp.shared_experts.fc1.weight"]
            dxs, grads["shared_fc1"], grads["shared_fc2"] = shared_backward(
                dy, cache["x"], cache["shared_h1"], cache["shared_g"], _shared_fc1(P),
                P["mlp.shared_experts.fc2.weight"], model.swiglu)
            grads["shared_fc1"] = grads["shared_fc1"].reshape(fc1.shape)
            dx = dx + dxs
        dln2[rows, cols] = dx.reshape(-1, group, h)
        _add_moe_grads(P, g, grads)
    for start, logits, dscores, scores in c.moe_aux:
        if dscores is None:
            continue
        dlogits = group / B * aux_loss_backward(dscores, scores, logits, spec)  # (s·b, E)
        x = c.ln2[:, start:start + group].reshape(-1, h)  # (s·b, h)
        dln2[:, start:start + group] += (dlogits @ P["mlp.router.weight"].T).reshape(s, -1, h)
        _add_moe_grads(P, g, {"router": x.T @ dlogits})
    return dln2


def _add_moe_grads(P, g: dict, grads: dict) -> None:
    """Sum a routing block's MoE weight gradients into g."""
    for key, name in (("router", "mlp.router.weight"), ("fc1", "mlp.experts.fc1.weight"),
                      ("fc2", "mlp.experts.fc2.weight"),
                      ("shared_fc1", "mlp.shared_experts.fc1.weight"),
                      ("shared_fc2", "mlp.shared_experts.fc2.weight")):
        if key in grads:
            grad = grads[key].reshape(P[name].shape)
            g[name] = grad if name not in g else g[name] + grad


def _layer_backward(P, dout, c, model):
    """One transformer layer backward; returns (dx (s, B, h), {suffix: grad})."""
    ph, pa, g = model.hidden_dropout, model.attention_dropout, {}
    dfc2 = K.dropout_backward(dout, c.keep_2, ph)  # (s, B, h)
    if "mlp.router.weight" in P:
        dln2 = _moe_backward(P, dfc2, c, model, g)
    else:
        dgelu = _linear_backward(P, dfc2, c.gelu, "mlp.fc2", g)  # (s, B, f)
        act_backward = K.swiglu_backward if model.swiglu else K.gelu_backward
        dfc1 = act_backward(dgelu, c.fc1)  # (s, B, f), SwiGLU (s, B, 2f)
        dln2 = _linear_backward(P, dfc1, c.ln2, "mlp.fc1", g)  # (s, B, h)
    dx1_ln = _norm_backward(P, dln2, c.x1, "ln2", model, g)
    dx1 = dout + dx1_ln  # (s, B, h): residual + LN2 branch
    dproj = K.dropout_backward(dx1, c.keep_1, ph)  # (s, B, h)
    dctx = _linear_backward(P, dproj, c.ctx, "attn.proj", g)  # (s, B, a·d)
    dcontext = K.split_heads(dctx, model.num_attention_heads)  # (B, a, s, d)
    dprobs_d, dv = K.attention_context_backward(dcontext, c.probs_d, c.v)  # (B,a,s,s), (B,a,s,d)
    dprobs = K.dropout_backward(dprobs_d, c.keep_a, pa)  # (B, a, s, s)
    dscores = K.softmax_backward(dprobs, c.probs)  # (B, a, s, s)
    dq, dk = K.attention_scores_backward(dscores, c.q, c.k)  # (B, a, s, d) each
    if model.multi_latent_attention:
        dln1, mla_grads = MLA.mla_backward(dq, dk, dv, c.mla, P, model,
                                           *_mla_rope(model, dq.shape[2]))  # (s, B, h)
        g.update(mla_grads)
        dx_ln = _norm_backward(P, dln1, c.x, "ln1", model, g)
        return dx1 + dx_ln, g
    G = model.query_groups
    dk, dv = K.reduce_kv(dk, model.num_attention_heads // G), K.reduce_kv(dv, model.num_attention_heads // G)
    if model.position_embedding_type == "rope":
        cos, sin = _rope(model, dq.shape[2])
        dq, dk = K.rope_backward(dq, cos, sin), K.rope_backward(dk, cos, sin)
    dqkv = K.merge_qkv_grads(dq, dk, dv)  # (s, B, (a + 2G)d)
    dln1 = _linear_backward(P, dqkv, c.ln1, "attn.qkv", g)  # (s, B, h)
    dx_ln = _norm_backward(P, dln1, c.x, "ln1", model, g)
    return dx1 + dx_ln, g  # (s, B, h): residual + LN1 branch


def reference_forward_backward(params, tokens, targets, model, seed, sample_offset=0,
                               moe_group=None, moe_chunks=1):
    """Mean cross-entropy loss over the s*B tokens and {name: grad}, plus "embedding_output".
    MoE layers route each group of `moe_group` samples (the micro-batch) on its own, in
    `moe_chunks` sequence chunks (sequence parallelism: t).

    tokens, targets: (s, B) ints; column c is global sample sample_offset + c (dropout masks).
    "embedding_output" is d loss / d (embedding output after embedding dropout), shape (s, B, h).
    """
    word = params["embedding.word"]  # (v, h), v the padded vocabulary
    v, ph = word.shape[0], model.hidden_dropout
    position = params.get("embedding.position")  # None: rope or no position embedding
    emb = word[tokens] if position is None else K.embedding_forward(tokens, word, position)
    keep_e = hidden_keep(ph, seed, -1, "embedding", emb.shape, sample_start=sample_offset)
    x = K.dropout_forward(emb, keep_e, ph)  # (s, B, h)
    saved = []
    for i in range(model.num_layers):
        x, cache = _layer_forward(_layer_params(params, i), x, i, model, seed, sample_offset,
                                  moe_group, moe_chunks)
        saved.append(cache)
    y = _norm(params, x, "final_ln", model)  # (s, B, h)
    output = params.get("output.weight", word)  # (v, h): untied, or the word table
    logits = K.linear_forward(y, output.T, None)  # (s, B, v)
    n_tokens = tokens.size
    loss = K.cross_entropy_forward(logits, targets) / n_tokens

    grads = {}
    dlogits = K.cross_entropy_backward(logits, targets, 1.0 / n_tokens)  # (s, B, v)
    dy, dword_t, _ = K.linear_backward(dlogits, y, output.T)  # (s, B, h), (h, v)
    dword_mtp = 0.0
    if model.mtp_num_layers:
        mtp = _mtp_forward_backward(params, y, tokens, targets, model, seed, sample_offset,
                                    moe_group, moe_chunks)
        dy, dword_t, dword_mtp = dy + mtp.dy, dword_t + mtp.doutput_t, mtp.dword
        grads.update(mtp.grads)
    dx = _norm_backward(params, dy, x, "final_ln", model, grads)  # (s, B, h)
    for i in reversed(range(model.num_layers)):
        dx, g = _layer_backward(_layer_params(params, i), dx, saved[i], model)
        grads.update({f"layers.{i}.{suffix}": grad for suffix, grad in g.items()})
    grads["embedding_output"] = dx  # (s, B, h)
    demb = K.dropout_backward(dx, keep_e, ph)  # (s, B, h)
    dword, dposition = K.embedding_backward(demb, tokens, v, model.seq_length)
    dword = dword + dword_mtp  # (v, h): the MTP depths' lookups of the same table
    if position is not None:
        grads["embedding.position"] = dposition
    if "output.weight" in params:
        grads["embedding.word"], grads["output.weight"] = dword, dword_t.T  # (v, h) each
    else:
        grads["embedding.word"] = dword + dword_t.T  # (v, h): embedding + tied output layer
    ordered = {name: grads[name] for name in params}  # canonical parameter order
    ordered["embedding_output"] = grads["embedding_output"]
    return loss, ordered


def _shifted(a, k):
    """(s, B) rolled up by k, the last k rows 0 (Megatron's roll_tensor, k times)."""
    out = np.zeros_like(a)  # (s, B)
    out[:len(a) - k] = a[k:]
    return out


def _mtp_forward_backward(params, y, tokens, targets, model, seed, sample_offset, moe_group,
                          moe_chunks):
    """Multi-token prediction on the final norm's output y (s, B, h) (docs/mtp.md): depth k
    embeds the tokens shifted by k, projects [enorm(emb) | hnorm(h_{k-1})] (2h -> h), runs its
    layer (index L + k − 1) and final norm, and adds factor/D × its cross entropy over the
    first s − k positions, averaged over them. Returns dy (s, B, h), the output weight's
    (h, v) and the word table's (v, h) gradients from the depths, and their own gradients."""
    s, B, h = y.shape
    D, L, ph = model.mtp_num_layers, model.num_layers, model.hidden_dropout
    word = params["embedding.word"]
    output = params.get("output.weight", word)  # (v, h)
    h_prev, caches = y, []
    for k in range(D):
        P = {n[len(f"mtp.{k}."):]: a for n, a in params.items() if n.startswith(f"mtp.{k}.")}
        c = SimpleNamespace(P=P, h_prev=h_prev, tokens=_shifted(tokens, k + 1), n=s - k - 1)
        c.keep = hidden_keep(ph, seed, L + k, "embedding", (s, B, h), sample_start=sample_offset)
        c.emb = K.dropout_forward(word[c.tokens], c.keep, ph)  # (s, B, h)
        c.cat = np.concatenate([_norm(P, c.emb, "enorm", model),
                                _norm(P, h_prev, "hnorm", model)], axis=-1)  # (s, B, 2h)
        layer = {n[len("layer."):]: a for n, a in P.items() if n.startswith("layer.")}
        c.layer = layer
        c.out, c.cache = _layer_forward(layer, c.cat @ P["eh_proj.weight"], L + k, model, seed,
                                        sample_offset, moe_group, moe_chunks)  # (s, B, h)
        c.h = _norm(P, c.out, "final_ln", model)  # (s, B, h)
        caches.append(c)
        h_prev = c.h
    grads, dnext = {}, None
    doutput_t, dword = np.zeros((h, word.shape[0])), np.zeros_like(word)  # (h, v), (v, h)
    for k in reversed(range(D)):
        c, g = caches[k], {}
        logits = K.linear_forward(c.h, output.T, None)  # (s, B, v)
        dlogits = np.zeros_like(logits)  # (s, B, v): the last k positions masked
        scale = model.mtp_loss_scaling_factor / (D * c.n * B)
        dlogits[:c.n] = K.cross_entropy_backward(logits[:c.n], _shifted(targets, k + 1)[:c.n],
                                                 scale)
        dh, dout_t, _ = K.linear_backward(dlogits, c.h, output.T)  # (s, B, h), (h, v)
        doutput_t += dout_t
        if dnext is not None:
            dh = dh + dnext
        dout = _norm_backward(c.P, dh, c.out, "final_ln", model, g)
        dp, layer_grads = _layer_backward(c.layer, dout, c.cache, model)
        g.update({f"layer.{n}": a for n, a in layer_grads.items()})
        dcat = _linear_backward(c.P, dp, c.cat, "eh_proj", g)  # (s, B, 2h)
        dnext = _norm_backward(c.P, dcat[..., h:], c.h_prev, "hnorm", model, g)
        demb = _norm_backward(c.P, dcat[..., :h], c.emb, "enorm", model, g)
        np.add.at(dword, c.tokens.reshape(-1),
                  K.dropout_backward(demb, c.keep, ph).reshape(-1, h))
        grads.update({f"mtp.{k}.{n}": a for n, a in g.items()})
    return SimpleNamespace(dy=dnext, doutput_t=doutput_t, dword=dword, grads=grads)


def relative_error(actual, expected) -> float:
    """max |actual − expected| / max |expected| (the absolute difference if expected is zero)."""
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    diff = float(np.max(np.abs(actual - expected))) if expected.size else 0.0
    return diff / scale if scale > 0 else diff


def reference_layer(params, x, dout, i, model, seed, sample_offset=0, moe_chunks=1):
    """Layer i alone: x, dout (s, B, h) -> (out (s, B, h), dx (s, B, h), {suffix: grad});
    a MoE layer routes in `moe_chunks` sequence chunks (SP: t)."""
    layer = _layer_params(params, i)
    out, cache = _layer_forward(layer, x, i, model, seed, sample_offset, moe_chunks=moe_chunks)
    dx, grads = _layer_backward(layer, dout, cache, model)
    return out, dx, grads
