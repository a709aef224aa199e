"""Megatron's standalone MTP: the depths in a virtual stage of their own before the loss's
(`--pipeline-model-parallel-layout` with `m|L`; docs/pipeline-layout.md, docs/mtp.md).

Megatron-LM: with MTP the decoder's final norm sits with the last decoder layer
(transformer_block.py has_final_layernorm_in_this_stage), whose stage sends h_0 (s_l, b, h);
the MTP stage (gpt_model.py `mtp_process`, not `post_process`) runs the depths from h_0 and
the shifted tokens' embedding (its own copy of the word table) and sends
torch.cat([h_0, h_1, .., h_D], 0), (s_l·(1+D), b, h) (multi_token_prediction.py
MultiTokenPredictionBlock.forward); stages after it pass that on; the loss stage cuts it
(torch.chunk, views) and runs the output layer and cross entropy on each piece: depth k's
loss on h_k, the LM loss on h_0 (process_mtp_loss, then the main head). Backward runs the
same path back: the loss stage sends the (s_l·(1+D), b, h) gradient, the MTP stage the
gradient at h_0.
"""

import numpy as np

from simsp.model.base import ops
from simsp.model.blocks.head import output_loss_backward, output_loss_forward
from simsp.model.blocks.norm import norm, norm_backward
from simsp.model.tensor import FP16
from simsp.training import mtp
from simsp.training.data_parallel.grad_scaling import loss_gradient_factor


def final_norm_forward(r, model, w: dict, x):
    """The decoder's final norm at the end of its last layer's stage: x (s_l, b, h) -> h_0."""
    r.save(x, "final_ln_input")
    y = yield from norm(r, model, x, w, "final_ln", "final_ln")
    return y, {"final_ln_input": x}


def final_norm_backward(r, model, state, dy, saved: dict):
    """d h_0 (s_l, b, h) -> the gradient at the last layer's output."""
    dx = yield from norm_backward(r, model, dy, saved["final_ln_input"], state.weights,
                                  state.grads, "final_ln", "d_final_ln_input")
    r.free(dy, saved["final_ln_input"])
    return dx


def depths_forward(r, sc, state, h0, tokens, offset: int):
    """Every depth from the received h_0 (s_l, b, h) -> the concatenation
    [h_0 | h_1 | .. | h_D] (s_l·(1+D), b, h) to send on, and the depths' stash."""
    scope, depths, h_prev = r.scope, [], h0
    for k in range(sc.model.mtp_num_layers):
        r.save(h_prev, "hnorm_input")  # depth k's hnorm reads it again backward
        r.scope = f"{scope}mtp{k}."
        saved = yield from mtp.depth_forward(r, sc, state, k, h_prev, tokens, offset)
        depths.append(saved)
        h_prev = saved["output"]
        r.scope = scope
    pieces = [h0] + [saved["output"] for saved in depths]
    out = yield from _concatenated(r, pieces, "mtp_hidden_states")
    r.free(h_prev)  # h_D: only the concatenation read it
    return out, depths


def depths_backward(r, sc, state, depths: list, dcat, tokens):
    """The received (s_l·(1+D), b, h) gradient -> the gradient at h_0, depths last first."""
    pieces = _pieces(r, dcat, 1 + len(depths), "d_mtp_hidden")
    scope, dnext = r.scope, pieces[-1]
    for k in reversed(range(len(depths))):
        r.scope = f"{scope}mtp{k}."
        saved = depths[k]
        dprev = yield from mtp.depth_backward(r, sc, state, k, saved, dnext, tokens,
                                              own_table=True)
        r.free(saved["hnorm_input"])
        yield from ops.accumulate(r, dprev, pieces[k], "d_mtp_input")
        r.free(pieces[k])
        dnext = dprev
    r.scope = scope
    return dnext


def loss_forward(r, sc, state, hidden, targets, mtp_losses: dict, key: tuple):
    """The loss stage: the received (s_l·(1+D), b, h) cut into h_0..h_D; depth k's masked
    loss into mtp_losses[key + (k,)] (key: (dp, micro_batch)), then the LM loss on h_0 ->
    (the summed LM token loss, the stash)."""
    m, w = sc.model, state.weights
    s, b = m.seq_length, sc.parallel.micro_batch_size
    pieces = _pieces(r, hidden, 1 + m.mtp_num_layers, "mtp_hidden")
    heads, scope = [], r.scope
    for k in range(m.mtp_num_layers):
        r.scope = f"{scope}mtp{k}."
        loss, stash = yield from output_loss_forward(
            r, m, w, pieces[k + 1], mtp.shifted(targets, k + 1),
            mtp.kept_positions(s, b, k + 1) if r.numeric else None)
        mtp_losses[key + (k,)] = loss
        heads.append(stash)
    r.scope = scope
    loss, main = yield from output_loss_forward(r, m, w, pieces[0], targets)
    return loss, {"main": main, "depths": heads}


def loss_backward(r, sc, state, stash: dict, targets):
    """The loss stage backward -> the (s_l·(1+D), b, h) gradient to send to the MTP stage."""
    m, w, g = sc.model, state.weights, state.grads
    s, b = m.seq_length, sc.parallel.micro_batch_size
    dloss = loss_gradient_factor(sc.parallel) / (s * sc.parallel.global_batch)
    grads = [(yield from output_loss_backward(r, m, w, g, targets, stash["main"], dloss))]
    scope = r.scope
    for k, head in enumerate(stash["depths"]):
        r.scope = f"{scope}mtp{k}."
        grads.append((yield from output_loss_backward(
            r, m, w, g, mtp.shifted(targets, k + 1), head, mtp.depth_loss_gradient(sc, k),
            mtp.kept_positions(s, b, k + 1) if r.numeric else None)))
    r.scope = scope
    dcat = yield from _concatenated(r, grads, "d_mtp_hidden_states")
    r.free(*grads)
    return dcat


def _concatenated(r, pieces: list, name: str):
    """torch.cat of (s_l, b, h) pieces along the sequence: one copy kernel."""
    rows, b, h = pieces[0].shape
    out = yield from ops.elementwise(
        r, (rows * len(pieces), b, h), name,
        lambda: np.concatenate([piece.data for piece in pieces], axis=0),
        2 * sum(piece.nbytes for piece in pieces))  # (s_l·n, b, h)
    return out


def _pieces(r, whole, n: int, name: str) -> list:
    """torch.chunk of (s_l·n, b, h) into n (s_l, b, h) views: no kernel, the same bytes (the
    whole leaves the ledger as its pieces enter it)."""
    rows = whole.shape[0] // n
    shape = (rows,) + tuple(whole.shape[1:])
    data = whole.data
    r.free(whole)
    return [r.alloc(shape, FP16, name, data=None if data is None else
                    np.ascontiguousarray(data[i * rows:(i + 1) * rows])) for i in range(n)]
