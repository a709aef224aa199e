"""Where dropout happens and in which global coordinates its mask is drawn.

Every layout (reference, TP, SP, micro-batches, data parallel) calls these helpers with its
shard's global starts, so all of them draw the single-device mask (base/kernels.py keep_mask).
- hidden sites "embedding" (layer -1; a multi-token prediction depth's embedding at its own
  layer's index, whose embedding slot is otherwise unused), "attn_out", "mlp_out": tensor
  (s, b, h), coordinates
  (sequence position, global sample index, hidden index).
- attention site "attention": tensor (b, heads, s_q, s_k), coordinates
  (global sample index, global head index, query position, key position).
The global sample index is sample_offset + column in the micro-batch. A rank's blocks draw
their hidden masks with `hidden_mask` and end in `dropout_add` (the residual); the attention
site's drawers are the attention core's (blocks/attention/core.py).
"""

from simsp.model.base import ops
from simsp.model.base.kernels import keep_mask

SITE_NAMES = ("embedding", "attention", "attn_out", "mlp_out")
HIDDEN_SITES = ("embedding", "attn_out", "mlp_out")


def site_id(layer: int, name: str) -> int:
    """Integer id of a dropout site: (layer + 1) * 4 + index of name; "embedding" is layer -1."""
    if name not in SITE_NAMES:
        raise ValueError(f"unknown dropout site {name!r} (known: {', '.join(SITE_NAMES)})")
    if (name != "embedding" and layer == -1) or layer < -1:
        raise ValueError(f"site {name!r} cannot be at layer {layer}")
    return (layer + 1) * len(SITE_NAMES) + SITE_NAMES.index(name)


def hidden_keep(p, seed, layer, name, shape, seq_start=0, sample_start=0, hidden_start=0):
    """Keep mask (s, b, h) of a hidden-dropout site for the shard starting at the given indices."""
    assert name in HIDDEN_SITES, name
    starts = (seq_start, sample_start, hidden_start)
    return keep_mask(p, seed, site_id(layer, name), starts, shape)  # (s, b, h)


def attention_keep(p, seed, layer, shape, sample_start=0, head_start=0, query_start=0):
    """Keep mask (b, heads, s_q, s_k) of the attention-probability dropout of one layer."""
    starts = (sample_start, head_start, query_start, 0)
    return keep_mask(p, seed, site_id(layer, "attention"), starts, shape)  # (b, heads, s_q, s_k)


def hidden_mask(r, spec, site: str, x):
    """Keep-mask of a hidden dropout over global (seq, sample, hidden) coordinates of x
    (s_l, b, h), a ledger tensor `{site}_mask`; None without hidden dropout."""
    p = spec.model.hidden_dropout
    if p == 0:
        return None
    starts = (r.sequence_rows(x.shape[0]), spec.sample_offset, 0)
    return ops.dropout_mask(r, p, site_id(spec.layer, site), starts, x.shape, f"{site}_mask")


def dropout_add(r, spec, x, bias, site: str, residual, out_name: str):
    """residual + dropout(x + bias) at the hidden dropout site `site`, the end of every block
    (Megatron's bias_dropout_add): x (s_l, b, h) is freed. Returns (output, mask)."""
    mask = hidden_mask(r, spec, site, x)
    out = yield from ops.bias_dropout_add(r, x, bias, mask, spec.model.hidden_dropout,
                                          residual, out_name)  # (s_l, b, h)
    r.free(x)
    return out, mask
