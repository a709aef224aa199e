"""Checks of data parallelism's gradient buckets and overlap, and of the distributed optimizer
(Megatron-LM arguments.py, distributed_data_parallel.py)."""

from simsp.scenario.checks.rule import check, positive
from simsp.scenario.config import Model, Parallel, Scenario


def buckets(p: Parallel) -> None:
    """--ddp-bucket-size, where given, is a positive number of parameters."""
    positive("parallel", p, ("ddp_bucket_size",))


def overlap_param_gather(p: Parallel) -> None:
    """Megatron-LM's check (arguments.py): the parameter all-gather overlaps only the
    distributed optimizer's, with overlapped gradient reduction."""
    check(not p.overlap_param_gather or (p.distributed_optimizer and p.overlap_grad_reduce),
          "parallel.overlap_param_gather", "needs distributed_optimizer and overlap_grad_reduce")


def overlap_param_gather_with_optimizer_step(p: Parallel) -> None:
    """Megatron-LM's checks (megatron/training/arguments.py at d98e8a64, in its order): the
    distributed optimizer, --overlap-param-gather, interleaved pipeline parallelism; then
    simsp's own: not modelled with FSDP. (Megatron also refuses distributed checkpointing,
    --ckpt-format other than torch: simsp saves no checkpoint.)"""
    if not p.overlap_param_gather_with_optimizer_step:
        return
    name = "parallel.overlap_param_gather_with_optimizer_step"
    check(p.distributed_optimizer, name, "only supported with distributed optimizer")
    check(p.overlap_param_gather, name, "needs overlap_param_gather")
    check(p.schedule_name == "interleaved", name,
          "only supported with interleaved pipeline parallelism")
    check(p.fsdp is None, name, "is not modelled with FSDP")


def average_in_collective(m: Model, p: Parallel) -> None:
    """--ddp-average-in-collective: Megatron-LM refuses it with per-token loss and GTP
    (distributed_data_parallel.py, arguments.py at d98e8a64; simsp has neither); simsp
    models it for Megatron's DDP buckets only, not for FSDP's, and not for expert weights no
    other rank holds (expert data-parallel size t·d·cp / (etp·ep) of 1 under d·cp > 1:
    Megatron still scales them by 1/(d·cp), simsp has no bucket to do it in)."""
    if not p.ddp_average_in_collective:
        return
    name = "parallel.ddp_average_in_collective"
    check(p.fsdp is None, name, "is not modelled with FSDP")
    edp = p.tp * p.dp * p.cp // (p.etp * p.ep)
    check(m.num_experts is None or edp > 1 or p.dp * p.cp == 1, name,
          "is not modelled when each expert weight is on one data-parallel rank (edp = 1)")


def grad_reduce_in_bf16(p: Parallel) -> None:
    """--grad-reduce-in-bf16: modelled for Megatron's DDP gradient buffers, not for FSDP's
    (simsp's own limit; Megatron-LM accepts it with its FSDP)."""
    check(not p.grad_reduce_in_bf16 or p.fsdp is None, "parallel.grad_reduce_in_bf16",
          "is not modelled with FSDP")


def apex_buckets(m: Model, p: Parallel) -> None:
    """--bucket-cap-mb (Apex DistributedFusedAdam, a ZeRO optimizer: training/data_parallel/
    apex_buckets.py) with the distributed optimizer, not beside Megatron's own bucket settings;
    simsp models it for dense models without FSDP."""
    if p.bucket_cap_mb is None:
        return
    name = "parallel.bucket_cap_mb"
    check(p.distributed_optimizer, name, "needs distributed_optimizer (Apex shards its state)")
    check(p.ddp_bucket_size is None, name, "replaces ddp_bucket_size: give one of them")
    check(not p.overlap_param_gather_with_optimizer_step, name,
          "is not modelled with overlap_param_gather_with_optimizer_step")
    check(p.fsdp is None, name, "is not modelled with FSDP")
    check(m.num_experts is None, name, "is not modelled with experts")


def distributed_optimizer_mode(s: Scenario) -> None:
    """The distributed optimizer (without FSDP) is modelled in meta mode only."""
    check(not (s.parallel.distributed_optimizer and s.run.mode == "numeric"
               and s.parallel.fsdp is None),
          "parallel.distributed_optimizer", "is modelled in meta mode only (use --mode meta)")
