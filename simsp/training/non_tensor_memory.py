"""The non-tensor memory of one rank, itemised and sourced (docs/non_tensor_memory.md): what a
GPU holds besides the tensors the ledger counts, and what "fits" (simsp/memory_verdict.py)
leaves free unless `--memory-reserve` overrides it.

Items: the CUDA context with its kernel images and the cuBLAS/cuBLASLt workspaces (the GPU
profile's `cuda_context_MiB`, `cublas_workspace_MiB`); NCCL's buffers for each communicator the
layout has (simsp/engine/collectives/nccl_buffers.py); and the caching allocator's
fragmentation: a judged allowance, or the modelled one where `run --caching-allocator`
replays the ledger. No cuDNN workspace (simsp's attention is flash or unfused, never cuDNN)
and Transformer Engine's userbuffers under `--tp-comm-overlap` (scenario/tp_overlap.py).
"""

from typing import NamedTuple

from simsp.cluster.expert_grid import ExpertGrid
from simsp.cluster.grid import RankGrid
from simsp.engine.collectives.nccl_buffers import p2p_bytes, ring_bytes
from simsp.engine.collectives.nccl_platform import Platform, platform_of
from simsp.hardware.cluster_hardware import cpu_vendor
from simsp.hardware.profiles import gpu_profile
from simsp.scenario.tp_overlap import ub_gemms, userbuffers_bytes
from simsp.units import GiB, MiB

FRAGMENTATION_ALLOWANCE = 2 * GiB  # a judgement: 2.5% of an 80 GiB GPU (docs/non_tensor_memory.md)
FALLBACK_CONTEXT_MIB = 723.0  # discuss.pytorch.org/t/73021, for a GPU profile without one
FALLBACK_CUBLAS_MIB = 33.0  # the larger (Hopper) default of CublasHandlePool.cpp, as above
NCCL_SOURCE = "NVIDIA/nccl v2.30.7 src/init.cc, src/transport/p2p.cc, net.cc"


class NonTensorItem(NamedTuple):
    """One line of the non-tensor memory: its name, bytes and where the figure comes from."""

    name: str
    bytes: float
    source: str


def _profile_item(name: str, sourced, fallback_mib: float) -> NonTensorItem:
    """A GPU profile's MiB figure as an item (the fallback, so labelled, when it has none)."""
    if sourced is None:
        return NonTensorItem(name, fallback_mib * MiB, "simsp's fallback: the profile gives none "
                                                       "(docs/non_tensor_memory.md)")
    return NonTensorItem(name, sourced.value * MiB, sourced.source)


def _span(group: tuple, per_node: int) -> tuple[int, int]:
    """(nodes, ranks per node) of a group of ranks."""
    nodes = len({rank // per_node for rank in group})
    return nodes, max(1, len(group) // nodes)


def _ring_item(name: str, group: tuple, cluster) -> NonTensorItem | None:
    """A collective communicator's ring buffers, None for a group of one rank."""
    if len(group) < 2:
        return None
    nodes, per_node = _span(group, cluster.gpus_per_node)
    return NonTensorItem(name, ring_bytes(nodes, per_node, cluster.nvlink_bandwidth_GBps,
                                          cluster.ib_bandwidth_GBps, _platform(cluster)),
                         NCCL_SOURCE)


def _platform(cluster) -> Platform:
    """The platform NCCL tunes for on this cluster: its GPU's architecture, its host CPU."""
    return platform_of(gpu_profile(cluster.gpu).nvlink_generation, cpu_vendor(cluster))


def _p2p_item(name: str, group: tuple, peers: tuple, cluster) -> NonTensorItem | None:
    """A send/recv communicator's buffers for rank group[0]'s `peers`, None without peers."""
    if not peers:
        return None
    per_node = cluster.gpus_per_node
    local = sum(1 for peer in peers if peer // per_node == group[0] // per_node)
    nodes, ranks_per_node = _span(group, per_node)
    return NonTensorItem(name, p2p_bytes(local, len(peers) - local, nodes, ranks_per_node,
                                         cluster.nvlink_bandwidth_GBps,
                                         cluster.ib_bandwidth_GBps, _platform(cluster)),
                         NCCL_SOURCE)


def _pipeline_peers(group: tuple) -> tuple:
    """Rank group[0]'s pipeline neighbours: the next stage and (wrapping) the previous one."""
    return tuple(sorted({group[1 % len(group)], group[-1]} - {group[0]}))


def nccl_items(sc) -> list[NonTensorItem]:
    """NCCL's buffers for rank 0's communicators: TP, CP, DP (with CP), PP, EP and expert DP."""
    p, cluster = sc.parallel, sc.cluster
    grid = RankGrid(p.tp, p.pp, p.dp, p.cp)
    items = [_ring_item("nccl_tp", grid.tp_group(0), cluster),
             _ring_item("nccl_cp", grid.cp_group(0), cluster),
             _ring_item("nccl_dp", grid.dp_cp_group(0), cluster)]
    pipeline = grid.pp_group(0)
    items.append(_p2p_item("nccl_pp", pipeline, _pipeline_peers(pipeline), cluster))
    if sc.model.num_experts:
        experts = ExpertGrid(p.tp, p.pp, p.dp * p.cp, p.ep, p.etp)
        ep_group = experts.group("ep", 0)
        items.append(_p2p_item("nccl_ep", ep_group, ep_group[1:], cluster))
        items.append(_ring_item("nccl_expert_dp", experts.group("edp", 0), cluster))
    return [item for item in items if item is not None]


def te_userbuffers_bytes(sc) -> int:
    """Transformer Engine's userbuffers for TP communication overlap, registered once per rank
    for its TP group (scenario/tp_overlap.py userbuffers_bytes); none without the overlap."""
    p = sc.parallel
    if not p.tp_comm_overlap:
        return 0
    tokens = sc.model.seq_length * p.micro_batch_size // p.cp
    return userbuffers_bytes(ub_gemms(p.tp, p.tp_comm_overlap_cfg), tokens,
                             sc.model.hidden_size, p.fp8_format is not None, p.tp)


def non_tensor_items(sc, fragmentation_bytes: float | None = None) -> list[NonTensorItem]:
    """Every item for the scenario's layout; `fragmentation_bytes` the modelled fragmentation
    (run --caching-allocator), else the judged allowance."""
    gpu = gpu_profile(sc.cluster.gpu)
    items = [_profile_item("cuda_context", gpu.cuda_context, FALLBACK_CONTEXT_MIB),
             _profile_item("cublas_workspace", gpu.cublas_workspace, FALLBACK_CUBLAS_MIB),
             *nccl_items(sc)]
    userbuffers = te_userbuffers_bytes(sc)
    if userbuffers:
        items.append(NonTensorItem("te_userbuffers", userbuffers, "Transformer Engine "
                                   "initialize_ub: one (s·b/cp, h) buffer per overlapped GEMM "
                                   "(docs/tp-overlap.md)"))
    if fragmentation_bytes is None:
        items.append(NonTensorItem("fragmentation", FRAGMENTATION_ALLOWANCE,
                                   "allowance, a judgement (docs/non_tensor_memory.md)"))
    else:
        items.append(NonTensorItem("fragmentation", fragmentation_bytes,
                                   "modelled: reserved − allocated at the peak (docs/allocator.md)"))
    return items


def non_tensor_bytes(sc) -> float:
    """The itemised total with the judged fragmentation allowance: the default reserve of every
    command (a function of the layout and cluster alone, so search's screen uses it as it is)."""
    return sum(item.bytes for item in non_tensor_items(sc))
