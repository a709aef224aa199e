"""The whole reference model on one device: embedding, layers, final norm, logits and the
mean cross entropy, multi-token prediction (docs/mtp.md), and the gradients of all of it.

Embedding: word[tokens] (+ a learned position table), then dropout (site "embedding" of layer
−1). Logits y @ Wᵀ with W the word table (tied) or output.weight (untied). The objective
differentiated is the main loss, plus each MTP depth's weighted loss, plus each MoE
micro-batch's aux loss weighted b/B; the loss returned is the main one, as the simulated run
reports it.
"""

import numpy as np

from simsp.model.reference import autodiff as ad
from simsp.model.reference import textbook as tb
from simsp.model.reference.layer import Site, layer, norm


def _under(P: dict, prefix: str) -> dict:
    """The entries of P under `prefix`, keyed by the rest of their name."""
    return {name[len(prefix):]: v for name, v in P.items() if name.startswith(prefix)}


def _shifted(a: np.ndarray, k: int) -> np.ndarray:
    """(s, B) moved up by k rows, the last k rows 0 (Megatron's roll_tensor, k times)."""
    out = np.zeros_like(a)  # (s, B)
    out[:len(a) - k] = a[k:]
    return out


def _add(total, term):
    """total + term, where either may be None (nothing yet)."""
    if term is None:
        return total
    return term if total is None else total + term


def _embed(W: dict, tokens, model, site: Site):
    """word[tokens] (+ position[:s]) -> dropout: (s, B, h)."""
    emb = W["embedding.word"][tokens]  # (s, B, h)
    if "embedding.position" in W:
        s, h = tokens.shape[0], model.hidden_size
        emb = emb + W["embedding.position"][:s].reshape(s, 1, h)
    return tb.dropout(emb, site.hidden(model.hidden_dropout, "embedding", emb.shape),
                      model.hidden_dropout)


def _mtp_objective(W: dict, y, tokens, targets, model, site: Site, group, chunks):
    """Σ over depths k of factor/D × the mean cross entropy of predicting the tokens k + 1
    ahead over the first s − k − 1 positions, plus the depths' MoE aux terms."""
    s, B, h = y.shape
    D, L = model.mtp_num_layers, model.num_layers
    output = W.get("output.weight", W["embedding.word"]).transpose(1, 0)  # (h, v)
    h_prev, objective = y, None
    for k in range(D):
        P, depth_site = _under(W, f"mtp.{k}."), Site(site.seed, L + k, site.sample_offset)
        emb = _embed({"embedding.word": W["embedding.word"]}, _shifted(tokens, k + 1), model,
                     depth_site)  # (s, B, h)
        joined = ad.concatenate([norm(P, emb, "enorm", model), norm(P, h_prev, "hnorm", model)],
                                axis=-1)  # (s, B, 2h)
        out, aux = layer(_under(P, "layer."), joined @ P["eh_proj.weight"], model, depth_site,
                         group, chunks)
        h_prev = norm(P, out, "final_ln", model)  # (s, B, h)
        n = s - k - 1
        loss = tb.cross_entropy_sum((h_prev @ output)[:n], _shifted(targets, k + 1)[:n])
        objective = _add(_add(objective, aux),
                         loss * (model.mtp_loss_scaling_factor / (D * n * B)))
    return objective


def forward(W: dict, tokens, targets, model, site: Site, group=None, chunks=1):
    """The main loss, the objective to differentiate and the embedding output (Vars)."""
    x0 = x = _embed(W, tokens, model, Site(site.seed, -1, site.sample_offset))  # (s, B, h)
    objective = None
    for i in range(model.num_layers):
        x, aux = layer(_under(W, f"layers.{i}."), x, model, Site(site.seed, i, site.sample_offset),
                       group, chunks)
        objective = _add(objective, aux)
    y = norm(W, x, "final_ln", model)  # (s, B, h)
    output = W.get("output.weight", W["embedding.word"]).transpose(1, 0)  # (h, v)
    loss = tb.cross_entropy_sum(y @ output, targets) * (1.0 / tokens.size)
    objective = _add(objective, loss)
    if model.mtp_num_layers:
        objective = _add(objective, _mtp_objective(W, y, tokens, targets, model, site, group,
                                                   chunks))
    return loss, objective, x0


def _grad(var, like: np.ndarray) -> np.ndarray:
    """A leaf's gradient, zeros where the objective does not reach it."""
    return np.zeros_like(like) if var.grad is None else np.asarray(var.grad)


def reference_forward_backward(params, tokens, targets, model, seed, sample_offset=0,
                               moe_group=None, moe_chunks=1):
    """Mean cross-entropy loss over the s·B tokens and {name: grad}, plus "embedding_output":
    d objective / d (embedding output after dropout), (s, B, h). tokens, targets (s, B) ints;
    column c is global sample sample_offset + c (its dropout masks). MoE layers route each
    group of `moe_group` samples (the micro-batch) per row set of `moe_chunks` (t sequence
    slices under sequence parallelism, or the ranks' positions under context parallelism)."""
    W = {name: ad.leaf(array) for name, array in params.items()}
    loss, objective, x0 = forward(W, tokens, targets, model, Site(seed, -1, sample_offset),
                                  moe_group, moe_chunks)
    ad.backward(objective, 1.0)
    grads = {name: _grad(W[name], array) for name, array in params.items()}
    grads["embedding_output"] = _grad(x0, x0.value)
    return float(loss.value), grads


def reference_layer(params, x, dout, i, model, seed, sample_offset=0, moe_chunks=1):
    """Layer i alone: x, dout (s, B, h) -> (out (s, B, h), dx (s, B, h), {suffix: grad});
    a MoE layer routes the whole batch per row set of `moe_chunks`, its aux loss weighted 1."""
    P = {name: ad.leaf(array) for name, array in _under(params, f"layers.{i}.").items()}
    xv = ad.leaf(x)
    out, aux = layer(P, xv, model, Site(seed, i, sample_offset), moe_chunks=moe_chunks)
    ad.backward(_add((out * dout).sum(), aux), 1.0)
    return out.value, _grad(xv, x), {n: _grad(v, v.value) for n, v in P.items()}


def relative_error(actual, expected) -> float:
    """max |actual − expected| / max |expected| (the absolute difference if expected is zero)."""
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    diff = float(np.max(np.abs(actual - expected))) if expected.size else 0.0
    return diff / scale if scale > 0 else diff
