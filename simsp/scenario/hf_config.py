"""A Hugging Face config.json (`--hf-config`) read into the [model] section: Llama 2/3, Mistral,
Mixtral, Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE and DeepSeek-V3 (README "Start from your own
launch line").

Each key's meaning is that of transformers' src/transformers/models/<family>/configuration_<family>.py
(LlamaConfig, MistralConfig, MixtralConfig, Qwen2Config, Qwen2MoeConfig, Qwen3Config,
Qwen3MoeConfig, DeepseekV3Config); the column `source` of each row names the families whose
configuration file defines it. All these families use a gated SiLU MLP (SwiGLU), RMSNorm, RoPE
and no dropout on the residual stream; biases: Qwen2's q/k/v bias is not modelled (the other
linears have none), so add_bias_linear is false for every family.
"""

import json
import math
from typing import NamedTuple

from simsp import io_in
from simsp.errors import UserError

FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
            "deepseek_v3")
_ALL = "all"  # every family above


class Key(NamedTuple):
    """One config.json key read into one [model] field: its type, whether it must be there,
    and the configuration_*.py files that define it."""

    hf: str
    field: str
    kind: type
    required: bool
    source: str


KEYS = (
    Key("hidden_size", "hidden_size", int, True, _ALL),
    Key("num_hidden_layers", "num_layers", int, True, _ALL),
    Key("num_attention_heads", "num_attention_heads", int, True, _ALL),
    Key("intermediate_size", "ffn_hidden_size", int, True, _ALL),
    Key("vocab_size", "vocab_size", int, True, _ALL),
    Key("rope_theta", "rotary_base", int, False, _ALL),
    Key("rms_norm_eps", "norm_epsilon", float, False, _ALL),
    Key("attention_dropout", "attention_dropout", float, False, _ALL),
    Key("head_dim", "kv_channels", int, False, "llama, mistral, qwen3, qwen3_moe"),
    Key("num_experts_per_tok", "moe_router_topk", int, False,
        "mixtral, qwen2_moe, qwen3_moe, deepseek_v3"),
    Key("moe_intermediate_size", "moe_ffn_hidden_size", int, False,
        "qwen2_moe, qwen3_moe, deepseek_v3"),
    Key("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size", int, False,
        "qwen2_moe"),
    Key("scoring_func", "moe_router_score_function", str, False, "deepseek_v3"),
    Key("num_nextn_predict_layers", "mtp_num_layers", int, False, "deepseek_v3 (config.json)"),
    Key("q_lora_rank", "q_lora_rank", int, False, "deepseek_v3"),
    Key("kv_lora_rank", "kv_lora_rank", int, False, "deepseek_v3"),
    Key("qk_nope_head_dim", "qk_head_dim", int, False, "deepseek_v3"),
    Key("qk_rope_head_dim", "qk_pos_emb_head_dim", int, False, "deepseek_v3"),
    Key("v_head_dim", "v_head_dim", int, False, "deepseek_v3"),
)
# the routed experts' count, under each family's name for it
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")  # mixtral; qwen*_moe; deepseek_v3
# what every family fixes (the module docstring says why)
FIXED = {"swiglu": True, "normalization": "RMSNorm", "position_embedding_type": "rope",
         "add_bias_linear": False, "hidden_dropout": 0.0}


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def read_config(path) -> dict:
    """The config.json as a dict (simsp.io_in: size-capped; every problem one UserError)."""
    text = io_in.read_text(path, "hf-config")
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise UserError(str(path), f"is not valid JSON: {str(exc) or 'nested too deeply'}") from None
    if not isinstance(data, dict):
        raise UserError(str(path), "must be a JSON object (a Hugging Face config.json)")
    family = data.get("model_type")
    if family not in FAMILIES:
        raise UserError(f"{path}: model_type", f"{family!r} is not one simsp reads (known: "
                                               f"{', '.join(FAMILIES)})")
    return data


def _value(path, data: dict, key: Key):
    """data[key.hf] checked against the key's type (a whole float is taken as an int)."""
    value = data[key.hf]
    where = f"{path}: {key.hf}"
    if key.kind is str:
        if not isinstance(value, str):
            raise UserError(where, f"must be text, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(where, f"must be a number, got {value!r}")
    if key.kind is int:
        if not (isinstance(value, int) or (math.isfinite(value) and value == int(value))):
            raise UserError(where, f"must be a whole number, got {value!r}")
        return int(value)
    return float(value)


def _activation(path, data: dict) -> None:
    """Every family here gates with SiLU; refuse another hidden_act rather than misread it."""
    act = data.get("hidden_act", "silu")
    if act != "silu":
        raise UserError(f"{path}: hidden_act", f"{act!r}: simsp reads only the SiLU-gated MLP "
                                               "(SwiGLU) of these families")


def hf_fields(path) -> tuple[dict, int | None]:
    """({[model] field: value}, max_position_embeddings) of a config.json."""
    data = read_config(path)
    _activation(path, data)
    fields = dict(FIXED)
    for key in KEYS:
        if key.required and key.hf not in data:
            raise UserError(f"{path}: {key.hf}", "missing (a Hugging Face config has it)")
        if data.get(key.hf) is not None:
            fields[key.field] = _value(path, data, key)
    fields.update(_attention_fields(path, data, fields))
    fields.update(_moe_fields(path, data, fields))
    if "max_position_embeddings" in data:
        return fields, _value(path, data, Key("max_position_embeddings", "", int, False, _ALL))
    return fields, None


def _attention_fields(path, data: dict, fields: dict) -> dict:
    """GQA from num_key_value_heads, MLA when kv_lora_rank is set, the tied embedding."""
    found = {"untie_embeddings_and_output_weights": not data.get("tie_word_embeddings", False)}
    if not isinstance(found["untie_embeddings_and_output_weights"], bool):
        raise UserError(f"{path}: tie_word_embeddings", "must be true or false")
    if "kv_lora_rank" in fields:
        found["multi_latent_attention"] = True
        return found
    kv = data.get("num_key_value_heads")
    if kv is not None:
        kv = _value(path, data, Key("num_key_value_heads", "", int, False, _ALL))
        if kv != fields["num_attention_heads"]:
            found.update(group_query_attention=True, num_query_groups=kv)
    return found


def _int(path, data: dict, name: str) -> int:
    """data[name] as a whole number (one UserError naming the key otherwise)."""
    return _value(path, data, Key(name, "", int, False, _ALL))


def _moe_fields(path, data: dict, fields: dict) -> dict:
    """The expert count, the shared experts and which layers are MoE layers."""
    found = {}
    for name in EXPERT_COUNT_KEYS:
        if data.get(name):
            found["num_experts"] = _int(path, data, name)
    if "num_experts" not in found:
        return found
    if data.get("n_shared_experts"):
        if "moe_ffn_hidden_size" not in fields:
            raise UserError(f"{path}: moe_intermediate_size", "missing (n_shared_experts needs it)")
        found["moe_shared_expert_intermediate_size"] = (
            _int(path, data, "n_shared_experts") * fields["moe_ffn_hidden_size"])
    pattern = _moe_layers(path, data, fields["num_layers"])
    if pattern is not None:
        found["moe_layer_freq"] = pattern
    return found


def _moe_layers(path, data: dict, layers: int) -> str | None:
    """Megatron's --moe-layer-freq pattern of which layers are MoE layers, None when all are:
    DeepseekV3DecoderLayer's `i >= first_k_dense_replace and i % moe_layer_freq == 0`,
    Qwen*MoeDecoderLayer's `i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0`
    (transformers' modeling_deepseek_v3.py, modeling_qwen2_moe.py, modeling_qwen3_moe.py)."""
    first = _int(path, data, "first_k_dense_replace") if data.get("first_k_dense_replace") else 0
    every = _int(path, data, "moe_layer_freq") if data.get("moe_layer_freq") else 1
    step = _int(path, data, "decoder_sparse_step") if data.get("decoder_sparse_step") else 1
    dense = data.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) for i in dense):
        raise UserError(f"{path}: mlp_only_layers", "must be a list of layer numbers")
    if not 0 <= first < layers or every < 1 or step < 1:
        raise UserError(f"{path}: first_k_dense_replace", f"must be below num_hidden_layers "
                                                          f"({layers}), with positive steps")
    sparse = [i >= first and i % every == 0 and (i + 1) % step == 0 and i not in dense
              for i in range(layers)]
    if all(sparse):
        return None
    if sparse == [i >= first for i in range(layers)]:
        return f"([0]*{first}+[1]*{layers - first})"
    return "[" + ",".join("1" if moe else "0" for moe in sparse) + "]"


def hf_overrides(path) -> tuple[dict, dict]:
    """({("model", field): value} overrides, {("model", "seq_length"): N} used only where no
    scenario file, flag or launch line gives the sequence length)."""
    fields, positions = hf_fields(path)
    fallback = {} if positions is None else {("model", "seq_length"): positions}
    return {("model", key): value for key, value in fields.items()}, fallback
