"""Vocabulary-parallel word embedding + learned positions + embedding dropout (first stage).

Each TP rank holds v/t rows of the word table; a token outside its rows contributes zeros and
the partial sums meet in f̄ (all-reduce) or, under SP, ḡ (reduce-scatter) (Megatron-LM
VocabParallelEmbedding). Keeps the dropout mask (sbh/t under SP) for backward (K22 §4.3).
Parameters: the word table embedding.word (v, h) and, with learned absolute positions, the
position table embedding.position (s, h) (no table for rope or none).
"""

import numpy as np

from simsp.model import mappings
from simsp.model.base import ops
from simsp.model.base.dropout_sites import site_id
from simsp.model.tensor import FP16


def shapes(model) -> dict[str, tuple[int, ...]]:
    """embedding.word (v, h) and, learned absolute positions only, embedding.position (s, h)."""
    out = {"embedding.word": (model.vocab_size, model.hidden_size)}
    if model.position_embedding_type == "learned_absolute":
        out["embedding.position"] = (model.seq_length, model.hidden_size)
    return out


# ---------------------------------------------------------------------------------------------
# numpy: the single-device lookup (the reference's)


def token_embedding_forward(tokens, word, position):
    """tokens (s, b) ints -> word[tokens] + position[0:s], shape (s, b, h)."""
    s = tokens.shape[0]
    return word[tokens] + position[:s][:, None, :]  # (s, b, h)


def token_embedding_backward(dy, tokens, v, s):
    """Scatter-add dy (s_tok, b, h) into (dword (v, h), dposition (s, h)); s is the table length."""
    h = dy.shape[-1]
    dword = np.zeros((v, h), dtype=dy.dtype)  # (v, h)
    np.add.at(dword, tokens.reshape(-1), dy.reshape(-1, h))
    dposition = np.zeros((s, h), dtype=dy.dtype)  # (s, h)
    dposition[: dy.shape[0]] = dy.sum(axis=1)
    return dword, dposition


# ---------------------------------------------------------------------------------------------
# ops on a rank


def _rows(start, n: int):
    """The position table's rows: a slice from `start`, or the given positions (n,)."""
    return slice(start, start + n) if np.ndim(start) == 0 else start


def _vocab_range(r, word) -> tuple[int, int]:
    """[start, end) of the vocabulary rows this TP rank's word table holds."""
    rows = word.shape[0]
    return r.tp.index * rows, (r.tp.index + 1) * rows


def _local_tokens(r, word, tokens: np.ndarray):
    """Tokens relative to this rank's rows, and which of them this rank owns. (s, b) each."""
    start, end = _vocab_range(r, word)
    owned = (tokens >= start) & (tokens < end)
    return np.where(owned, tokens - start, 0), owned


def embedding_forward(r, model, w: dict, tokens: np.ndarray | None, shape: tuple,
                      sample_offset: int, dropout_layer: int = -1):
    """tokens (s, b) -> x (s_l, b, h) and the stash {name: tensor} kept for backward.
    `dropout_layer`: the layer index naming its dropout site (-1; an MTP depth's layer)."""
    s, b = shape
    word = w["embedding.word"]
    partial = r.alloc((s, b, model.hidden_size), FP16, "word_embedding")  # (s, b, h)
    if r.numeric:
        local, owned = _local_tokens(r, word, tokens)
        partial.data = word.data[local] * owned[..., None]
    yield from r.compute("word_embedding", "elementwise", nbytes=2 * partial.nbytes)
    x = yield from mappings.exit_forward(r, partial, "embedding_exit")  # (s_l, b, h)
    if x is not partial:
        r.free(partial)
    seq_start = r.sequence_rows(x.shape[0])  # first position, or the CP rank's positions
    if "embedding.position" in w:  # learned absolute positions (no table for rope, none)
        if r.numeric:
            position = w["embedding.position"].data[_rows(seq_start, x.shape[0])]  # (s_l, h)
            x.data = x.data + position[:, None, :]
        yield from r.compute("position_embedding", "elementwise", nbytes=3 * x.nbytes)
    p = model.hidden_dropout
    if p == 0:
        return x, {}
    mask = ops.dropout_mask(r, p, site_id(dropout_layer, "embedding"),
                            (seq_start, sample_offset, 0),
                            x.shape, "embedding_dropout_mask")
    r.save(mask, "embedding_dropout_mask")
    out = yield from ops.dropout(r, x, mask, p, "embedding_output")
    r.free(x)
    return out, {"embedding_dropout_mask": mask}


# PyTorch's embedding_dense_backward_cuda takes its small-batch kernel up to this many tokens
# (aten/src/ATen/native/cuda/Embedding.cu: `num_indices <= 3072 && !scale_grad_by_freq`).
_FEATURE_KERNEL_MAX_TOKENS = 3072


def word_grad_kernels(tokens: int, rows: int, h: int, itemsize: int, main_grad_bytes: int,
                      after_other: bool, fold: bool) -> tuple:
    """Bytes of each kernel one lookup's backward runs on a (rows, h) table for `tokens` tokens
    (docs/hardware.md §6, "The word embedding's gradient"): PyTorch's dense backward zeroes the
    whole table (`at::zeros`, written at the gradient's `itemsize`) and scatters the tokens'
    rows into it (up to 3072 tokens one kernel reading the rows and adding them in place; more:
    sorted, fp32 partial sums per segment written and read back, then the rows written); autograd
    sums it with a contribution that reached the parameter first (`after_other`: read two
    tables, write one); Megatron's DDP hook then adds the table into the main gradient
    (`fold`: `main_grad.add_(param.grad)`, main gradient read and written)."""
    table = rows * h
    token_bytes = tokens * h * itemsize
    if tokens <= _FEATURE_KERNEL_MAX_TOKENS:
        scatter = 2 * token_bytes
    else:
        scatter = 2 * token_bytes + 2 * tokens * h * 4
    kernels = (table * itemsize, scatter)
    if after_other:
        kernels += (3 * table * itemsize,)
    if fold:
        kernels += (table * (2 * main_grad_bytes + itemsize),)
    return kernels


def embedding_backward(r, model, w: dict, g: dict, tokens, saved: dict, dx,
                       after_other: bool = False, fold: bool = True):
    """Gradient at the embedding output dx (s_l, b, h) -> word and position gradients;
    `after_other` / `fold`: the table's gradient meets one that reached it first on this rank
    / is then added into the main gradient (word_grad_kernels)."""
    mask = saved.get("embedding_dropout_mask")
    demb = yield from ops.dropout_backward(r, dx, mask, model.hidden_dropout, "d_embedding")
    r.free(mask)
    if demb is not dx:
        r.free(dx)
    seq_start = r.sequence_rows(demb.shape[0])
    if r.numeric and "embedding.position" in g:
        rows = demb.data.sum(axis=1)  # (s_l, h)
        g["embedding.position"].data[_rows(seq_start, rows.shape[0])] += rows
    dfull = yield from mappings.exit_backward(r, demb, "embedding_exit_grad")  # (s, b, h)
    if r.numeric:
        word = w["embedding.word"]
        local, owned = _local_tokens(r, word, tokens)
        contrib = dfull.data * owned[..., None]  # (s, b, h)
        np.add.at(g["embedding.word"].data, local.reshape(-1),
                  contrib.reshape(-1, contrib.shape[-1]))
    s_full, b, h = dfull.shape
    rows = w["embedding.word"].shape[0]
    yield from ops.run_kernels(r, "d_word_embedding", word_grad_kernels(
        s_full * b, rows, h, dfull.itemsize, r.precision.grad_bytes("embedding.word"),
        after_other, fold))
    r.free(demb)
    if dfull is not demb:
        r.free(dfull)
