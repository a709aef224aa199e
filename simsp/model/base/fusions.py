"""Megatron-LM's kernel fusions: the element-wise kernels an op runs fused or unfused, as the
bytes each kernel reads and writes (docs/fusions.md works them by hand).

Each function returns one byte count per kernel, in launch order; the op prices each at the
GPU's streaming rate plus one launch (simsp/hardware/costmodel.py kernel_time). A fused op is
one kernel that reads its inputs and writes its output once; unfused, PyTorch's eager kernels
each read and write their whole operands. Sources, per op:
- bias + GeLU / SwiGLU: megatron/core/transformer/mlp.py MLP.forward (bias_gelu_impl,
  bias_swiglu_impl when fused; else `x + bias`, then F.gelu or glu = silu(x[0]) * x[1]);
  megatron/core/fusions/fused_bias_gelu.py, fused_bias_swiglu.py;
- scale + mask + softmax: megatron/core/fusions/fused_softmax.py FusedScaleMaskSoftmax
  (forward_fused_softmax, else forward_torch_softmax: mask_func then torch.nn.Softmax);
- RoPE: megatron/core/models/common/embeddings/rope_utils.py (fused_apply_rotary_pos_emb,
  else _apply_rotary_pos_emb_bshd: t * cos + _rotate_half(t) * sin, then cat with t_pass);
- cross-entropy: megatron/core/fusions/fused_cross_entropy.py (the jit-fused steps) and
  megatron/core/tensor_parallel/cross_entropy.py (the eager steps), both on fp32 logits.
"""


def bias_activation_forward(x_bytes: int, gated: bool, fused: bool, biased: bool) -> tuple:
    """Bias + activation on fc1's output of `x_bytes` (2f' wide gated, else f'): fused one
    kernel reads x, writes the output (half of x gated); unfused a bias add (read x, write x)
    when there is a bias, then GeLU (read x, write x) or silu(gate) (read x/2, write x/2) and
    the product with up (read x, write x/2)."""
    out = x_bytes // 2 if gated else x_bytes
    if fused:
        return (x_bytes + out,)
    bias_add = (2 * x_bytes,) if biased else ()
    if gated:
        return bias_add + (x_bytes, x_bytes + x_bytes // 2)
    return bias_add + (2 * x_bytes,)


def bias_activation_backward(x_bytes: int, gated: bool, fused: bool) -> tuple:
    """The activation's backward at its kept input of `x_bytes`: fused one kernel reads dy and
    x, writes dx; unfused GeLU the same one kernel (F.gelu's backward); unfused SwiGLU
    autograd's kernels: d up = dy · silu(gate) and d silu = dy · up (each reads two halves,
    writes one), silu's backward (reads two halves, writes one), the chunk's backward (a cat:
    reads and writes x)."""
    dy = x_bytes // 2 if gated else x_bytes
    if fused or not gated:
        return (dy + 2 * x_bytes,)
    half = x_bytes // 2
    return (3 * half, 3 * half, 3 * half, 2 * x_bytes)


def masked_softmax_forward(scores_bytes: int, fused: bool) -> tuple:
    """Scale, causal mask and softmax over the s × s scores (16-bit): fused one kernel reads
    and writes them; unfused masked_fill (read, write), then softmax (read, write). The scale
    is the score GEMM's alpha either way (baddbmm); the boolean mask's reads are not counted."""
    return (2 * scores_bytes,) if fused else (2 * scores_bytes, 2 * scores_bytes)


def masked_softmax_backward(scores_bytes: int, fused: bool) -> tuple:
    """Fused: reads dy and y, writes dx; unfused the softmax backward (the same) and
    masked_fill's backward (read, write)."""
    return (3 * scores_bytes,) if fused else (3 * scores_bytes, 2 * scores_bytes)


def rope_forward(x_bytes: int, rotated_bytes: int, fused: bool) -> tuple:
    """RoPE on q or k of `x_bytes`, `rotated_bytes` of it rotated (rotary_percent): fused one
    kernel reads and writes x; unfused on the rotated part -x2 (read, write half), the
    cat of _rotate_half (read, write), t · cos, rotated · sin (read, write each), their sum
    (read two, write one), then the cat with the pass-through part (read, write x)."""
    if fused:
        return (2 * x_bytes,)
    xr = rotated_bytes
    return (xr, 2 * xr, 2 * xr, 2 * xr, 3 * xr, 2 * x_bytes)


def rope_backward(x_bytes: int, rotated_bytes: int, fused: bool) -> tuple:
    """Fused one kernel reads dy, writes dx; unfused autograd: dy · cos and dy · sin (read,
    write each), the negation's backward (half), the rotate's chunk backward (a cat: read,
    write) and the two paths' sum (read two, write one); the cat's and slices' backwards are
    views."""
    if fused:
        return (2 * x_bytes,)
    xr = rotated_bytes
    return (2 * xr, 2 * xr, xr, 2 * xr, 3 * xr)


def cross_entropy_forward(logits_fp32_bytes: int, fused: bool) -> tuple:
    """The loss on the fp32 logits of `logits_fp32_bytes` (the fp32 cast itself, reading the
    16-bit logits, is the op before): fused exp(x - max) in place (read, write), the row sum
    (read), the division by it in place (read, write); unfused the max (read), the subtraction
    in place (read, write), exp in place (read, write), the sum (read), the division (read,
    write). The fused cast computes the max in its pass (calculate_logits_max under jit)."""
    e = logits_fp32_bytes
    if fused:
        return (2 * e, e, 2 * e)
    return (e, 2 * e, 2 * e, e, 2 * e)


def cross_entropy_backward(logits_fp32_bytes: int) -> tuple:
    """Fused or not: the softmax scaled by the loss gradient in place (read, write fp32), then
    cast to the logits' 16-bit dtype (read fp32, write 16-bit) for the output layer."""
    e = logits_fp32_bytes
    return (2 * e, e + e // 2)
