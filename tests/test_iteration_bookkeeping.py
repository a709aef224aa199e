"""Megatron's per-iteration bookkeeping kernels (training/data_parallel/optimizer.py): the
gradient buffer zeroed before the forward (train_step's zero_grad_buffer) and the gradient norm
before the step (the default --clip-grad 1.0), their bytes counted by hand on a tiny GPT."""

import pytest

from simsp.hardware.constants import compute_for
from simsp.hardware.costmodel import kernel_time
from simsp.scenario.loading import load_scenario
from simsp.training.driver.iteration import simulate_iteration

H, S, V = 128, 64, 256  # hidden, sequence, vocabulary (tied); one layer, 4 heads, LayerNorm
# word 256·128 + positions 64·128 + the layer (two norms, QKV, projection, fc1, fc2 with their
# biases) + the final norm
PARAMS = (V * H + S * H + 2 * 2 * H + (H * 3 * H + 3 * H) + (H * H + H)
          + (H * 4 * H + 4 * H) + (4 * H * H + H) + 2 * H)


def _spans(**parallel) -> dict:
    """{kernel name: [seconds, ...]} of the bookkeeping kernels on rank 0 of an H100 run."""
    overrides = {("run", "mode"): "meta", ("cluster", "system"): "dgx-h100",
                 ("model", "num_layers"): 1, ("model", "hidden_size"): H,
                 ("model", "num_attention_heads"): 4, ("model", "seq_length"): S,
                 ("model", "vocab_size"): V}
    overrides.update({("parallel", k): v for k, v in parallel.items()})
    world = simulate_iteration(load_scenario(None, overrides)).inputs.world
    out = {}
    for s in world.trace.spans_of(0, "compute"):
        if s.name in ("zero_grad_buffer", "grad_norm"):
            out.setdefault(s.name, []).append(s.end_s - s.start_s)
    return out


def test_parameter_count_by_hand():
    assert PARAMS == 239_488


@pytest.mark.parametrize("distributed, shard", [(False, 1), (True, 2)])
def test_zeroing_and_norm_once_per_iteration(distributed, shard):
    cal = compute_for("h100-sxm-80gb")
    spans = _spans(data_parallel_size=2, distributed_optimizer=distributed,
                   global_batch_size=4)
    # every main gradient (fp32) written once; the norm reads the optimizer's shard once
    assert spans["zero_grad_buffer"] == pytest.approx(
        [kernel_time("elementwise", 0, 4 * PARAMS, cal=cal)], rel=1e-12)
    assert spans["grad_norm"] == pytest.approx(
        [kernel_time("elementwise", 0, 4 * PARAMS // shard, cal=cal)], rel=1e-12)


def test_torch_fsdp2_zeroes_no_buffer():
    # Megatron's TorchFullyShardedDataParallel keeps _BaseDataParallel.zero_grad_buffer: `pass`
    spans = _spans(data_parallel_size=2, use_torch_fsdp2=True, global_batch_size=4)
    assert "zero_grad_buffer" not in spans
    assert len(spans["grad_norm"]) == 1
