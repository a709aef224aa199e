"""Every check of a scenario: the per-field limits of the table (scenario/limits.py), then the
cross-field checks, one module per concept, in a fixed order (the first failure is the error).

A new cross-field rule goes into its concept's module and is called from here.
"""

from simsp.scenario.checks.context_parallel import context_parallel, without_context_parallel
from simsp.scenario.checks.cuda_graphs import cuda_graphs
from simsp.scenario.checks.data_parallel import (
    apex_buckets, average_in_collective, buckets, distributed_optimizer_mode, grad_reduce_in_bf16,
    overlap_param_gather, overlap_param_gather_with_optimizer_step)
from simsp.scenario.checks.fsdp import fsdp, offload_host_link, without_fsdp
from simsp.scenario.checks.hardware import validate_cluster
from simsp.scenario.checks.layout import (global_batch, sequence_parallel, tensor_parallel,
                                          tp_comm_overlap)
from simsp.scenario.checks.model import validate_model
from simsp.scenario.checks.moe import expert_comm_overlap, expert_parallel
from simsp.scenario.checks.partners import partners
from simsp.scenario.checks.pipeline import overlap_p2p, schedule, stage_split
from simsp.scenario.checks.precision import validate_fp8_attention, validate_precision
from simsp.scenario.checks.recompute import recompute_method, recompute_modules
from simsp.scenario.checks.run import routing_model_mode, run_name
from simsp.scenario.config import SECTIONS, Model, Parallel, Scenario
from simsp.scenario.limits import check_choices, check_ranges


def validate_parallel(m: Model, p: Parallel) -> None:
    """Cross-field checks between the model and the parallel layout."""
    buckets(p)
    tensor_parallel(m, p)
    expert_parallel(m, p)
    without_context_parallel(m, p)
    without_fsdp(m, p)
    sequence_parallel(m, p)
    context_parallel(m, p)
    stage_split(m, p)
    global_batch(p)
    schedule(m, p)
    fsdp(m, p)
    overlap_p2p(p)
    overlap_param_gather(p)
    overlap_param_gather_with_optimizer_step(p)
    average_in_collective(m, p)
    grad_reduce_in_bf16(p)
    apex_buckets(m, p)
    recompute_method(m, p)
    recompute_modules(p, m.num_experts is not None)
    expert_comm_overlap(m, p)
    partners(m, p)
    cuda_graphs(m, p)


def validate(s: Scenario) -> None:
    """Every field finite, in range and one of its choices (simsp.scenario.limits), then every
    cross-field check; raises UserError naming the first bad field."""
    sections = {name: getattr(s, name) for name in SECTIONS}
    check_ranges(sections)
    check_choices(sections)
    validate_model(s.model)
    validate_parallel(s.model, s.parallel)
    validate_cluster(s.cluster, s.parallel)
    validate_precision(s.parallel, s.cluster)
    validate_fp8_attention(s.model, s.parallel)
    tp_comm_overlap(s)
    run_name(s)
    offload_host_link(s)
    distributed_optimizer_mode(s)
    routing_model_mode(s)
