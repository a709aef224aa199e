"""Checks of the cluster: known GPU and system profiles, link efficiencies, and room for every
rank of the layout."""

from simsp.hardware.cluster_hardware import fabric_of
from simsp.hardware.profiles import gpu_profile, system_profile
from simsp.scenario.checks.rule import check
from simsp.scenario.config import Cluster, Parallel


def validate_cluster(c: Cluster, p: Parallel) -> None:
    """The cluster must exist and hold every rank."""
    gpu = gpu_profile(c.gpu)  # a known GPU profile (or a readable file): else one error line
    check(not c.sm_contention or "sm_count" in gpu.attention, "cluster.sm_contention",
          f"GPU profile {gpu.name} gives no [attention] sm_count (the SMs contention divides)")
    if c.system is not None:
        system_profile(c.system)
    check(not c.use_sharp or fabric_of(c).sharp_generation is not None, "cluster.use_sharp",
          "needs a system whose switches have SHARP ([fabric] sharp_generation), e.g. --system "
          f"dgx-h100; {f'system {c.system}' if c.system else 'a cluster without --system'} "
          "has none")
    for name in ("nvlink_efficiency", "ib_efficiency"):
        check(0 < getattr(c, name) <= 1, f"cluster.{name}", "must be in (0, 1]")
    check(p.world_size <= c.num_gpus, "cluster.nodes",
          f"the layout needs {'t*cp*p*d' if p.cp > 1 else 't*p*d'}={p.world_size} GPUs but "
          f"{c.nodes} node(s) of "
          f"{c.gpus_per_node} hold {c.num_gpus}")
