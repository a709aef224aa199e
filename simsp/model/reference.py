"""Single-device GPT forward and backward: the oracle every parallel layout is compared against.

Straight-line code on kernels.py, params.py and dropout_sites.py only. Pre-LN GPT-2 layer,
Megatron layout (s, b, h):
  x -> LN1 -> QKV -> heads -> QK^T/sqrt(d) -> causal softmax -> dropout -> @V -> merge heads
    -> proj -> dropout -> + x -> LN2 -> fc1 -> GeLU -> fc2 -> dropout -> + residual
Embedding dropout after word + position; final LN; logits = y @ word.T (tied); mean cross entropy.
Dropout masks come from dropout_sites (global coordinates, see that module).
"""

from types import SimpleNamespace

import numpy as np

from simsp.model import kernels as K
from simsp.model.dropout_sites import attention_keep, hidden_keep
from simsp.model.params import layer_param_names


def _layer_params(params, i):
    """Layer i's parameters keyed by suffix (e.g. "attn.qkv.weight")."""
    prefix = f"layers.{i}."
    return {name[len(prefix):]: params[name] for name in layer_param_names(i)}


def _layer_forward(P, x, i, model, seed, sample_offset):
    """One transformer layer forward; returns (out (s, B, h), saved activations)."""
    a, ph, pa = model.num_attention_heads, model.hidden_dropout, model.attention_dropout
    c = SimpleNamespace(x=x)  # x (s, B, h)
    c.ln1 = K.layernorm_forward(x, P["ln1.gamma"], P["ln1.beta"])  # (s, B, h)
    qkv = K.linear_forward(c.ln1, P["attn.qkv.weight"], P["attn.qkv.bias"])  # (s, B, 3h)
    c.q, c.k, c.v = K.split_qkv(qkv, a)  # (B, a, s, d) each
    scores = K.attention_scores_forward(c.q, c.k)  # (B, a, s, s)
    c.probs = K.causal_softmax_forward(scores)  # (B, a, s, s)
    c.keep_a = attention_keep(pa, seed, i, c.probs.shape, sample_start=sample_offset)  # bool
    c.probs_d = K.dropout_forward(c.probs, c.keep_a, pa)  # (B, a, s, s)
    context = K.attention_context_forward(c.probs_d, c.v)  # (B, a, s, d)
    c.ctx = K.merge_heads(context)  # (s, B, h)
    proj = K.linear_forward(c.ctx, P["attn.proj.weight"], P["attn.proj.bias"])  # (s, B, h)
    c.keep_1 = hidden_keep(ph, seed, i, "attn_out", proj.shape, sample_start=sample_offset)
    c.x1 = x + K.dropout_forward(proj, c.keep_1, ph)  # (s, B, h)
    c.ln2 = K.layernorm_forward(c.x1, P["ln2.gamma"], P["ln2.beta"])  # (s, B, h)
    c.fc1 = K.linear_forward(c.ln2, P["mlp.fc1.weight"], P["mlp.fc1.bias"])  # (s, B, f)
    c.gelu = K.gelu_forward(c.fc1)  # (s, B, f)
    fc2 = K.linear_forward(c.gelu, P["mlp.fc2.weight"], P["mlp.fc2.bias"])  # (s, B, h)
    c.keep_2 = hidden_keep(ph, seed, i, "mlp_out", fc2.shape, sample_start=sample_offset)
    out = c.x1 + K.dropout_forward(fc2, c.keep_2, ph)  # (s, B, h)
    return out, c


def _layer_backward(P, dout, c, model):
    """One transformer layer backward; returns (dx (s, B, h), {suffix: grad})."""
    ph, pa, g = model.hidden_dropout, model.attention_dropout, {}
    dfc2 = K.dropout_backward(dout, c.keep_2, ph)  # (s, B, h)
    dgelu, g["mlp.fc2.weight"], g["mlp.fc2.bias"] = K.linear_backward(
        dfc2, c.gelu, P["mlp.fc2.weight"])  # (s, B, f)
    dfc1 = K.gelu_backward(dgelu, c.fc1)  # (s, B, f)
    dln2, g["mlp.fc1.weight"], g["mlp.fc1.bias"] = K.linear_backward(
        dfc1, c.ln2, P["mlp.fc1.weight"])  # (s, B, h)
    dx1_ln, g["ln2.gamma"], g["ln2.beta"] = K.layernorm_backward(dln2, c.x1, P["ln2.gamma"])
    dx1 = dout + dx1_ln  # (s, B, h): residual + LN2 branch
    dproj = K.dropout_backward(dx1, c.keep_1, ph)  # (s, B, h)
    dctx, g["attn.proj.weight"], g["attn.proj.bias"] = K.linear_backward(
        dproj, c.ctx, P["attn.proj.weight"])  # (s, B, h)
    dcontext = K.split_heads(dctx, model.num_attention_heads)  # (B, a, s, d)
    dprobs_d, dv = K.attention_context_backward(dcontext, c.probs_d, c.v)  # (B,a,s,s), (B,a,s,d)
    dprobs = K.dropout_backward(dprobs_d, c.keep_a, pa)  # (B, a, s, s)
    dscores = K.softmax_backward(dprobs, c.probs)  # (B, a, s, s)
    dq, dk = K.attention_scores_backward(dscores, c.q, c.k)  # (B, a, s, d) each
    dqkv = K.merge_qkv_grads(dq, dk, dv)  # (s, B, 3h)
    dln1, g["attn.qkv.weight"], g["attn.qkv.bias"] = K.linear_backward(
        dqkv, c.ln1, P["attn.qkv.weight"])  # (s, B, h)
    dx_ln, g["ln1.gamma"], g["ln1.beta"] = K.layernorm_backward(dln1, c.x, P["ln1.gamma"])
    return dx1 + dx_ln, g  # (s, B, h): residual + LN1 branch


def reference_forward_backward(params, tokens, targets, model, seed, sample_offset=0):
    """Mean cross-entropy loss over the s*B tokens and {name: grad}, plus "embedding_output".

    tokens, targets: (s, B) ints; column c is global sample sample_offset + c (dropout masks).
    "embedding_output" is d loss / d (embedding output after embedding dropout), shape (s, B, h).
    """
    word = params["embedding.word"]  # (v, h), v the padded vocabulary
    v, ph = word.shape[0], model.hidden_dropout
    emb = K.embedding_forward(tokens, word, params["embedding.position"])  # (s, B, h)
    keep_e = hidden_keep(ph, seed, -1, "embedding", emb.shape, sample_start=sample_offset)
    x = K.dropout_forward(emb, keep_e, ph)  # (s, B, h)
    saved = []
    for i in range(model.num_layers):
        x, cache = _layer_forward(_layer_params(params, i), x, i, model, seed, sample_offset)
        saved.append(cache)
    y = K.layernorm_forward(x, params["final_ln.gamma"], params["final_ln.beta"])  # (s, B, h)
    logits = K.linear_forward(y, word.T, None)  # (s, B, v)
    n_tokens = tokens.size
    loss = K.cross_entropy_forward(logits, targets) / n_tokens

    grads = {}
    dlogits = K.cross_entropy_backward(logits, targets, 1.0 / n_tokens)  # (s, B, v)
    dy, dword_t, _ = K.linear_backward(dlogits, y, word.T)  # (s, B, h), (h, v)
    dx, grads["final_ln.gamma"], grads["final_ln.beta"] = K.layernorm_backward(
        dy, x, params["final_ln.gamma"])  # (s, B, h)
    for i in reversed(range(model.num_layers)):
        dx, g = _layer_backward(_layer_params(params, i), dx, saved[i], model)
        grads.update({f"layers.{i}.{suffix}": grad for suffix, grad in g.items()})
    grads["embedding_output"] = dx  # (s, B, h)
    demb = K.dropout_backward(dx, keep_e, ph)  # (s, B, h)
    dword, grads["embedding.position"] = K.embedding_backward(demb, tokens, v, model.seq_length)
    grads["embedding.word"] = dword + dword_t.T  # (v, h): embedding + tied output layer
    ordered = {name: grads[name] for name in params}  # canonical parameter order
    ordered["embedding_output"] = grads["embedding_output"]
    return loss, ordered


def relative_error(actual, expected) -> float:
    """max |actual − expected| / max |expected| (the absolute difference if expected is zero)."""
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    diff = float(np.max(np.abs(actual - expected))) if expected.size else 0.0
    return diff / scale if scale > 0 else diff


def reference_layer(params, x, dout, i, model, seed, sample_offset=0):
    """Layer i alone: x, dout (s, B, h) -> (out (s, B, h), dx (s, B, h), {suffix: grad})."""
    layer = _layer_params(params, i)
    out, cache = _layer_forward(layer, x, i, model, seed, sample_offset)
    dx, grads = _layer_backward(layer, dout, cache, model)
    return out, dx, grads
