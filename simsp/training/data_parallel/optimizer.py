"""Mixed-precision Adam (K22 §4: 18 bytes per parameter): fp16 weights, fp32 main gradients,
fp32 master weights and Adam moments m, v — optionally sharded over DP (distributed optimizer)."""

from dataclasses import dataclass

import numpy as np

from simsp.model.fp8 import weight_cast_bytes
from simsp.scenario.precision import DEFAULT

ADAM_LR, ADAM_BETAS, ADAM_EPS = 1e-3, (0.9, 0.999), 1e-8
STATE_TENSORS = ("master", "adam_m", "adam_v")  # fp32 each: 12 bytes per parameter


@dataclass
class AdamState:
    """One rank's optimizer tensors, keyed like its weights."""

    tensors: dict  # (state name, param name) -> Tensor


def allocate_optimizer(r, weights: dict, shard_over: int = 1,
                       expert_shard_over: int | None = None) -> AdamState:
    """fp32 master weights and Adam moments; 1/shard_over of each with the distributed optimizer
    (expert weights: 1/expert_shard_over, their EDP group, when given)."""
    tensors = {}
    experts = _expert_names(weights) if expert_shard_over else frozenset()
    for name, weight in weights.items():
        over = expert_shard_over if name in experts else shard_over
        numel = -(-weight.numel // over)
        for state in STATE_TENSORS:
            data = None
            if r.numeric:
                data = weight.data.reshape(-1).copy() if state == "master" else np.zeros(
                    weight.numel, dtype=r.dtype)
            tensors[(state, name)] = r.alloc((numel,), r.precision.state(state),
                                             f"{state}.{name}", "optimizer",
                                             data if over == 1 else None)
    return AdamState(tensors)


def _expert_names(weights: dict) -> frozenset:
    """The expert weights among `weights` (the MoE code is imported only for a model with
    experts)."""
    from simsp.model.blocks.moe.placement import is_expert_param
    return frozenset(filter(is_expert_param, weights))


def adam_step(r, state: AdamState, weights: dict, grads: dict, step: int = 1):
    """One Adam update of the master weights, copied back to the fp16 weights (Kingma & Ba)."""
    b1, b2 = ADAM_BETAS
    numel = 0
    for name, weight in weights.items():
        numel += state.tensors[("master", name)].numel
        if not r.numeric or state.tensors[("master", name)].data is None:
            continue
        g = grads[name].data.reshape(-1)  # (n,)
        m, v = state.tensors[("adam_m", name)], state.tensors[("adam_v", name)]
        master = state.tensors[("master", name)]
        m.data = b1 * m.data + (1 - b1) * g
        v.data = b2 * v.data + (1 - b2) * g * g
        m_hat, v_hat = m.data / (1 - b1 ** step), v.data / (1 - b2 ** step)
        master.data = master.data - ADAM_LR * m_hat / (np.sqrt(v_hat) + ADAM_EPS)
        weight.data = master.data.reshape(weight.shape).astype(weight.data.dtype)
    # reads grad, master, m, v (4 B each) and writes master, m, v (4 B) and the fp16 weight (2 B)
    nbytes = _adam_bytes_per_param(r) * numel + _wider_grad_bytes(r, state, weights)
    yield from r.compute("adam_step", "elementwise", nbytes=nbytes)
    if r.fp8 is not None:  # TE quantizes each weight once per iteration (simsp/model/fp8.py)
        yield from r.compute("fp8_weight_cast", "elementwise",
                             nbytes=weight_cast_bytes(r, weights))


def _adam_bytes_per_param(r) -> int:
    """Read the main gradient, master, m and v; write master, m, v and the 2-byte weight. With
    --store-param-remainders the master is the 2-byte remainder, and the step also reads the
    BF16 weight it completes (NVIDIA/apex apex/contrib/csrc/optimizers/
    multi_tensor_distopt_adam_kernel.cu, the remainder functor: reads and writes the 16-bit
    parameter and remainder)."""
    if r.precision is DEFAULT:
        return 30
    states = sum(r.precision.state(s) for s in STATE_TENSORS)
    weight_read = 2 if r.precision.param_remainders else 0
    return r.precision.main_grad_bytes + 2 * states + 2 + weight_read


def _wider_grad_bytes(r, state: AdamState, weights: dict) -> int:
    """Bytes the rank's shard of fp32-gradient parameters (Apex's embeddings:
    Precision.fp32_grads) reads beyond the main-gradient width."""
    return sum((r.precision.grad_bytes(name) - r.precision.main_grad_bytes)
               * state.tensors[("master", name)].numel for name in weights)


def zero_grad_buffer(r, grads: dict):
    """Megatron's train_step zeroes every model chunk's gradient buffer before the forward
    (megatron/training/training.py `model_chunk.zero_grad_buffer()`; param_and_grad_buffer.py
    `reset`: `self.grad_data.zero_()`; Megatron-FSDP's its own buffer, megatron_fsdp.py; the
    torch FSDP2 wrapper none, data_parallel_base.py `pass`): one fill kernel writing the
    rank's main gradients."""
    nbytes = sum(grad.nbytes for grad in grads.values())
    yield from r.compute("zero_grad_buffer", "elementwise", nbytes=nbytes)


def grad_norm(r, optimizer: AdamState, weights: dict):
    """The L2 norm of the main gradients this rank's optimizer steps, before the step
    (Megatron's default --clip-grad 1.0: megatron/core/optimizer/optimizer.py `clip_grad_norm`,
    clip_grads.py `get_grad_norm_fp32`: multi_tensor_l2norm reads each gradient once). The
    scaling by the clip coefficient runs only when the norm exceeds the threshold, which a
    timing model cannot know; it is not timed, nor the norm's all-reduce of one float."""
    numel = sum(optimizer.tensors[("master", name)].numel for name in weights)
    nbytes = r.precision.main_grad_bytes * numel + _wider_grad_bytes(r, optimizer, weights)
    yield from r.compute("grad_norm", "elementwise", nbytes=nbytes)


def optimizer_step(r, optimizer: AdamState, weights: dict, grads: dict):
    """The gradient norm and the Adam step; their time is the iteration's optimizer share
    (metrics.timing.exposure)."""
    start = r.env.now
    yield from grad_norm(r, optimizer, weights)
    yield from adam_step(r, optimizer, weights, grads)
    r.count_exposed("optimizer", r.env.now - start)


def chained_step(r, optimizer: AdamState, weights: dict, grads: dict, ddp):
    """--overlap-param-gather-with-optimizer-step (megatron/core/optimizer/optimizer.py
    ChainedOptimizer._step at d98e8a64): the first model chunk's dense parameters step, then
    that chunk's all-gathers are issued on the DP stream, then the other chunks' (and the
    experts') step beside them; the iteration ends when the step and those gathers are done
    (training/data_parallel/grad_buckets.py DDPBuckets)."""
    first = ddp.first_chunk_dense()
    start = r.env.now
    yield from grad_norm(r, optimizer, weights)  # over every chunk, before any step
    yield from adam_step(r, optimizer, {n: w for n, w in weights.items() if n in first}, grads)
    gathers = ddp.gather_first_chunk(r)
    yield from adam_step(r, optimizer, {n: w for n, w in weights.items() if n not in first},
                         grads)
    r.count_exposed("optimizer", r.env.now - start)
    yield from ddp.wait_first_chunk(r, gathers)
