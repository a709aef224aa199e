"""Checks of training precision: FP8 GEMMs need FP8 tensor cores (Hopper and later), MXFP8
Blackwell (Transformer Engine transformer_engine/pytorch/fp8.py check_mxfp8_support); state
dtypes other than fp32 need the precision-aware optimizer (Megatron-LM arguments.py)."""

from simsp.hardware.profiles import gpu_profile
from simsp.scenario.checks.rule import check
from simsp.scenario.config import Cluster, Model, Parallel


def validate_precision(p: Parallel, c: Cluster) -> None:
    """FP8 on a GPU that has it; FP8 parameters only with FP8; reduced state dtypes only with
    the precision-aware optimizer."""
    if p.fp8_format is not None:
        gpu = gpu_profile(c.gpu)
        check(gpu.peak_fp8_flops is not None, "parallel.fp8_format",
              f"{gpu.name} has no FP8 tensor cores (FP8 GEMMs need Hopper or later: "
              f"h100-sxm-80gb, h200-sxm-141gb, b200, gb200)")
        check(p.fp8_recipe != "mxfp8" or gpu.nvlink_generation >= 5, "parallel.fp8_recipe",
              f"mxfp8 needs Blackwell (b200, gb200); {gpu.name} is not")
    check(not p.fp8_param_gather or p.fp8_format is not None, "parallel.fp8_param_gather",
          "needs fp8_format (FP8 parameters are FP8 training's)")
    for name in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        value = getattr(p, name)
        check(value == "fp32" or p.use_precision_aware_optimizer, f"parallel.{name}",
              f"{value} needs use_precision_aware_optimizer (Megatron-LM)")
    param_remainders(p)


def param_remainders(p: Parallel) -> None:
    """--store-param-remainders: the remainders of fp32 master weights (not of fp16 ones), in
    a distributed optimizer that keeps them (Apex DistributedFusedAdam: --bucket-cap-mb) or
    Megatron's TE FusedAdam (--use-precision-aware-optimizer)."""
    if not p.store_param_remainders:
        return
    name = "parallel.store_param_remainders"
    check(p.bucket_cap_mb is not None or p.use_precision_aware_optimizer, name,
          "needs bucket_cap_mb (Apex DistributedFusedAdam) or use_precision_aware_optimizer "
          "(Megatron's TE FusedAdam)")
    check(p.main_params_dtype == "fp32", name,
          f"keeps the remainders of fp32 master weights, not {p.main_params_dtype}")


def validate_fp8_attention(m: Model, p: Parallel) -> None:
    """FP8 attention is FP8 training's, in cuDNN's fused attention (Transformer Engine's
    FusedAttention: --attention-backend fused, or auto on Hopper; docs/attention_kernels.md)."""
    if not p.fp8_dot_product_attention:
        return
    check(p.fp8_format is not None, "parallel.fp8_dot_product_attention",
          "needs fp8_format (FP8 attention is FP8 training's)")
    check(m.attention_backend in ("fused", "auto"), "parallel.fp8_dot_product_attention",
          f"needs attention_backend fused or auto (cuDNN's FP8 attention), not "
          f"{m.attention_backend}")
