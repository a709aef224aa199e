"""Transformer Engine's FlashAttention layout copies (simsp/model/blocks/attention/flash.py
te_layout_copy): the (b, s) output copied to Megatron's (s, b) layout in the forward and the
gradient copied back in the backward, only with b > 1 and only on the FlashAttention kernels
(TE 1.8 transformer_engine/pytorch/attention.py FlashAttention.forward:
`output.view(b, s, -1).transpose(0, 1).contiguous()`)."""

import json

import pytest

from tests.inprocess import cli

COPIES = ("proj_input_to_sbhd", "d_flash_output_to_bshd")


def _ops(backend, micro_batch):
    """{name: op row} of llama-tiny's rank-0 layer on an H100."""
    rc, out, err = cli(["layer", "scenarios/llama-tiny.toml", "--gpu", "h100-sxm-80gb",
                        "--attention-backend", backend, "--micro-batch-size", str(micro_batch),
                        "--mode", "meta", "--ops", "--json"])
    assert rc == 0, err
    return {row["name"]: row for row in json.loads(out)["ops"]}


def test_copies_by_hand():
    # llama-tiny, t 2: rank 0 holds 2 heads of 8, s 32; at b 2 the output is 32 x 2 x 16 BF16
    # elements, 2048 bytes, read and written once each way: 4096 bytes at 0.9 x 3.35 TB/s plus
    # the 2 us launch
    ops = _ops("flash", 2)
    for name in COPIES:
        assert ops[name]["seconds"] == pytest.approx(2e-6 + 4096 / (0.9 * 3.35e12), rel=1e-12)
        assert ops[name]["GBps"] * 1e9 * ops[name]["seconds"] == pytest.approx(4096, rel=1e-12)
    assert ops["proj_input_to_sbhd"]["phase"] == "forward"
    assert ops["d_flash_output_to_bshd"]["phase"] == "backward"


@pytest.mark.parametrize("backend, micro_batch", [("flash", 1), ("fused", 2)])
def test_no_copy_at_batch_one_or_under_cudnn(backend, micro_batch):
    # b 1: the transposed (1, s) view is already contiguous; cuDNN takes the (s, b) layout
    ops = _ops(backend, micro_batch)
    assert not set(COPIES) & set(ops)
