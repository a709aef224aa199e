"""One pre-LN transformer layer on one tensor-parallel rank: the composer of its blocks, read as
Megatron-LM's TransformerLayer.forward (megatron/core/transformer/transformer_layer.py) and
nanoGPT's Block.forward:

    h   = x + attention(ln1(x))
    out = h + mlp(ln2(h))

then the mirrored backward. The blocks (simsp/model/blocks/) hold their forward, backward,
saved-tensor table, parameter shapes and FLOPs; blocks/variants.py picks them by the scenario
(MHA/GQA/MQA or multi-latent attention; the dense MLP or a mixture of experts). Each block
ends in its output's dropout and the residual add (Megatron's bias_dropout_add), so a block
returns the residual stream. Column-parallel QKV and fc1, row-parallel output projection and
fc2 (N21 §2.3); with SP the norm and dropout regions hold an s/t slice of the sequence
(K22 §4.2.2).

Kept for backward, besides each block's own (the tables in blocks/attention/core.py and
mha.py, blocks/mlp/dense.py, blocks/attention/mla.py, blocks/moe/):

| name                       | shape (per rank)      | bytes          |
|----------------------------|-----------------------|----------------|
| ln1_input                  | (s_l, b, h)           | 2sbh  (/t SP)  |
| ln2_input                  | (s_l, b, h)           | 2sbh  (/t SP)  |
s_l = s/t under SP, else s; docs/MODEL.md#activation-memory has K22's whole-layer table.
Selective recompute (--recompute-modules) drops what its modules name and the blocks rebuild
it in backward; full recompute keeps only `layer_input` and re-runs this forward.
"""

from dataclasses import dataclass

from simsp.model.base import ops
from simsp.model.base.stash import Stash, recomputing
from simsp.model.blocks.norm import norm, norm_backward
from simsp.model.blocks.variants import attention_block, mlp_block, mlp_graph_module
from simsp.model.cuda_graphs import captured
from simsp.scenario.config import Model


@dataclass(frozen=True)
class LayerSpec:
    """What one layer instance needs beyond its weights."""

    model: Model
    layer: int  # global layer index: names dropout sites
    recompute: str  # none | selective | full
    sample_offset: int = 0  # global index of this micro-batch's first sample
    modules: frozenset = frozenset(("core_attn",))  # selective: Megatron's --recompute-modules
    aux_scale: float = 1.0  # MoE aux loss gradient: b/B (1/micro-batches, DP-averaged)
    gradient_factor: int = 1  # d·cp when the DP collective averages (training/data_parallel/
    # grad_scaling.py): the aux loss gradient is the replica's, as the main loss's

    def recomputes(self, module: str) -> bool:
        """Whether selective recompute rebuilds `module` (core_attn, mlp, layernorm) in backward."""
        return self.recompute == "selective" and module in self.modules


def layer_forward(r, spec: LayerSpec, w: dict, x, keep: bool = True):
    """x (s_l, b, h) -> (s_l, b, h). Returns (output, stash of tensors kept for backward).
    Each region a CUDA graph captures runs as one replay (model/cuda_graphs.py)."""
    m = spec.model
    attention, mlp = attention_block(m), mlp_block(m, spec.layer)
    stash = Stash(r, keep)
    if keep:
        stash.put("ln1_input", x)
    with captured(r, "layer"):
        with captured(r, "attn"):
            y1 = yield from norm(r, m, x, w, "ln1", "ln1_output",
                                 _cast_fused(r, attention))  # ln1(x)
            h = yield from attention.forward(r, spec, w, y1, x, stash)  # x + attention(ln1(x))
        stash.put("ln2_input", h)
        with captured(r, mlp_graph_module(m, spec.layer)):
            y2 = yield from norm(r, m, h, w, "ln2", mlp.INPUT, _cast_fused(r, mlp))  # ln2(h)
            out = yield from mlp.forward(r, spec, w, y2, h, stash)  # h + mlp(ln2(h))
    if not keep:
        stash.release()
    return out, stash.tensors


def _cast_fused(r, block) -> bool:
    """Under FP8, whether the norm before `block` writes the FP8 input of its first linear
    (the block's LAYERNORM_LINEAR: Transformer Engine's LayerNormLinear; MLA's and MoE's norms
    are TENorm, a kernel of their own)."""
    return r.fp8 is not None and getattr(block, "LAYERNORM_LINEAR", False)


def layer_backward(r, spec: LayerSpec, w: dict, g: dict, saved: dict, dout):
    """dout (s_l, b, h) -> dx (s_l, b, h); frees every saved tensor as backward consumes it.

    Full recompute first re-runs the forward from the kept `layer_input`, saving as usual."""
    m = spec.model
    attention, mlp = attention_block(m), mlp_block(m, spec.layer)
    if spec.recompute == "full":
        layer_input = saved.pop("layer_input")
        with recomputing(r):
            out, saved = yield from layer_forward(r, spec, w, layer_input, keep=True)
            r.free(out)
    saved = dict(saved)
    with captured(r, "layer"):
        with captured(r, mlp_graph_module(m, spec.layer)):
            dy2 = yield from mlp.backward(r, spec, w, g, saved, dout)  # d ln2(h)
            dh = yield from _residual_backward(r, m, w, g, saved, dy2, dout, "ln2", mlp.INPUT,
                                               "d_residual")  # dout + d ln2 · dy2
        with captured(r, "attn"):
            dy1 = yield from attention.backward(r, spec, w, g, saved, dh)  # d ln1(x)
            dx = yield from _residual_backward(r, m, w, g, saved, dy1, dh, "ln1",
                                               attention.INPUT,
                                               "d_layer_input")  # dh + d ln1 · dy1
    assert not saved, f"saved tensors left after backward: {sorted(saved)}"
    return dx


def _residual_backward(r, m, w: dict, g: dict, saved: dict, dy, dout, prefix: str,
                       block_input: str, name: str):
    """The gradient at the residual stream before a block: dout (s_l, b, h) plus the norm's
    backward of dy (at the norm's output) at its kept input `{prefix}_input`. Frees dy, dout,
    the norm's input, and its output where the block kept it this long (MoE's moe_input)."""
    dln = yield from norm_backward(r, m, dy, saved[f"{prefix}_input"], w, g, prefix,
                                   f"d_{prefix}_input")
    r.free(dy, saved.pop(block_input, None), saved.pop(f"{prefix}_input"))
    dres = yield from ops.add(r, dout, dln, name)
    r.free(dout, dln)
    return dres
