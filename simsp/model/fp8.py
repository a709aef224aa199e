"""FP8 linear layers as Transformer Engine runs them: quantize kernels, FP8 GEMMs, FP8 bytes.

Only the transformer layers' linear weights (QKV, attention projection, fc1, fc2: TE's
Linear/LayerNormLinear in Megatron-LM's TE spec) run in FP8; the attention batched GEMMs, the
output layer's logits and every element-wise op stay BF16. Per linear layer
(transformer_engine/pytorch/module/linear.py):
- forward: the input is quantized (a memory-bound kernel reading 2-byte BF16 and writing 1-byte
  FP8 per direction the backward needs), then the GEMM runs at the FP8 rate;
- backward: the output gradient is quantized once (E5M2 in `hybrid`, E4M3 otherwise; both
  directions: the data gradient and the weight gradient GEMMs), then both GEMMs run in FP8
  from the saved FP8 input and the cached FP8 weight;
- the weight is quantized once per iteration (is_first_microbatch), here timed with the
  optimizer step that produced it;
- bytes: simsp/scenario/precision.py (saved input 1 byte, weight copy beside the BF16 weight).
Kernel times: simsp.hardware.costmodel.gemm_seconds with the GPU's FP8 compute model.
"""

import numpy as np

from simsp.hardware.costmodel import accumulate_extra_bytes, gemm_operand_bytes, gemm_seconds

FP8_BYTES = 1
# The saved linear inputs (the blocks' stash names, simsp/model/blocks/) TE keeps in FP8.
FP8_SAVED_INPUTS = frozenset({"qkv_input", "proj_input", "fc1_input", "fc2_input"})


def _te_linear(name: str, shape) -> bool:
    """A weight TE runs as a linear layer: 2-D, or a dense gated fc1 (h, 2, f/t) whose GEMM
    sees (h, 2f/t); not the MoE router's, a plain torch linear (Megatron-LM
    megatron/core/transformer/moe/router.py), nor the experts' stacked weights."""
    if name.endswith(".router.weight"):
        return False
    return len(shape) == 2 or (len(shape) == 3 and name.endswith(".mlp.fc1.weight"))


def is_fp8_weight(w) -> bool:
    """A transformer layer's linear weight, or its main gradient (ledger key under
    weight.layers.N. or grad.layers.N.): TE runs its GEMMs in FP8."""
    key = w.key or ""
    return (key.endswith(".weight") and ("weight.layers." in key or "grad.layers." in key)
            and _te_linear(key, w.shape))


def is_fp8_param(name: str, shape) -> bool:
    """The same test on a canonical parameter name and shape, at allocation."""
    return name.startswith("layers.") and name.endswith(".weight") and _te_linear(name, shape)


def gemm(r, name: str, m: int, k: int, n: int, accumulator_bytes: int = 0):
    """An FP8 GEMM (m,k)x(k,n): 1-byte operands, BF16 output, at the FP8 rate. With
    `accumulator_bytes`, the output is accumulated into a tensor of that width instead (the
    weight gradient into the main gradient: read and written, accumulate_extra_bytes)."""
    yield from r.hold(name, "gemm", 2 * m * k * n, gemm_time(r, m, k, n, accumulator_bytes))


def gemm_time(r, m: int, k: int, n: int, accumulator_bytes: int = 0) -> float:
    """Seconds of an FP8 GEMM (m,k)x(k,n) alone on the GPU, accumulating into a tensor of
    `accumulator_bytes` per element if given."""
    extra = accumulate_extra_bytes(m, n, accumulator_bytes) if accumulator_bytes else 0
    return gemm_seconds(2 * m * k * n, gemm_operand_bytes(m, k, n, "fp8"), r.fp8.cal, (m, k, n),
                        extra_bytes=extra)


def wgrad_gemm(r, name: str, m: int, k: int, n: int):
    """The weight-gradient GEMM as TE runs it under Megatron's gradient_accumulation_fusion
    (TE `fuse_wgrad_accumulation`, transformer_engine/pytorch/module/linear.py:
    `accumulate=accumulate_wgrad_into_param_main_grad, out=weight.main_grad`): the (m, n)
    weight gradient is added into the main gradient (fp32 by default: 4 bytes read and 4
    written per element, beta = 1) rather than written once in BF16. Every micro-batch is
    timed as accumulating; TE's first micro-batch of an iteration (is_first_microbatch)
    writes without reading, 4 bytes less per element once per iteration."""
    yield from gemm(r, name, m, k, n, accumulator_bytes=r.precision.main_grad_bytes)


def quantize(r, name: str, numel: int):
    """Quantize `numel` BF16 elements to FP8 in the directions the backward needs."""
    nbytes = r.fp8.cast_bytes(numel, r.fp8.directions("input"))
    yield from r.compute(f"{name}_fp8_cast", "elementwise", nbytes=nbytes)


def normed_cast_bytes(r, numel: int) -> int:
    """What a norm fused with the following FP8 cast writes (TE LayerNormLinear's quantized
    norm, module/layernorm_linear.py with_quantized_norm): 1-byte data and scales per direction,
    row-wise only under SP (the direction TE all-gathers) and under TE 1.8."""
    rowwise = r.tp.sequence_parallel or r.fp8.norm_rowwise
    directions = 1 if rowwise else r.fp8.directions("input")
    return directions * (numel + r.fp8.scale_bytes(numel, "input"))


def gathered_transpose(r, name: str, numel: int):
    """Under SP, the column-wise copy of an all-gathered FP8 norm output when the GEMMs need
    it (Hopper per-tensor, the block recipes): a transpose kernel reading and writing 1 byte
    per element of the gathered tensor. TE 1.8 runs it in the backward (normed_transpose)."""
    if (r.tp.sequence_parallel and not r.fp8.norm_rowwise
            and r.fp8.directions("input") == 2):
        yield from r.compute(f"{name}_fp8_transpose", "elementwise", nbytes=2 * numel)


def normed_transpose(r, name: str, weight, numel: int):
    """TE 1.8's LayerNormLinear and LayerNormMLP backward (module/layernorm_linear.py,
    layernorm_mlp.py at v1.8: `ln_out_total_t = tex.fp8_transpose(ln_out_total, ...)` before
    the wgrad GEMM): the row-wise FP8 norm output (gathered under SP) transposed, reading and
    writing 1 byte per element, where the weight runs in FP8 and the GEMMs need the transpose."""
    if (r.fp8 is not None and r.fp8.norm_rowwise and is_fp8_weight(weight)
            and r.fp8.directions("input") == 2):
        yield from r.compute(f"{name}_fp8_transpose", "elementwise", nbytes=2 * numel)


def save_quantized(r, tensor, name: str):
    """Keep a linear input for backward as TE does: FP8, one direction, with its scales. The
    tensor is FP8 from here on (1-byte elements): under SP its all-gathers, forward and the
    backward's re-gather, move FP8, as TE's LayerNormLinear gathers the quantized LN output."""
    target = r._unique_key(r.key(name))
    now = r.env.now
    r.ledger.free(tensor.key, f"quantize {name}", now)
    r.ledger.alloc(target, r.fp8.saved_input_bytes(tensor.numel), "activations", name, now)
    tensor.key, tensor.itemsize = target, FP8_BYTES
    return tensor


def add_weight_copy(r, name: str, weight) -> None:
    """The FP8 weight TE caches for the iteration: beside the BF16 weight, or (FP8 parameters,
    --fp8-param-gather) in its place. Category: weights."""
    nbytes, now = r.fp8.weight_copy_bytes(weight.numel), r.env.now
    if r.fp8.param_gather:
        r.ledger.free(weight.key, f"fp8 param {name}", now)
        r.ledger.alloc(weight.key, nbytes, "weights", f"fp8 param {name}", now)
    else:
        r.ledger.alloc(r.scope + f"fp8_weight.{name}", nbytes, "weights", f"fp8 copy {name}", now)
    state = r.fp8.scaling_state_bytes()
    if state:  # the linear module's delayed-scaling buffers (amax history, scales)
        r.ledger.alloc(r.scope + f"fp8_meta.{name}", state, "weights", f"fp8 meta {name}", now)


def weight_cast_bytes(r, weights: dict) -> int:
    """Bytes the per-iteration weight quantization moves over this rank's FP8 weights."""
    return sum(r.fp8.cast_bytes(w.numel, r.fp8.directions("weight"))
               for w in weights.values() if is_fp8_weight(w))


# ---------------------------------------------------------------------------------------------
# Numeric mode: FP8 rounding emulated in float64 (verify measures the error it introduces)
# ---------------------------------------------------------------------------------------------

# format -> (mantissa bits, smallest normal exponent, largest finite value): OCP FP8 (E4M3FN:
# max 448, E5M2: max 57344), as TE's Format (transformer_engine/common/recipe/__init__.py)
FP8_FORMATS = {"e4m3": (3, -6, 448.0), "e5m2": (2, -14, 57344.0)}


def round_to_fp8(a: np.ndarray, fmt: str) -> np.ndarray:
    """`a` rounded to the nearest `fmt` value (ties to even; subnormals kept; saturating)."""
    mantissa, min_exp, largest = FP8_FORMATS[fmt]
    magnitude = np.abs(a)  # same shape as a
    exponent = np.maximum(np.floor(np.log2(np.where(magnitude > 0, magnitude, 1.0))), min_exp)
    quantum = np.exp2(exponent - mantissa)  # spacing of fmt values near each element
    rounded = np.minimum(np.round(magnitude / quantum) * quantum, largest)
    return np.copysign(rounded, a)


def emulate(a: np.ndarray, fmt: str) -> np.ndarray:
    """Quantize-dequantize with one per-tensor scale from the tensor's own amax (TE's current
    scaling, tensorwise): a x s rounded to `fmt`, divided by s, s = largest / amax."""
    amax = float(np.max(np.abs(a))) if a.size else 0.0
    if amax == 0.0 or not np.isfinite(amax):
        return a
    scale = FP8_FORMATS[fmt][2] / amax
    return round_to_fp8(a * scale, fmt) / scale


def backward_format(r) -> str:
    """Gradients: E5M2 under hybrid, E4M3 under e4m3 (TE Format.HYBRID / Format.E4M3)."""
    return "e5m2" if r.fp8.fmt == "hybrid" else "e4m3"
