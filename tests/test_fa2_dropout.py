"""FlashAttention-2's attention dropout, drawn in the kernel (simsp/hardware/attention_kernels.py
dropout_tile_seconds; docs/attention_kernels.md): the mask's integer instructions per tile, worked
by hand from the flash-attn source (csrc/flash_attn/src/philox.cuh and dropout.h at v2.5.8) and
the H100's peak INT32 rate (NVIDIA H100 whitepaper: 33.5 TOPS, a multiply-add counted twice)."""

import json

import pytest

from simsp.hardware.attention_kernels import (AttentionRates, AttentionShape, attention_rates,
                                              attention_seconds, sm_rate)

# one H100 SM's integer instructions per second: 33.5e12 / 2 / 132 SMs
H100_SM_INSTRUCTIONS_PER_S = 33.5e12 / 2 / 132
# per score element, by hand from the source: a Philox-4x32 call (7 rounds of 2 mul.wide.u32 +
# 4 xor = 42, 6 key updates of 2 add = 12: 54 instructions) per 16 one-byte draws, plus the
# forward's set.le.u32.f16x2 + and per pair of BF16 scores (1 per element) or the backward's
# compare + select (2 per element)
FORWARD_PER_SCORE = 54 / 16 + 1  # 4.375
BACKWARD_PER_SCORE = 54 / 16 + 2  # 5.375
FA2 = AttentionRates("fa2", 132, 3.35e12, 0.9, 2e-6, 370e12, 322e12, None, 33.5e12)


def _both(shape):
    """(with dropout, without) seconds of the forward and of the backward."""
    plain = AttentionShape(**{**shape.__dict__, "dropout": False})
    return [(attention_seconds(FA2, shape, bwd), attention_seconds(FA2, plain, bwd))
            for bwd in (False, True)]


def test_mask_seconds_by_hand():
    # b 1, 2 heads of 128, s 256, causal. Forward tiles 128 x 32 with dropout (128 x 64
    # without: the same keys, test_fa2_dropout_tiles.py): row block 0 runs 4 key tiles, row
    # block 1 runs 8; 2 heads -> 4 CTAs on 132 SMs, one wave whose longest CTA runs 8 tiles of
    # 4096 scores (= 4 x 8192). Backward tiles 64 x 128: key block 0 runs 4 query tiles, key
    # block 1 runs 2 (rows 128 on): the longest CTA runs 4 tiles of 8192.
    shape = AttentionShape(1, 2, 2, 256, 256, 128, 128, True, True)
    (fwd, fwd0), (bwd, bwd0) = _both(shape)
    assert fwd - fwd0 == pytest.approx(4 * 8192 * FORWARD_PER_SCORE / H100_SM_INSTRUCTIONS_PER_S,
                                       rel=1e-9)
    assert bwd - bwd0 == pytest.approx(4 * 8192 * BACKWARD_PER_SCORE / H100_SM_INSTRUCTIONS_PER_S,
                                       rel=1e-9)
    # 1.13 and 1.39 us: the mask costs its tiles 14% and 11% over the tile math here
    assert fwd - fwd0 == pytest.approx(1.12976e-6, rel=1e-5)
    assert bwd - bwd0 == pytest.approx(1.38799e-6, rel=1e-5)


def test_waves_multiply_the_mask():
    # b 1, 264 heads, s 1024, d 128, causal: row block i runs 4(i + 1) key tiles of 32 with
    # dropout (the keys of 2(i + 1) tiles of 64 without), and each row block's 264 CTAs take
    # two waves of 132 on the H100 (longest first), so the waves' longest CTAs run the scores of
    # 2 x (2 + 4 + ... + 16) = 144 tiles of 128 x 64 (compute-bound: the tiles' math exceeds the
    # HBM floor with or without the mask)
    shape = AttentionShape(1, 264, 264, 1024, 1024, 128, 128, True, True)
    (fwd, fwd0), _ = _both(shape)
    assert fwd - fwd0 == pytest.approx(144 * 8192 * FORWARD_PER_SCORE
                                       / H100_SM_INSTRUCTIONS_PER_S, rel=1e-9)


@pytest.mark.parametrize("rates", [
    AttentionRates("cudnn", 132, 3.35e12, 0.9, 2e-6, 595e12, 516e12, None, 33.5e12),
    AttentionRates("fa3", 132, 3.35e12, 0.9, 2e-6, 648e12, 561e12, None, 33.5e12),
    AttentionRates("fa2", 132, 3.35e12, 0.9, 2e-6, 370e12, 322e12, None, None)])
def test_only_flash_attention_2_with_an_integer_rate_is_charged(rates):
    # cuDNN's dropout is not published, FlashAttention-3 has none; a profile without int32_TOPS
    # prices no mask
    shape = AttentionShape(1, 2, 2, 256, 256, 128, 128, True, True)
    plain = AttentionShape(1, 2, 2, 256, 256, 128, 128, True, False)
    for bwd in (False, True):
        assert attention_seconds(rates, shape, bwd) == attention_seconds(rates, plain, bwd)


def test_profiles_carry_the_integer_rate():
    # the whitepapers' peak INT32: H100 SXM5 33.5 TOPS (H800, H200 the same GH100), A100 19.5
    for gpu, tops in (("h100-sxm-80gb", 33.5), ("h800-sxm-80gb", 33.5),
                      ("h200-sxm-141gb", 33.5), ("a100-sxm-80gb", 19.5)):
        assert attention_rates(gpu, "flash").int32_ops == tops * 1e12


def test_layer_charges_the_mask_only_with_attention_dropout():
    # llama-tiny on an H100 with flash and --attention-dropout 0.1: rank 0's forward core is one
    # causal FA2 call of 2 query heads (1 K/V head) of d 8, s 32: without dropout one 128 x 112
    # tile (FA2's at d <= 64); with dropout one 128 x 128 tile (v2.5.8 flash_fwd_launch_template.h
    # run_mha_fwd_hdim32, Is_dropout): the core costs the call without dropout, plus the wider
    # tile's 128 x 16 more scores of 2 x (8 + 8) FLOPs at the per-SM rate, plus its mask's 16,384
    # scores
    from tests.inprocess import cli
    rc, out, err = cli(["layer", "scenarios/llama-tiny.toml", "--gpu", "h100-sxm-80gb",
                        "--attention-backend", "flash", "--attention-dropout", "0.1",
                        "--mode", "meta", "--ops", "--json"])
    assert rc == 0, err
    core = sum(row["seconds"] for row in json.loads(out)["ops"]
               if row["name"].endswith(("_scores", "_context")) and "recompute" not in row["name"])
    plain = attention_seconds(attention_rates("h100-sxm-80gb", "flash"),
                              AttentionShape(1, 2, 1, 32, 32, 8, 8, True), False)
    wider = 128 * 16 * 2 * (8 + 8) / sm_rate(attention_rates("h100-sxm-80gb", "flash"), False)
    assert core - plain == pytest.approx(wider + 128 * 128 * FORWARD_PER_SCORE
                                         / H100_SM_INSTRUCTIONS_PER_S, rel=1e-9)
