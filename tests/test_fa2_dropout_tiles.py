"""FlashAttention-2's forward tile under dropout (simsp/hardware/attention_kernels.py fwd_tile,
FA2_DROPOUT_FWD_TILES): the table written here by hand from Dao-AILab/flash-attention v2.5.8
csrc/flash_attn/src/flash_fwd_launch_template.h run_mha_fwd_hdim{32..256}, the Is_dropout branch
on a GPU that is not "sm8x" (the A100 and H100), and the kernel time the narrower tile prices."""

import pytest

from simsp.hardware.attention_kernels import (AttentionRates, AttentionShape, attention_seconds,
                                              backward_work, bwd_tile, fwd_tile, sm_rate)

# v2.5.8 launch template, Is_dropout, not sm8x: Flash_fwd_kernel_traits<Headdim, kBlockM, kBlockN>
LAUNCH_TEMPLATE_DROPOUT = {32: (128, 128), 64: (128, 64), 96: (128, 64), 128: (128, 32),
                           160: (128, 32), 192: (64, 64), 224: (128, 64), 256: (64, 64)}
# H100 figures without an integer rate: no dropout mask priced, only the tile's own arithmetic
FA2_NO_MASK = AttentionRates("fa2", 132, 3.35e12, 0.9, 2e-6, 370e12, 322e12, None, None)


@pytest.mark.parametrize("head_dim", sorted(LAUNCH_TEMPLATE_DROPOUT))
@pytest.mark.parametrize("causal", [True, False])
def test_dropout_tile_is_the_launch_templates(head_dim, causal):
    # the template's head-dim buckets: any d up to the bucket's top runs that bucket's kernel
    for d in (head_dim - 7, head_dim):
        assert fwd_tile("fa2", d, d, causal, True) == LAUNCH_TEMPLATE_DROPOUT[head_dim]


def test_dropout_leaves_the_other_tiles():
    # without dropout FA2 keeps 128 x 64 at d 128; FA3 and cuDNN do not switch on dropout; the
    # v2.5.8 backward template branches on Is_dropout only to keep V in registers (same tile)
    assert fwd_tile("fa2", 128, 128, True, False) == (128, 64)
    assert fwd_tile("fa3", 128, 128, True, True) == fwd_tile("fa3", 128, 128, True, False)
    assert fwd_tile("cudnn", 128, 128, False, True) == (128, 176)
    shape = AttentionShape(1, 2, 2, 256, 256, 128, 128, True, True)
    assert backward_work("fa2", shape, 132).tile_scores == 64 * 128 == 8192
    assert bwd_tile("fa2", 128, True) == (64, 128)


def test_narrower_tile_covers_fewer_masked_keys():
    # b 1, 1 head of 128, s 160, causal, no mask priced. 128 x 64 tiles: row block 1 (rows
    # 128-159, keys up to 159) runs 3 key tiles, 192 keys; 128 x 32 tiles: 5, 160 keys. One wave
    # of 2 CTAs, so the forward's tile math is its longest CTA's: 192 -> 160 keys of
    # 2 x 128 x (128 + 128) FLOPs each, at the per-SM rate; the fixed part (one wave, the
    # 128-row CTA's Q, O, logsumexp bytes) is the same
    plain = AttentionShape(1, 1, 1, 160, 160, 128, 128, True, False)
    dropout = AttentionShape(1, 1, 1, 160, 160, 128, 128, True, True)
    per_key = 2 * 128 * 256  # FLOPs of one key column of a 128-row tile
    saved = (192 - 160) * per_key / sm_rate(FA2_NO_MASK, False)
    assert (attention_seconds(FA2_NO_MASK, plain, False)
            - attention_seconds(FA2_NO_MASK, dropout, False)) == pytest.approx(saved, rel=1e-9)


def test_aligned_causal_forward_is_unchanged():
    # GPT3-5B's core (b 4, 32 heads of 128, s 2048, causal): every row block ends on a multiple
    # of 64, so 128 x 32 tiles cover exactly the keys 128 x 64 ones do, twice as many at half the
    # FLOPs: the same priced time (the mask's scores are the same too)
    plain = AttentionShape(4, 32, 32, 2048, 2048, 128, 128, True, False)
    dropout = AttentionShape(4, 32, 32, 2048, 2048, 128, 128, True, True)
    assert attention_seconds(FA2_NO_MASK, dropout, False) == pytest.approx(
        attention_seconds(FA2_NO_MASK, plain, False), rel=1e-12)


def test_head_dim_192_halves_the_rows():
    # d 192 with dropout: 64 x 64 (no dropout 128 x 96). b 1, 1 head, s 128, not causal: 2 row
    # blocks of 64 rows, each 2 key tiles of 64, so one wave of 2 CTAs whose longest runs 2 tiles
    # of 2 x 64 x 64 x 384 FLOPs, against 1 CTA of 2 tiles of 2 x 128 x 96 x 384 (128 = 96 + 32
    # keys: 2 tiles); both with their CTA's bytes at one SM's share of HBM
    shape = AttentionShape(1, 1, 1, 128, 128, 192, 192, False, True)
    plain = AttentionShape(1, 1, 1, 128, 128, 192, 192, False, False)
    rate = sm_rate(FA2_NO_MASK, False)
    per_sm = 3.35e12 / 132
    row_bytes = 2 * (192 + 192) + 4  # Q in, O out (16-bit) and the fp32 logsumexp, per row
    expect = 2 * 2 * 64 * 64 * 384 / rate + 64 * row_bytes / per_sm + 2e-6
    expect_plain = 2 * 2 * 128 * 96 * 384 / rate + 128 * row_bytes / per_sm + 2e-6
    assert attention_seconds(FA2_NO_MASK, shape, False) == pytest.approx(expect, rel=1e-9)
    assert attention_seconds(FA2_NO_MASK, plain, False) == pytest.approx(expect_plain, rel=1e-9)
