"""--fp8-param-gather in the distributed optimizer's parameter all-gather
(simsp/training/data_parallel/grad_buckets.py): FP8 parameters live in a buffer of their own
(Megatron-LM distributed_data_parallel.py _allocate_buffers_for_parameters, torch.uint8) and are
gathered at 1 byte per element; everything else stays a 2-byte BF16 buffer. Hand-counted."""

from simsp.engine.group_timing import RING_ALONE, EveryGroup
from simsp.model.params import param_shapes
from simsp.model.tensor import FP32, Tensor
from simsp.scenario.loading import load_scenario
from simsp.training.data_parallel.grad_buckets import DDPBuckets
from simsp.training.driver.world import build_world
from simsp.training.pipeline.plan import stage_plans

H, L, V, S = 64, 2, 256, 32  # hidden, layers, vocabulary, sequence
PAD = 128  # Megatron pads each bucket to lcm(DP, 128) elements (d = 2)


def _sync(fp8_param_gather: bool):
    """One H100 rank of d = 2 with the distributed optimizer, one bucket per buffer."""
    overrides = {("model", "num_layers"): L, ("model", "hidden_size"): H,
                 ("model", "num_attention_heads"): 4, ("model", "seq_length"): S,
                 ("model", "vocab_size"): V, ("run", "mode"): "meta",
                 ("cluster", "system"): "dgx-h100", ("parallel", "data_parallel_size"): 2,
                 ("parallel", "global_batch_size"): 2, ("parallel", "distributed_optimizer"): True,
                 ("parallel", "fp8_format"): "hybrid",
                 ("parallel", "fp8_param_gather"): fp8_param_gather}
    sc = load_scenario(None, overrides)
    world = build_world(sc, simulated=[0], timing_of=EveryGroup(RING_ALONE))
    plan = stage_plans(sc, world.grid)[0]
    grads = {n: Tensor.meta(shape, FP32, n) for n, shape in param_shapes(sc.model).items()}
    return world, DDPBuckets(world.ranks[0], sc.parallel, world.grid, plan, grads)


def _padded(numel: int) -> int:
    return -(-numel // PAD) * PAD


def _hand_numels() -> tuple[int, int]:
    """(FP8 linear weights, everything else) of the GPT model by hand: per layer qkv 3h·h,
    proj h·h, fc1 4h·h, fc2 4h·h; biases 3h + h + 4h + h, two LayerNorms 2·2h; embedding
    V·h (tied head) + S·h positions; final LayerNorm 2h."""
    linear = L * (3 + 1 + 4 + 4) * H * H
    rest = L * (3 * H + H + 4 * H + H + 4 * H) + V * H + S * H + 2 * H
    return linear, rest


def _gathered_bytes(world, sync) -> int:
    """Bytes rank 0 sends in the step's all-gathers (ring: (d-1)/d of the gathered bytes)."""
    r = world.ranks[0]
    world.env.process(sync.gather_params(r))
    world.env.run()
    return sum(n for (_, kind), n in r.comm_bytes.items() if kind == "all_gather_dp")


def test_fp8_parameters_get_their_own_buffer_gathered_at_one_byte():
    linear, rest = _hand_numels()
    _, sync = _sync(True)
    by_bytes = {b.param_bytes: b.numel for b in sync.buckets}
    assert by_bytes == {1: _padded(linear), 2: _padded(rest)}
    assert all(n.startswith("layers.") and n.endswith(("qkv.weight", "proj.weight",
                                                       "fc1.weight", "fc2.weight"))
               for b in sync.buckets if b.param_bytes == 1 for n in b.names)


def test_fp8_param_all_gather_sends_half_the_bf16_bytes_of_the_fp8_buffer():
    linear, rest = _hand_numels()
    bf16 = _gathered_bytes(*_sync(False))
    fp8 = _gathered_bytes(*_sync(True))
    assert bf16 == 2 * _padded(linear + rest) // 2  # one bucket, ring over 2: half of it sent
    assert fp8 == (1 * _padded(linear) + 2 * _padded(rest)) // 2
    fp8_buffer_bf16 = 2 * _padded(linear) // 2
    assert fp8 - 2 * _padded(rest) // 2 == fp8_buffer_bf16 // 2  # FP8 buffer: half, to the byte
