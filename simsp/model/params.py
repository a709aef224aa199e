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
    """Shapes of layer i's parameters keyed by suffix, in LAYER_SUFFIXES order (a variant
    drops the suffixes it does not have; a MoE layer has a router (h, E) and E bias-free
    experts, fc1 (E, h, f) or SwiGLU (E, h, 2, f), fc2 (E, f, h), for the dense MLP)."""
    h, f, d = model.hidden_size, model.ffn, model.head_dim
    qkv = (model.num_attention_heads + 2 * model.query_groups) * d  # (a + 2G)d
    fc1 = (h, 2, f) if model.swiglu else (h, f)
    shapes = {
        "ln1.gamma": (h,), "ln1.beta": (h,),
        "attn.qkv.weight": (h, qkv), "attn.qkv.bias": (qkv,),
        "attn.proj.weight": (model.num_attention_heads * d, h), "attn.proj.bias": (h,),
        "ln2.gamma": (h,), "ln2.beta": (h,),
        "mlp.fc1.weight": fc1, "mlp.fc1.bias": fc1[1:],
        "mlp.fc2.weight": (f, h), "mlp.fc2.bias": (h,),
    }
    dropped = (("ln1.beta", "ln2.beta") if model.normalization == "RMSNorm" else ()) + \
        (() if model.add_bias_linear else tuple(k for k in shapes if k.endswith(".bias")))
    if model.multi_latent_attention:
        shapes = _mla_shapes(model, shapes)
    if model.is_moe_layer(i):
        return _moe_layer_shapes(model, {k: v for k, v in shapes.items() if k not in dropped})
    return {k: v for k, v in shapes.items() if k not in dropped}


def _mla_shapes(model, shapes: dict) -> dict:
    """The fused QKV replaced by multi-latent attention's projections (Megatron-LM
    multi_latent_attention.py MLASelfAttention, module order): q down (h, r_q), its RMSNorm,
    q up (r_q, a·(d_n + d_r)) head-major [nope | rope] per head, kv down (h, r_kv + d_r) with
    the shared RoPE key last, its RMSNorm over r_kv, kv up (r_kv, a·(d_n + d_v)) head-major
    [k nope | v] per head; the output projection reads a·d_v. Without --q-lora-rank one query
    projection (h, a·(d_n + d_r)) replaces q down, its norm and q up (linear_q_proj)."""
    h, a = model.hidden_size, model.num_attention_heads
    dn, dr, dv = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
    rq, rkv = model.q_lora_rank, model.kv_lora_rank
    out = {}
    for name, shape in shapes.items():
        if name.startswith("attn.qkv."):
            continue
        if name == "attn.proj.weight":
            out.update({"attn.q_proj.weight": (h, a * (dn + dr))} if rq is None else
                       {"attn.q_down.weight": (h, rq), "attn.q_norm.gamma": (rq,),
                        "attn.q_up.weight": (rq, a * (dn + dr))})
            out.update({"attn.kv_down.weight": (h, rkv + dr), "attn.kv_norm.gamma": (rkv,),
                        "attn.kv_up.weight": (rkv, a * (dn + dv))})
            shape = (a * dv, h)
        out[name] = shape
    return out


def _moe_layer_shapes(model, shapes: dict) -> dict:
    """The dense MLP's weights replaced by the router's and the experts'."""
    h, f, E = model.hidden_size, model.moe_ffn, model.num_experts
    kept = {k: v for k, v in shapes.items() if not k.startswith("mlp.")}
    kept["mlp.router.weight"] = (h, E)
    kept["mlp.experts.fc1.weight"] = (E, h, 2, f) if model.swiglu else (E, h, f)
    kept["mlp.experts.fc2.weight"] = (E, f, h)
    shared = model.moe_shared_expert_intermediate_size  # --moe-shared-expert-intermediate-size
    if shared:
        kept["mlp.shared_experts.fc1.weight"] = (h, 2, shared) if model.swiglu else (h, shared)
        kept["mlp.shared_experts.fc2.weight"] = (shared, h)
    return kept


def mtp_shapes(model) -> dict[str, tuple[int, ...]]:
    """The multi-token prediction depths' own parameters, `mtp.{k}.` each, in Megatron-LM's
    MultiTokenPredictionLayer order (multi_token_prediction.py): enorm, hnorm, eh_proj (2h, h)
    reading [embedding | hidden], a transformer layer built as the last layer (`layer.`), and
    final_ln; the embedding and output layer are the model's own (docs/mtp.md)."""
    h, shapes = model.hidden_size, {}
    norm = ("gamma",) if model.normalization == "RMSNorm" else ("gamma", "beta")
    for k in range(model.mtp_num_layers or 0):
        prefix = f"mtp.{k}."
        shapes.update({f"{prefix}{name}.{p}": (h,) for name in ("enorm", "hnorm") for p in norm})
        shapes[f"{prefix}eh_proj.weight"] = (2 * h, h)
        shapes.update({f"{prefix}layer.{suffix}": shape
                       for suffix, shape in layer_shapes(model, model.num_layers + k).items()})
        shapes.update({f"{prefix}final_ln.{p}": (h,) for p in norm})
    return shapes


def param_shapes(model) -> dict[str, tuple[int, ...]]:
    """Ordered {name: shape} of every parameter of the model (Megatron's module order)."""
    h = model.hidden_size
    shapes = {"embedding.word": (model.vocab_size, h)}
    if model.position_embedding_type == "learned_absolute":
        shapes["embedding.position"] = (model.seq_length, h)
    for i in range(model.num_layers):
        shapes.update({f"layers.{i}.{k}": shape for k, shape in layer_shapes(model, i).items()})
    shapes["final_ln.gamma"] = (h,)
    if model.normalization != "RMSNorm":
        shapes["final_ln.beta"] = (h,)
    shapes.update(mtp_shapes(model))
    if model.untie_embeddings_and_output_weights:
        shapes["output.weight"] = (model.vocab_size, h)
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
