"""Fused attention kernels as tiled kernels: FlashAttention-2, FlashAttention-3 and cuDNN's
fused attention, forward and backward (docs/attention_kernels.md).

Each kernel runs one CTA per (batch, query head, row block) forward and per (batch, query head,
column block) backward; a CTA loops over the tiles its causal mask leaves (the tiles above the
diagonal are skipped, the diagonal ones computed whole and masked). Tile sizes are the kernels'
own (Dao-AILab/flash-attention hopper/tile_size.h, hopper/flash_bwd_launch_template.h). The
CTAs run longest first in waves over the GPU's SMs; a CTA costs its tiles at the kernel's
per-SM rate plus its prologue/epilogue bytes (Q in, O and the logsumexp out; K, V in and dK, dV
out backward) at its SM's share of HBM bandwidth. The per-SM rate is the one that reproduces
the kernel's published throughput at the published shape (FlashAttention-3 paper, Shah et al.
2024, arXiv:2407.08608 §4.1: batch × seqlen = 16k tokens, 16 heads of 128, non-causal), stored
with its source in the GPU profile's [attention] section.
"""

from dataclasses import dataclass, replace
from functools import lru_cache

KERNELS = ("fa2", "fa3", "cudnn")
KERNEL_NAMES = {"fa2": "FlashAttention-2", "fa3": "FlashAttention-3",
                "cudnn": "cuDNN fused attention (Transformer Engine FusedAttention)"}
# the published shape every figure is measured at (FA3 paper §4.1, also the FA2 paper's setup)
REFERENCE_TOKENS, REFERENCE_HEADS, REFERENCE_SEQ, REFERENCE_HEAD_DIM = 16384, 16, 16384, 128
LSE_BYTES = 4  # the fp32 logsumexp (and backward's fp32 D = rowsum(dO ∘ O)) per row
# FlashAttention-2's attention dropout draws its keep-mask in the kernel, forward and again in
# the backward (Dao-AILab/flash-attention csrc/flash_attn/src/dropout.h apply_dropout and
# philox.cuh at v2.5.8, the newest flash-attn Transformer Engine 1.8 accepts): one Philox-4x32
# call per 16 score elements (its 128 bits are 16 one-byte draws), each call 7 rounds of two
# mul.wide.u32 and four xor plus 6 key updates of two add: 54 integer instructions
PHILOX_INSTRUCTIONS, PHILOX_ELEMENTS = 7 * (2 + 4) + 6 * 2, 16
# applying the draws, per score element: forward, one set.le.u32.f16x2 and one and per pair of
# 16-bit scores (the 16-bit branch of apply_dropout); backward, one compare and one select
# (encode_dropout_in_sign_bit, flash_bwd_kernel.h)
MASK_INSTRUCTIONS = {False: 1.0, True: 2.0}  # {backward: instructions per score element}
INT32_OPS_PER_INSTRUCTION = 2  # a peak INT32 TOPS figure counts a multiply-add as two operations


@dataclass(frozen=True)
class AttentionShape:
    """One attention call: batch, query heads, K/V heads (GQA/MQA share them), query and key
    lengths, the q·k head width and the value width (MLA: 192 and 128), causal or not."""

    batch: int
    heads: int
    kv_heads: int
    s_q: int
    s_k: int
    d_qk: int
    d_v: int
    causal: bool
    dropout: bool = False  # attention dropout drawn in the kernel (FlashAttention-2 only priced)


# FlashAttention-2's forward tile with dropout, (largest head dim, (block_m, block_n)):
# csrc/flash_attn/src/flash_fwd_launch_template.h run_mha_fwd_hdim{32..256} at v2.5.8, the
# Is_dropout branch on a GPU that is not "sm8x" (is_sm8x = major 8 and minor > 0: the A100's 8.0
# and the H100's 9.0 are not); hdim224 and hdim256 branch on shared memory, not dropout (both
# with ≥ 112 KiB a block; hdim256 64 × 64 where an SM has ≥ 192 KiB, the H100's 228)
FA2_DROPOUT_FWD_TILES = ((32, (128, 128)), (64, (128, 64)), (96, (128, 64)), (128, (128, 32)),
                         (160, (128, 32)), (192, (64, 64)), (224, (128, 64)), (256, (64, 64)))


def fwd_tile(kernel: str, d_qk: int, d_v: int, causal: bool, dropout: bool = False) -> tuple:
    """(block_m, block_n) of the forward kernel at 16-bit: FlashAttention-3 from
    hopper/tile_size.h tile_size_fwd_sm90; FlashAttention-2 from tile_size_fwd_sm8x (A100's,
    128 × 64 at d = 128 as csrc/flash_attn/src/flash_fwd_launch_template.h), with dropout from
    that template's Is_dropout branch (FA2_DROPOUT_FWD_TILES); cuDNN's tiles are not published:
    FlashAttention-3's (the Hopper kernels share the wgmma tile shapes)."""
    if kernel == "fa2" and dropout:
        return next((tile for top, tile in FA2_DROPOUT_FWD_TILES if d_qk <= top),
                    FA2_DROPOUT_FWD_TILES[-1][1])
    if kernel == "fa2":
        return (128, 112) if d_qk <= 64 else (128, 64) if d_qk <= 128 else (128, 96)
    if d_qk <= 64:
        return (192, 128 if causal else 192)
    if d_qk <= 96:
        return (192, 144)
    if d_qk <= 128:
        return (128, 128 if causal else 176)
    if d_qk <= 192:
        return (128, 128 if d_v <= 128 else 112)
    return (128, 80)


def bwd_tile(kernel: str, d_qk: int, causal: bool) -> tuple:
    """(block_m, block_n) of the backward kernel (hopper/flash_bwd_launch_template.h
    run_mha_bwd_hdim*: the Arch >= 90 branch for FlashAttention-3 and cuDNN, the Arch 80 branch
    for FlashAttention-2). Dropout keeps FlashAttention-2's tile: v2.5.8's csrc/flash_attn/src/
    flash_bwd_launch_template.h branches on Is_dropout only for keeping V in registers."""
    if kernel == "fa2":
        return ((128, 128) if d_qk <= 64 else (64, 128) if d_qk <= 128 else (64, 80)
                if d_qk <= 192 else (64, 64))
    if d_qk <= 64:
        return (128, 128)
    if d_qk <= 128:
        return (64, 128) if causal or d_qk <= 96 else (80, 128)
    return (64, 96) if d_qk <= 192 else (64, 80)


def row_block_tiles(s_q: int, s_k: int, block_m: int, block_n: int, causal: bool) -> list:
    """Forward: the key tiles each row block runs, row block i of rows [i·bm, (i+1)·bm): all
    ⌈s_k/bn⌉, or with the causal mask (aligned bottom-right, row r sees keys up to
    r + s_k − s_q, as FlashAttention's n_block_max) ⌈min(s_k, (i+1)·bm + s_k − s_q)/bn⌉."""
    blocks_k = -(-s_k // block_n)
    if not causal:
        return [blocks_k] * -(-s_q // block_m)
    return [max(0, min(blocks_k, -(-min(s_k, (i + 1) * block_m + s_k - s_q) // block_n)))
            for i in range(-(-s_q // block_m))]


def col_block_tiles(s_q: int, s_k: int, block_m: int, block_n: int, causal: bool) -> list:
    """Backward: the query tiles each column block runs, column block j of keys [j·bn,
    (j+1)·bn): all ⌈s_q/bm⌉, or causally from the first row block that sees key j·bn
    (⌊(j·bn − (s_k − s_q))/bm⌋, as FlashAttention's m_block_min)."""
    blocks_q = -(-s_q // block_m)
    if not causal:
        return [blocks_q] * -(-s_k // block_n)
    return [blocks_q - min(blocks_q, max(0, (j * block_n - (s_k - s_q)) // block_m))
            for j in range(-(-s_k // block_n))]


@dataclass(frozen=True)
class KernelWork:
    """What one kernel call does: tiles run, FLOPs of those tiles (masked parts included),
    bytes the tiles load and store, HBM bytes of the tensors once, and the wave schedule:
    wave_tiles Σ over waves of the wave's longest CTA in tiles, waves, cta_bytes per CTA."""

    tiles: int
    flops: int
    tile_bytes: int
    hbm_bytes: int
    wave_tiles: int
    waves: int
    tile_flops: int
    cta_bytes: int
    extra_bytes: int  # backward's pre/post-processing kernels (D, dQ and GQA's dK/dV converts)
    tile_scores: int = 0  # score elements of one tile, bm·bn (the dropout mask's draws)


def _waves(per_block: list, copies: int, sms: int) -> tuple:
    """(Σ over waves of the wave's longest CTA, waves): `copies` CTAs of each block's tile
    count, run longest first, `sms` at a time; wave k starts at CTA k·sms."""
    total, start = 0, 0
    for tiles in sorted(per_block, reverse=True):
        end = start + copies
        total += tiles * (-(-end // sms) - -(-start // sms))
        start = end
    return total, -(-start // sms)


def forward_work(kernel: str, shape: AttentionShape, sms: int) -> KernelWork:
    """The forward kernel's work: per tile 2·bm·bn·(d_qk + d_v) FLOPs and the K, V tiles read;
    per CTA Q read, O and the logsumexp written."""
    bm, bn = fwd_tile(kernel, shape.d_qk, shape.d_v, shape.causal, shape.dropout)
    per_block = row_block_tiles(shape.s_q, shape.s_k, bm, bn, shape.causal)
    copies = shape.batch * shape.heads
    tiles = copies * sum(per_block)
    tile_flops = 2 * bm * bn * (shape.d_qk + shape.d_v)
    cta_bytes = bm * (2 * (shape.d_qk + shape.d_v) + LSE_BYTES)
    ctas = copies * len(per_block)
    wave_tiles, waves = _waves(per_block, copies, sms)
    rows, keys = shape.batch * shape.heads * shape.s_q, shape.batch * shape.kv_heads * shape.s_k
    hbm = rows * (2 * (shape.d_qk + shape.d_v) + LSE_BYTES) + keys * 2 * (shape.d_qk + shape.d_v)
    return KernelWork(tiles, tiles * tile_flops, tiles * 2 * bn * (shape.d_qk + shape.d_v)
                      + ctas * cta_bytes, hbm, wave_tiles, waves, tile_flops, cta_bytes, 0,
                      bm * bn)


def backward_work(kernel: str, shape: AttentionShape, sms: int) -> KernelWork:
    """The backward kernel's work: per tile 2·bm·bn·(3·d_qk + 2·d_v) FLOPs (S = QKᵀ recomputed,
    dP = dO Vᵀ, dV += Pᵀ dO, dK += dSᵀ Q, dQ += dS K), the Q, dO tiles and the fp32 logsumexp
    and D read, dQ's fp32 accumulator read and written; per CTA K, V read and dK, dV written.
    Pre/post kernels: D = rowsum(dO ∘ O) (reads dO, O), dQ fp32 -> 16-bit, and with GQA/MQA
    dK, dV summed from fp32 per-query-head accumulators."""
    d_qk, d_v = shape.d_qk, shape.d_v
    bm, bn = bwd_tile(kernel, d_qk, shape.causal)
    per_block = col_block_tiles(shape.s_q, shape.s_k, bm, bn, shape.causal)
    copies = shape.batch * shape.heads
    tiles = copies * sum(per_block)
    tile_flops = 2 * bm * bn * (3 * d_qk + 2 * d_v)
    per_tile_bytes = bm * (2 * (d_qk + d_v) + 2 * LSE_BYTES + 8 * d_qk)
    cta_bytes = bn * 4 * (d_qk + d_v)
    wave_tiles, waves = _waves(per_block, copies, sms)
    rows, keys = copies * shape.s_q, shape.batch * shape.kv_heads * shape.s_k
    extra = rows * (4 * d_v + LSE_BYTES) + rows * d_qk * (4 + 2)
    if shape.kv_heads != shape.heads:
        extra += copies * shape.s_k * (d_qk + d_v) * 4 + keys * (d_qk + d_v) * 2
    hbm = rows * (4 * (d_qk + d_v) + 2 * LSE_BYTES) + keys * 4 * (d_qk + d_v)
    return KernelWork(tiles, tiles * tile_flops,
                      tiles * per_tile_bytes + copies * len(per_block) * cta_bytes, hbm,
                      wave_tiles, waves, tile_flops, cta_bytes, extra, bm * bn)


@dataclass(frozen=True)
class AttentionRates:
    """One GPU's figures for one kernel: SMs, HBM bandwidth and the fraction streaming kernels
    reach, launch overhead, and the published forward/backward TFLOP/s at the reference shape."""

    kernel: str
    sms: int
    hbm_Bps: float
    memory_efficiency: float
    launch_s: float
    fwd_flops: float  # published FLOP/s at the reference shape
    bwd_flops: float
    reference: AttentionShape | None = None  # the figures' own shape; None: reference_shape()
    int32_ops: float | None = None  # peak INT32 operations/s (the dropout mask); None: unpriced


def _fixed_seconds(work: KernelWork, rates: AttentionRates) -> float:
    """The part of a kernel's time that is not tile math: launch, each wave's CTA prologue and
    epilogue at one SM's share of HBM, and the pre/post kernels' bytes (each its own launch)."""
    per_sm_Bps = rates.hbm_Bps / rates.sms
    extra = (work.extra_bytes / (rates.hbm_Bps * rates.memory_efficiency) + 2 * rates.launch_s
             if work.extra_bytes else 0.0)
    return rates.launch_s + work.waves * work.cta_bytes / per_sm_Bps + extra


def reference_shape() -> AttentionShape:
    """The published benchmarks' shape: 16k tokens in one sequence, 16 heads of 128, no mask."""
    return AttentionShape(REFERENCE_TOKENS // REFERENCE_SEQ, REFERENCE_HEADS, REFERENCE_HEADS,
                          REFERENCE_SEQ, REFERENCE_SEQ, REFERENCE_HEAD_DIM, REFERENCE_HEAD_DIM,
                          False)


def published_flops(shape: AttentionShape, backward: bool) -> int:
    """The FLOPs the kernels' benchmarks count (flash-attention benchmarks/benchmark_flash_
    attention.py flops()): 4·b·h·s_q·s_k·d forward, halved when causal, 2.5× backward."""
    d = (shape.d_qk + shape.d_v) / 2
    forward = 4 * shape.batch * shape.heads * shape.s_q * shape.s_k * d
    forward = forward / 2 if shape.causal else forward
    return int(2.5 * forward if backward else forward)


@lru_cache(maxsize=64)
def sm_rate(rates: AttentionRates, backward: bool) -> float:
    """FLOP/s of tile math on one SM: the rate at which the model reproduces the published
    throughput at the figures' shape (the profile's, else the reference shape; T_published =
    wave_tiles·tile_flops/rate + fixed part, solved for rate)."""
    shape = rates.reference or reference_shape()
    work = (backward_work if backward else forward_work)(rates.kernel, shape, rates.sms)
    published = rates.bwd_flops if backward else rates.fwd_flops
    seconds = published_flops(shape, backward) / published
    math_s = seconds - _fixed_seconds(work, rates)
    return work.wave_tiles * work.tile_flops / math_s


def dropout_instructions(backward: bool) -> float:
    """Integer instructions FlashAttention-2 spends per score element drawing and applying its
    dropout mask: the Philox share plus the mask's own (constants above)."""
    return PHILOX_INSTRUCTIONS / PHILOX_ELEMENTS + MASK_INSTRUCTIONS[backward]


def dropout_tile_seconds(rates: AttentionRates, work: KernelWork, backward: bool) -> float:
    """Seconds one SM spends on a tile's dropout mask at its share of the GPU's integer rate
    (issued by the warps that run the tile's GEMMs, between them, so added to the tile's time);
    0 where the profile has no integer rate or the kernel is not FlashAttention-2."""
    if rates.kernel != "fa2" or rates.int32_ops is None:
        return 0.0
    per_sm = rates.int32_ops / INT32_OPS_PER_INSTRUCTION / rates.sms  # instructions/s per SM
    return work.tile_scores * dropout_instructions(backward) / per_sm


@lru_cache(maxsize=4096)
def attention_seconds(rates: AttentionRates, shape: AttentionShape, backward: bool) -> float:
    """Seconds of one fused attention call (forward, or the whole backward with its pre/post
    kernels): the waves' tile math at the per-SM rate (with dropout, FlashAttention-2's mask per
    tile) plus the fixed part, and never less than its HBM bytes at the streaming rate."""
    work = (backward_work if backward else forward_work)(rates.kernel, shape, rates.sms)
    tile_s = work.tile_flops / sm_rate(rates, backward)
    if shape.dropout:
        tile_s += dropout_tile_seconds(rates, work, backward)
    compute = work.wave_tiles * tile_s
    floor = work.hbm_bytes / (rates.hbm_Bps * rates.memory_efficiency)
    return max(compute + _fixed_seconds(work, rates), floor + rates.launch_s)


def kernel_for(backend: str, gpu_attention: dict, hopper: bool) -> str | None:
    """The kernel a Megatron --attention-backend runs on a GPU, None where its figures are not in
    the profile (the core then falls back to GEMM pricing). flash: FlashAttention-2 (the
    flash-attn package Transformer Engine calls; FlashAttention-3 only with flash_attn_3
    installed); fused: cuDNN; auto: Transformer Engine's choice, cuDNN on Hopper and later
    ("give FusedAttention preference on Hopper+", transformer_engine/pytorch/attention/
    dot_product_attention/utils.py get_attention_backend), FlashAttention-2 before."""
    wanted = wanted_kernel(backend, hopper)
    if wanted is None or f"{wanted}_fwd_TFLOPs" not in gpu_attention:
        return None
    return wanted


def wanted_kernel(backend: str, hopper: bool) -> str | None:
    """The kernel a fused backend runs (kernel_for), whether or not the GPU has its figures;
    None for the unfused/local core."""
    return {"flash": "fa2", "fused": "cudnn", "auto": "cudnn" if hopper else "fa2"}.get(backend)


def backend_pricing(backend: str, gpu_attention: dict, hopper: bool) -> str:
    """One line for `simsp hardware`: how a fused backend's core is priced on this GPU, the
    tiled kernel at its figures and their shape, or the GEMM pricing as the fallback."""
    wanted = wanted_kernel(backend, hopper)
    if kernel_for(backend, gpu_attention, hopper) is None:
        return (f"{KERNEL_NAMES[wanted]}: no published figure in [attention]; fallback: the "
                f"causal tiles as batched GEMMs")
    shape = profile_reference(gpu_attention) or reference_shape()
    fp8 = gpu_attention.get(f"{wanted}_fp8_fwd_TFLOPs")
    return (f"{KERNEL_NAMES[wanted]}, tiled, at {gpu_attention[f'{wanted}_fwd_TFLOPs']:g} / "
            f"{gpu_attention[f'{wanted}_bwd_TFLOPs']:g} TFLOP/s forward / backward"
            + (f" (FP8 forward {fp8:g})" if fp8 else "")
            + f" published at batch {shape.batch}, {shape.heads}/{shape.kv_heads} heads of "
              f"{shape.d_qk}, seqlen {shape.s_q}, no mask")


def rates_for(kernel: str, gpu_attention: dict, hbm_Bps: float, memory_efficiency: float,
              launch_s: float) -> AttentionRates:
    """A kernel's AttentionRates from a profile's [attention] values."""
    return AttentionRates(kernel, int(gpu_attention["sm_count"]), hbm_Bps, memory_efficiency,
                          launch_s, gpu_attention[f"{kernel}_fwd_TFLOPs"] * 1e12,
                          gpu_attention[f"{kernel}_bwd_TFLOPs"] * 1e12,
                          profile_reference(gpu_attention),
                          gpu_attention["int32_TOPS"] * 1e12 if "int32_TOPS" in gpu_attention
                          else None)


def profile_reference(gpu_attention: dict) -> AttentionShape | None:
    """The shape a profile's figures were measured at, where its [attention] section names one
    (reference_batch, _heads, _kv_heads, _seq, _head_dim; no mask), else None (the FA3 paper's
    reference_shape())."""
    if "reference_seq" not in gpu_attention:
        return None
    seq, dim = int(gpu_attention["reference_seq"]), int(gpu_attention["reference_head_dim"])
    return AttentionShape(int(gpu_attention["reference_batch"]),
                          int(gpu_attention["reference_heads"]),
                          int(gpu_attention["reference_kv_heads"]), seq, seq, dim, dim, False)


def shape_of(q_shape: tuple, kv_heads: int, s_k: int, d_v: int, causal: bool,
             dropout: bool = False) -> AttentionShape:
    """An AttentionShape from a (b, heads, s_q, d_qk) query tensor's shape."""
    b, heads, s_q, d_qk = q_shape
    return AttentionShape(b, heads, kv_heads, s_q, s_k, d_qk, d_v, causal, dropout)



@lru_cache(maxsize=64)
def attention_rates(gpu_name: str, backend: str, fp8: bool = False) -> AttentionRates | None:
    """The fused kernel `backend` runs on GPU profile `gpu_name`, with its figures; None for the
    unfused/local core and where the profile has no [attention] figures for that kernel (the
    core is then priced as GEMMs, simsp/model/blocks/attention/flash.py). Hopper and later:
    a GPU with FP8 tensor cores (profile_file.py LOWEST: they start at Hopper). `fp8`
    (--fp8-dot-product-attention): cuDNN's forward at its published FP8 figure
    (cudnn_fp8_fwd_TFLOPs) where the profile has one; its backward keeps the BF16 figure (no
    FP8 backward figure is published)."""
    from simsp.hardware.constants import compute_for
    from simsp.hardware.profiles import gpu_profile
    gpu = gpu_profile(gpu_name)
    kernel = kernel_for(backend, gpu.attention, gpu.peak_fp8_flops is not None)
    if kernel is None:
        return None
    cal = compute_for(gpu_name)
    rates = rates_for(kernel, gpu.attention, gpu.hbm_bandwidth_Bps, cal.memory_efficiency,
                      cal.launch_overhead_s)
    fp8_forward = gpu.attention.get(f"{kernel}_fp8_fwd_TFLOPs")
    if fp8 and fp8_forward is not None:
        return replace(rates, fwd_flops=fp8_forward * 1e12)
    return rates
