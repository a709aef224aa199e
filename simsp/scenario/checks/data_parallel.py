"""Checks of data parallelism's gradient buckets and overlap, and of the distributed optimizer
(Megatron-LM arguments.py, distributed_data_parallel.py)."""

from simsp.scenario.checks.rule import check, positive
from simsp.scenario.config import Parallel, Scenario


def buckets(p: Parallel) -> None:
    """--ddp-bucket-size, where given, is a positive number of parameters."""
    positive("parallel", p, ("ddp_bucket_size",))


def overlap_param_gather(p: Parallel) -> None:
    """Megatron-LM's check (arguments.py): the parameter all-gather overlaps only the
    distributed optimizer's, with overlapped gradient reduction."""
    check(not p.overlap_param_gather or (p.distributed_optimizer and p.overlap_grad_reduce),
          "parallel.overlap_param_gather", "needs distributed_optimizer and overlap_grad_reduce")


def distributed_optimizer_mode(s: Scenario) -> None:
    """The distributed optimizer (without FSDP) is modelled in meta mode only."""
    check(not (s.parallel.distributed_optimizer and s.run.mode == "numeric"
               and s.parallel.fsdp is None),
          "parallel.distributed_optimizer", "is modelled in meta mode only (use --mode meta)")
