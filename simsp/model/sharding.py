"""How each canonical parameter is split over a tensor-parallel group (Megatron-LM, N21 §2.3).

Column-parallel weights split their output columns, row-parallel weights their input rows, the
vocabulary-parallel embedding its rows; everything else is replicated on every TP rank.
"""

import numpy as np

# parameter-name suffix -> axis split across TP ranks (None: replicated)
# (column parallel splits the last axis: the output columns, or f of SwiGLU's (h, 2, f) fc1)
SPLIT_AXIS = {
    "attn.qkv.weight": -1, "attn.qkv.bias": -1,  # column parallel (group-major columns)
    "attn.q_up.weight": -1, "attn.kv_up.weight": -1,  # MLA up projections: column parallel
    "attn.q_proj.weight": -1,  # MLA's query projection without a latent: column parallel
    "eh_proj.weight": -1,  # multi-token prediction's projection: column parallel
    "attn.proj.weight": 0,  # row parallel
    "mlp.fc1.weight": -1, "mlp.fc1.bias": -1,  # column parallel
    "mlp.fc2.weight": 0,  # row parallel
    "shared_experts.fc1.weight": -1, "shared_experts.fc2.weight": 0,  # MoE shared experts
    "embedding.word": 0,  # vocabulary parallel
    "output.weight": 0,  # vocabulary parallel (untied output layer)
}
# Replicated parameters whose gradients are partial per rank under SP (they act on a sequence
# shard), so the TP group all-reduces them (Megatron-LM finalize_model_grads).
SP_PARTIAL_SUFFIXES = ("embedding.position", "ln1.gamma", "ln1.beta", "ln2.gamma", "ln2.beta", "attn.proj.bias",
                       "mlp.fc2.bias", "final_ln.gamma", "final_ln.beta",
                       # MLA's down projections and latent norms: replicated over TP
                       # (Megatron's "duplicated" TELinear marks them sequence_parallel)
                       "attn.q_down.weight", "attn.kv_down.weight", "attn.q_norm.gamma",
                       "attn.kv_norm.gamma",
                       "enorm.gamma", "enorm.beta", "hnorm.gamma", "hnorm.beta",  # MTP's norms
                       "mlp.router.weight")  # the MoE router routes a sequence shard


def split_axis(name: str) -> int | None:
    """The TP split axis of a parameter, by the suffix of its canonical name."""
    for suffix, axis in SPLIT_AXIS.items():
        if name.endswith(suffix):
            return axis
    return None


def local_shape(name: str, shape: tuple, t: int) -> tuple:
    """The shape of one TP rank's shard."""
    axis = split_axis(name)
    if axis is None:
        return tuple(shape)
    out = list(shape)
    out[axis] //= t
    return tuple(out)


def shard(name: str, array: np.ndarray, index: int, t: int) -> np.ndarray:
    """TP rank `index`'s contiguous block of a canonical parameter."""
    axis = split_axis(name)
    if axis is None:
        return array.copy()
    return np.array_split(array, t, axis=axis)[index].copy()


def unshard(name: str, shards: list[np.ndarray]) -> np.ndarray:
    """Reassemble a canonical parameter (or gradient) from its TP shards."""
    axis = split_axis(name)
    if axis is None:
        return shards[0].copy()
    return np.concatenate(shards, axis=axis)


def needs_sp_grad_sync(name: str) -> bool:
    return name.endswith(SP_PARTIAL_SUFFIXES)
