"""The canonical full (unsharded) GPT parameters: names, shapes, deterministic initialisation.

Megatron layout: linear weights are (in, out); the fused QKV columns are head-major,
column = head*3d + j*d + e for j in (q, k, v), so a contiguous column block holds whole heads.
The word embedding is tied to the output layer (logits = y @ word.T).
"""

import zlib

import numpy as np

LAYER_SUFFIXES = (
    "ln1.gamma", "ln1.beta", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
    "attn.proj.bias", "ln2.gamma", "ln2.beta", "mlp.fc1.weight", "mlp.fc1.bias",
    "mlp.fc2.weight", "mlp.fc2.bias",
)


def layer_param_names(i: int) -> list[str]:
    """Names of layer i's parameters, in canonical order."""
    return [f"layers.{i}.{suffix}" for suffix in LAYER_SUFFIXES]


def _layer_shapes(h: int, f: int) -> dict[str, tuple[int, ...]]:
    """Shapes of one layer's parameters keyed by suffix."""
    return {
        "ln1.gamma": (h,), "ln1.beta": (h,),
        "attn.qkv.weight": (h, 3 * h), "attn.qkv.bias": (3 * h,),
        "attn.proj.weight": (h, h), "attn.proj.bias": (h,),
        "ln2.gamma": (h,), "ln2.beta": (h,),
        "mlp.fc1.weight": (h, f), "mlp.fc1.bias": (f,),
        "mlp.fc2.weight": (f, h), "mlp.fc2.bias": (h,),
    }


def param_shapes(model) -> dict[str, tuple[int, ...]]:
    """Ordered {name: shape} of every parameter of the model."""
    h, f = model.hidden_size, model.ffn
    shapes = {"embedding.word": (model.vocab_size, h), "embedding.position": (model.seq_length, h)}
    layer = _layer_shapes(h, f)
    for i in range(model.num_layers):
        shapes.update({f"layers.{i}.{k}": layer[k] for k in LAYER_SUFFIXES})
    shapes["final_ln.gamma"] = (h,)
    shapes["final_ln.beta"] = (h,)
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
