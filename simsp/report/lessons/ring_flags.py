"""`simsp ring`'s message sizes (nccl-tests' -b/-e/-f) and its ranks' placement on the nodes,
read from the flags and checked."""

import math
from dataclasses import replace

from simsp.engine.collectives.nccl_tests import ELEM_BYTES
from simsp.errors import UserError
from simsp.hardware.cluster_hardware import system_cluster_fields
from simsp.scenario.config import Cluster
from simsp.units import parse_size

# The closed form plans n x channels hops per phase; 8192 ranks (on 1024 nodes) take ~1 s.
MAX_RING_RANKS = 8192


def message_sizes(args) -> list[int]:
    """The message sizes: one --size, or min, min*F, ... up to max (nccl-tests -b/-e/-f)."""
    sweep = args.min_size is not None or args.max_size is not None
    if args.size is not None and sweep:
        raise UserError("--size", "give either --size or --min-size/--max-size, not both")
    if args.size is None and not (args.min_size and args.max_size):
        raise UserError("--size", "give --size, or both --min-size and --max-size")
    if args.step_factor is not None and not sweep:
        raise UserError("--step-factor", "only applies to a --min-size/--max-size sweep")
    if args.size is not None:
        return [_element_size(parse_size(args.size, "--size"), "--size")]
    low = _element_size(parse_size(args.min_size, "--min-size"), "--min-size")
    high = parse_size(args.max_size, "--max-size")
    factor = 2 if args.step_factor is None else args.step_factor
    if low > high:
        raise UserError("--min-size", f"{low} is larger than --max-size {high}")
    if factor < 2:
        raise UserError("--step-factor", f"must be at least 2, got {factor}")
    sizes = [low]
    while sizes[-1] * factor <= high:
        sizes.append(sizes[-1] * factor)
    return sizes


def _element_size(nbytes: int, flag: str) -> int:
    """Sizes must be whole float32 elements."""
    if nbytes % ELEM_BYTES:
        raise UserError(flag, f"{nbytes} B is not a multiple of the {ELEM_BYTES}-byte float")
    return nbytes


def system_cluster(system: str | None) -> Cluster:
    """One node of `system` (its GPUs per NVLink domain and link speeds), or a DGX A100."""
    if system is None:
        return Cluster()
    return replace(Cluster(), system=system, **system_cluster_fields(system))


def ring_placement(ranks: int, nodes: int | None,
               base: Cluster = Cluster()) -> tuple[Cluster, list[int]]:
    """Cluster and GPUs of the ring: ranks spread evenly over the nodes, in order."""
    gpus_per_node = base.gpus_per_node
    if ranks < 2:
        raise UserError("--ranks", f"a ring needs at least 2 ranks, got {ranks}")
    if ranks > MAX_RING_RANKS:
        raise UserError("--ranks", f"a ring of {ranks} ranks plans ~{ranks * gpus_per_node} "
                                   f"channel hops for each of its {2 * (ranks - 1)} steps; the "
                                   f"limit is {MAX_RING_RANKS} ranks")
    nodes = math.ceil(ranks / gpus_per_node) if nodes is None else nodes
    if nodes < 1:
        raise UserError("--nodes", f"must be positive, got {nodes}")
    if ranks % nodes:
        raise UserError("--ranks", f"{ranks} ranks do not spread evenly over {nodes} nodes "
                                   f"(pass a --nodes that divides --ranks)")
    per_node = ranks // nodes
    if per_node > gpus_per_node:
        raise UserError("--ranks", f"{ranks} ranks need {per_node} GPUs per node but a node "
                                   f"has {gpus_per_node}; add --nodes")
    gpus = [node * gpus_per_node + local for node in range(nodes) for local in range(per_node)]
    return replace(base, nodes=nodes), gpus
