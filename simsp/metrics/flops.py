"""One iteration's FLOPs: the closed-form model and hardware FLOPs MFU and HFU divide, as K22 §6.3
does (docs/MODEL.md#flops) or by Megatron's count for MoE/MLA/MTP models, and the FLOPs the
simulated GEMMs counted."""

from simsp import analytic
from simsp.model.flops import megatron_flops, recomputed_flops


def counted_flops(run) -> tuple[float, float]:
    """GEMM FLOPs the simulation counted, over all ranks: (model, model + recompute)."""
    ranks = run.inputs.world.ranks
    represented = run.inputs.sc.parallel.world_size / len(ranks)  # each stands for this many
    model = hardware = 0.0
    for r in ranks.values():
        model += (r.flops["forward"] + r.flops["backward"]) * represented
        hardware += (r.flops["forward"] + r.flops["backward"] + r.flops["recompute"]) * represented
    return model, hardware


def sparse_or_latent(m) -> bool:
    """Whether the model has MoE layers, multi-latent attention or multi-token prediction
    (docs/moe.md, docs/mla.md, docs/mtp.md): its FLOPs are Megatron's count and its reports give
    total and active parameters."""
    return m.num_experts is not None or m.multi_latent_attention or bool(m.mtp_num_layers)


def model_flops(sc) -> float:
    """Model FLOPs of one iteration: K22's or Megatron's dense formula (analytic.py), or for
    MoE/MLA models Megatron's count with top-k routed and shared experts and MLA
    (model/flops.py)."""
    m, p = sc.model, sc.parallel
    if sparse_or_latent(m):
        return megatron_flops(m, p.global_batch, sc.padded_vocab_size)
    return analytic.iteration_model_flops(m, p)


def hardware_flops(sc) -> float:
    """Model FLOPs plus what recompute and FlashAttention's backward compute again."""
    m, p = sc.model, sc.parallel
    if sparse_or_latent(m):
        return model_flops(sc) + recomputed_flops(m, p.global_batch, p.recompute_module_set,
                                                  analytic.recomputed_layers(m, p))
    return analytic.iteration_hardware_flops(m, p)
