"""The canonical full (unsharded) GPT parameters: names, shapes, deterministic initialisation.

Megatron layout: linear weights are (in, out); the fused QKV columns are group-major, each of the
G KV groups holding its a/G query heads, then its key, then its value head (Megatron-LM
megatron/core/transformer/attention.py SelfAttention.get_query_key_value_tensors), so a
contiguous column block holds whole groups; with G = a (GPT) column = head*3d + j*d + e for j in
(q, k, v). The SwiGLU fc1 is (h, 2, f): gate then up, split over TP along f, so each rank's
(h, 2f/t) block is [gate | up] as Megatron's chunked swiglu reads it. The word embedding is
tied to the output layer (logits = y @ word.T) unless an `output.weight` (v, h) of its own is
untied. Absent in a variant: LN betas (RMSNorm), biases (--disable-bias-linear), position table
(rope, none).
"""

import zlib

import numpy as np

from simsp.model.blocks.embedding import shapes as embedding_shapes
from simsp.model.blocks.head import output_shapes
from simsp.model.blocks.norm import shapes as norm_shapes
from simsp.model.blocks.variants import attention_block, mlp_block

LAYER_SUFFIXES = (
    "ln1.gamma", "ln1.beta", "attn.qkv.weight", "attn.qkv.bias", "attn.q_proj.weight",
    "attn.q_down.weight", "attn.q_norm.gamma", "attn.q_up.weight",  # multi-latent attention
    "attn.kv_down.weight", "attn.kv_norm.gamma", "attn.kv_up.weight", "attn.proj.weight",
    "attn.proj.bias", "ln2.gamma", "ln2.beta", "mlp.fc1.weight", "mlp.fc1.bias",
    "mlp.fc2.weight", "mlp.fc2.bias",
    "mlp.router.weight", "mlp.experts.fc1.weight", "mlp.experts.fc2.weight",  # MoE layers
    "mlp.shared_experts.fc1.weight", "mlp.shared_experts.fc2.weight",  # their shared experts
)


def layer_param_names(i: int) -> list[str]:
    """Names of layer i's parameters, in canonical order."""
    return [f"layers.{i}.{suffix}" for suffix in LAYER_SUFFIXES]


def layer_shapes(model, i: int = 0) -> dict[str, tuple[int, ...]]:
    """Shapes of layer i's parameters keyed by suffix, in LAYER_SUFFIXES order: LN1, its
    attention block's, LN2, its MLP block's (blocks/variants.py picks them; each block's
    `shapes` says what a variant has)."""
    attention, mlp = attention_block(model), mlp_block(model, i)
    return {**norm_shapes(model, "ln1"), **attention.shapes(model), **norm_shapes(model, "ln2"),
            **mlp.shapes(model)}


def mtp_shapes(model) -> dict[str, tuple[int, ...]]:
    """The multi-token prediction depths' own parameters, `mtp.{k}.` each, in Megatron-LM's
    MultiTokenPredictionLayer order (multi_token_prediction.py): enorm, hnorm, eh_proj (2h, h)
    reading [embedding | hidden], a transformer layer built as the last layer (`layer.`), and
    final_ln; the embedding and output layer are the model's own (docs/mtp.md)."""
    h, shapes = model.hidden_size, {}
    for k in range(model.mtp_num_layers or 0):
        prefix = f"mtp.{k}."
        shapes.update({**norm_shapes(model, f"{prefix}enorm"),
                       **norm_shapes(model, f"{prefix}hnorm")})
        shapes[f"{prefix}eh_proj.weight"] = (2 * h, h)
        shapes.update({f"{prefix}layer.{suffix}": shape
                       for suffix, shape in layer_shapes(model, model.num_layers + k).items()})
        shapes.update(norm_shapes(model, f"{prefix}final_ln"))
    return shapes


def param_shapes(model) -> dict[str, tuple[int, ...]]:
    """Ordered {name: shape} of every parameter of the model (Megatron's module order)."""
    shapes = embedding_shapes(model)
    for i in range(model.num_layers):
        shapes.update({f"layers.{i}.{k}": shape for k, shape in layer_shapes(model, i).items()})
    shapes.update(norm_shapes(model, "final_ln"))
    shapes.update(mtp_shapes(model))
    shapes.update(output_shapes(model))
    return shapes


def _init_one(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """One parameter from its own generator (seed, crc32(name)): independent of the others."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if name.endswith("gamma"):
        return 1.0 + rng.normal(0.0, 0.1, shape)  # near 1, not exactly, so gradients see it
    # weights: GPT-2 / Megatron init_method_normal(0.02); biases and betas small but nonzero
    return rng.normal(0.0, 0.02, shape)


def init_params(model, seed: int, dtype=np.float64) -> dict[str, np.ndarray]:
    """Deterministic {name: array} for every parameter; each array depends only on (seed, name)."""
    return {name: _init_one(name, shape, seed).astype(dtype)
            for name, shape in param_shapes(model).items()}
