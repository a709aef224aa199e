"""Training precision: FP8 GEMMs as Transformer Engine runs them, and optimizer-state dtypes.

Bytes follow Transformer Engine (NVIDIA/TransformerEngine, files named per rule) and
Megatron-LM's precision-aware optimizer (docs/hardware.md works a layer by hand):
- A quantized tensor holds 1-byte data per direction it is used in: row-wise for the forward
  GEMM, column-wise (the transpose) for the backward ones. Per-tensor recipes (delayed,
  tensorwise) keep `_data` and, on Hopper whose FP8 GEMMs take only the TN layout, `_transpose`
  (transformer_engine/pytorch/tensor/storage/float8_tensor_storage.py; Blackwell needs no
  transpose, tensor/float8_tensor.py is_non_tn_fp8_gemm_supported) plus one fp32 scale.
  Blockwise keeps both directions with fp32 scales per 1x128 block (activations, gradients) or
  128x128 block (weights) (tensor/float8_blockwise_tensor.py; common/recipe/__init__.py
  Float8BlockScaling x/w_block_scaling_dim); MXFP8 both directions with a 1-byte E8M0 scale per
  32 elements (tensor/mxfp8_tensor.py).
- Weights: the FP8 copy (both directions, cached across micro-batches) lives beside the BF16
  weight (module/linear.py quantize_weight with the weight workspace), unless FP8 parameters
  (Megatron --fp8-param-gather) replace the BF16 weight.
- A linear layer's input is saved for backward in FP8, one direction (module/linear.py: "Discard
  row-wise data since it is not needed in backward pass").
"""

from dataclasses import dataclass

from simsp.hardware.constants import ComputeCalibration, compute_for
from simsp.hardware.profiles import gpu_profile

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
# --store-param-remainders: an int16 per master weight (NVIDIA/apex apex/contrib/optimizers/
# distributed_fused_adam.py, StateBucket `param_remainders_shard`, torch.int16, in place of
# the fp32 `params_shard`; Megatron-Core distrib_optimizer.py: `init_shard(torch.int16)`)
REMAINDER_BYTES = 2
# NeMo's with_fp32_embedding_grads (default True): megatron_gpt_model.py configure_optimizers
# marks the word and position embeddings `_with_fp32_optimizer`, and nemo/core/optim/
# distributed_adam.py init_params_bucket gives them buckets of grad_sync_dtype fp32, their
# gradient buffer fp32 (NeMo r2.0.0rc1): under Apex (--bucket-cap-mb) their main gradients
APEX_FP32_GRAD_PARAMS = frozenset({"embedding.word", "embedding.position"})
BLOCK = 128  # Float8BlockScaling block length
MX_BLOCK = 32  # MXFP8_BLOCK_SCALING_SIZE
SCALE_BYTES = {"fp32": 4, "e8m0": 1}


@dataclass(frozen=True)
class Fp8:
    """One run's FP8 settings and the GPU facts that size its tensors."""

    fmt: str  # e4m3 | hybrid
    recipe: str  # delayed | tensorwise | blockwise | mxfp8
    param_gather: bool
    tn_only: bool  # Hopper: FP8 GEMMs take only TN, so per-tensor weights keep a transpose
    cal: ComputeCalibration  # FP8 GEMM rates
    amax_history_len: int = 1  # delayed scaling's amax history, steps
    norm_rowwise: bool = False  # TE 1.8: FP8 norm output row-wise, transposed in the backward

    def scaling_state_bytes(self) -> int:
        """Delayed scaling's state of one TE linear module (one GEMM): forward 3 quantizers
        (input, weight, output), backward 2 (grad_output, grad_input), each with an fp32 amax
        history of `amax_history_len` rows and an fp32 scale (transformer_engine/pytorch/
        module/base.py set_meta_tensor, fp8.py DelayedScalingRecipeState); 0 otherwise."""
        if self.recipe != "delayed":
            return 0
        quantizers = 3 + 2
        return SCALE_BYTES["fp32"] * quantizers * (self.amax_history_len + 1)

    def directions(self, kind: str = "weight") -> int:
        """Copies a tensor the backward also reads needs: 2 (row-wise and column-wise) for the
        block recipes and for per-tensor ones on Hopper (the transpose); 1 on Blackwell."""
        if self.recipe in ("blockwise", "mxfp8"):
            return 2
        return 2 if self.tn_only else 1

    def scale_bytes(self, numel: int, kind: str) -> int:
        """Scale bytes of one direction of a tensor of `numel` elements (kind weight|input)."""
        if self.recipe == "mxfp8":
            return -(-numel // MX_BLOCK) * SCALE_BYTES["e8m0"]
        if self.recipe == "blockwise":
            block = BLOCK * BLOCK if kind == "weight" else BLOCK
            return -(-numel // block) * SCALE_BYTES["fp32"]
        return SCALE_BYTES["fp32"]

    def weight_copy_bytes(self, numel: int) -> int:
        """An FP8 weight as cached for the iteration: data and scales per direction."""
        return self.directions("weight") * (numel + self.scale_bytes(numel, "weight"))

    def saved_input_bytes(self, numel: int) -> int:
        """A linear input saved for backward: one direction, with its scales."""
        return numel + self.scale_bytes(numel, "input")

    def cast_bytes(self, numel: int, directions: int) -> int:
        """A quantize kernel: reads 2-byte BF16, writes 1-byte data (+scales) per direction."""
        return 2 * numel + directions * (numel + self.scale_bytes(numel, "input"))


@dataclass(frozen=True)
class Precision:
    """Bytes per element of main gradients and optimizer states; FP8 settings or None."""

    main_grad_bytes: int = 4
    state_bytes: tuple = (("master", 4), ("adam_m", 4), ("adam_v", 4))
    fp8: Fp8 | None = None
    param_remainders: bool = False  # master = the fp32 master's 16 low bits (the BF16 weight's
    # 16 high bits complete it): --store-param-remainders
    fp32_grads: frozenset = frozenset()  # parameters whose main gradient is fp32 whatever the rest

    def grad_bytes(self, name: str) -> int:
        """Bytes per main-gradient element of parameter `name`."""
        return DTYPE_BYTES["fp32"] if name in self.fp32_grads else self.main_grad_bytes

    def state(self, name: str) -> int:
        return dict(self.state_bytes)[name]


DEFAULT = Precision()


def precision_of(sc) -> Precision:
    """The scenario's precision (DEFAULT when it states none)."""
    p = sc.parallel
    fp8 = None
    if p.fp8_format is not None:
        gpu = gpu_profile(sc.cluster.gpu)
        fp8 = Fp8(p.fp8_format, p.fp8_recipe, p.fp8_param_gather, gpu.nvlink_generation < 5,
                  compute_for(sc.cluster.gpu, fp8=True), p.fp8_amax_history_len,
                  p.te_version == "1.8")
    master = REMAINDER_BYTES if p.store_param_remainders else DTYPE_BYTES[p.main_params_dtype]
    states = (("master", master),
              ("adam_m", DTYPE_BYTES[p.exp_avg_dtype]), ("adam_v", DTYPE_BYTES[p.exp_avg_sq_dtype]))
    fp32_grads = APEX_FP32_GRAD_PARAMS if p.bucket_cap_mb is not None else frozenset()
    result = Precision(main_grad_bytes(p), states, fp8, p.store_param_remainders, fp32_grads)
    return DEFAULT if result == DEFAULT else result


def main_grad_bytes(p) -> int:
    """Bytes per main-gradient element, Megatron DDP's gradient buffer: BF16 under
    --grad-reduce-in-bf16 (megatron/training/arguments.py sets accumulate_allreduce_grads_in_fp32
    False; distributed_data_parallel.py: `grad_dtype = torch.float if grad_reduce_in_fp32 else
    param.dtype`), else --main-grads-dtype (fp32 by default)."""
    return DTYPE_BYTES["bf16"] if p.grad_reduce_in_bf16 else DTYPE_BYTES[p.main_grads_dtype]


def grad_reduce_bytes(p) -> int:
    """Bytes per element of the data-parallel gradient reduction: fp32 with
    --accumulate-allreduce-grads-in-fp32 (the default), BF16 without it or under
    --grad-reduce-in-bf16 (the buffer itself is reduced, in place)."""
    fp32 = p.accumulate_allreduce_grads_in_fp32 and not p.grad_reduce_in_bf16
    return DTYPE_BYTES["fp32"] if fp32 else DTYPE_BYTES["bf16"]
