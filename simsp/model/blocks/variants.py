"""Which attention and which MLP block a model's layer uses, chosen by the scenario.

Every attention block (attention/mha.py, attention/mla.py) and every MLP block (mlp/dense.py,
moe/layer.py) is a module with the same functions, which model/layer.py composes:
- `forward(r, spec, w, x, residual, stash)`: the norm's output x (s_l, b, h) -> residual + the
  block's output (s_l, b, h), stashing what its backward needs;
- `backward(r, spec, w, g, saved, dout)`: the gradient at the block's output -> the gradient
  at the norm's output, consuming its stashed tensors;
- `INPUT`: the name the block keeps the norm's output under; `shapes(model)`: its parameters'
  shapes by suffix, in Megatron-LM's module order;
- FLOPs as Megatron-LM counts them: `flop_terms(model)` and `core_widths(model)` (attention),
  `token_flops(model)` (MLP).
A variant that is rarely used is imported only when a model asks for it, so a dense model's
run never loads the MoE or MLA code.
"""

from simsp.model.blocks.attention import mha
from simsp.model.blocks.mlp import dense


def attention_block(model):
    """The attention block of every layer: multi-latent attention, or MHA/GQA/MQA."""
    if model.multi_latent_attention:
        from simsp.model.blocks.attention import mla  # MLA models only
        return mla
    return mha


def mlp_block(model, layer: int):
    """Layer `layer`'s MLP block: a mixture of experts (--moe-layer-freq), or the dense MLP."""
    if model.num_experts is not None and model.is_moe_layer(layer):
        from simsp.model.blocks.moe import layer as moe  # MoE layers only
        return moe
    return dense


def mlp_graph_module(model, layer: int) -> str:
    """The CUDA-graph module capturing layer `layer`'s MLP block (Megatron-LM CudaGraphModule):
    moe for a mixture of experts, mlp for the dense MLP (model/cuda_graphs.py)."""
    return "moe" if model.num_experts is not None and model.is_moe_layer(layer) else "mlp"
