"""Checks of sharded data parallelism (Megatron-FSDP, PyTorch FSDP2) and activation offload:
Megatron-LM's own (arguments.py, transformer_config.py) and what simsp does not model with them
yet (docs/fsdp.md)."""

from simsp.hardware.profiles import gpu_profile
from simsp.scenario.checks.rule import check
from simsp.scenario.config import Model, Parallel, Scenario


def without_fsdp(m: Model, p: Parallel) -> None:
    """Multi-token prediction runs without FSDP."""
    check(m.mtp_num_layers is None or p.fsdp is None, "parallel.use_megatron_fsdp",
          "FSDP with multi-token prediction is not modelled yet")


def fsdp(m: Model, p: Parallel) -> None:
    """One FSDP at a time, a sharding strategy only with Megatron-FSDP, no MoE or FP8 with it;
    then the offload checks."""
    check(not (p.use_megatron_fsdp and p.use_torch_fsdp2), "parallel.use_torch_fsdp2",
          "choose one of use_megatron_fsdp and use_torch_fsdp2")
    check(p.use_megatron_fsdp or p.data_parallel_sharding_strategy == "no_shard",
          "parallel.data_parallel_sharding_strategy", "needs use_megatron_fsdp")
    if p.fsdp is not None:
        check(m.num_experts is None, "parallel.use_megatron_fsdp",
              "FSDP with MoE layers is not modelled yet")
        check(p.fp8_format is None, "parallel.use_megatron_fsdp",
              "FSDP with FP8 parameters is not modelled yet")
    offload(m, p)


def offload(m: Model, p: Parallel) -> None:
    """--cpu-offloading-num-layers needs --cpu-offloading, stays below L, and Megatron offloads
    without pipeline parallelism or recompute (transformer_config.py)."""
    if not p.cpu_offloading:
        check(p.cpu_offloading_num_layers == 0, "parallel.cpu_offloading_num_layers",
              "needs cpu_offloading")
        return
    check(p.cpu_offloading_num_layers < m.num_layers, "parallel.cpu_offloading_num_layers",
          f"must be below num_layers={m.num_layers} (Megatron transformer_config.py)")
    check(p.pp == 1, "parallel.cpu_offloading",
          "Megatron: no support for pipeline parallelism with CPU offloading")
    check(p.recompute_granularity == "none", "parallel.cpu_offloading",
          "Megatron: CPU offloading does not work with activation recomputation")


def offload_host_link(s: Scenario) -> None:
    """Offloaded activations cross the host link: the GPU profile must give its speed."""
    check(not s.parallel.cpu_offloading or gpu_profile(s.cluster.gpu).host_link_GBps,
          "parallel.cpu_offloading", f"GPU profile {s.cluster.gpu} has no host_link_GBps")
