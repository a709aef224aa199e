"""--te-version 1.8: Transformer Engine 1.8's LayerNormLinear and LayerNormMLP write the FP8 norm
output row-wise only and transpose it in the backward before the weight-gradient GEMM
(NVIDIA/TransformerEngine v1.8 module/layernorm_linear.py and layernorm_mlp.py:
`ln_out_total_t = tex.fp8_transpose(ln_out_total, ...)`); bytes worked by hand on llama-tiny
(s 32, b 1, h 32: 1024 elements of each norm output, per-tensor FP8 with one fp32 scale)."""

import json

import pytest

from tests.inprocess import cli

ELEMENTS = 32 * 1 * 32  # s x b x h of the QKV and fc1 inputs
SCALE = 4  # one fp32 scale per direction (per-tensor delayed scaling)


def _bytes(*flags):
    """{op name: bytes moved} of llama-tiny's layer on an H100 in FP8 hybrid."""
    rc, out, err = cli(["layer", "scenarios/llama-tiny.toml", "--gpu", "h100-sxm-80gb",
                        "--fp8-format", "hybrid", "--mode", "meta", "--ops", "--json", *flags])
    assert rc == 0, err
    return {row["name"]: row["GBps"] * row["seconds"] * 1e9 for row in json.loads(out)["ops"]
            if row["kind"] == "elementwise"}


@pytest.mark.parametrize("te18", [False, True])
def test_norm_output_without_sp(te18):
    # t 1, no SP. Today's TE: the norm reads 2-byte BF16 and writes both FP8 directions (Hopper
    # GEMMs take only TN), 2 x (1024 + 4); TE 1.8: one direction, 1024 + 4, and the backward
    # transposes it, reading and writing 1 byte an element: 2048
    ops = _bytes("--tensor-model-parallel-size", "1", "--no-sequence-parallel",
                 *(("--te-version", "1.8") if te18 else ()))
    directions = 1 if te18 else 2
    for norm, transpose in (("ln1_output", "d_attn.qkv_weight_fp8_transpose"),
                            ("fc1_input", "d_mlp.fc1_weight_fp8_transpose")):
        assert ops[norm] == pytest.approx(2 * ELEMENTS + directions * (ELEMENTS + SCALE),
                                          rel=1e-6)
        assert ops.get(transpose, 0.0) == pytest.approx(2 * ELEMENTS if te18 else 0.0, rel=1e-6)


def test_sequence_parallel_moves_the_transpose_to_the_backward():
    # t 2, SP: the norm writes row-wise only either way (TE all-gathers that direction); today's
    # TE transposes the gathered copy (s x b x h = 1024 elements) in the forward, TE 1.8 the
    # re-gathered one in the backward: the same 2048 bytes, in the other pass
    today, te18 = _bytes(), _bytes("--te-version", "1.8")
    assert today["qkv_fp8_transpose"] == pytest.approx(2 * ELEMENTS, rel=1e-6)
    assert "d_attn.qkv_weight_fp8_transpose" not in today
    assert "qkv_fp8_transpose" not in te18
    assert te18["d_attn.qkv_weight_fp8_transpose"] == pytest.approx(2 * ELEMENTS, rel=1e-6)
    assert te18["ln1_output"] == today["ln1_output"]
