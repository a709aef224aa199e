"""Which context-parallel attention a rank runs, by --cp-comm-type (docs/context-parallel.md):
p2p and a2a (training/context_parallel/attention.py), allgather (allgather.py) or a2a+p2p
(training/context_parallel/hierarchical.py). Kept apart from both so neither imports the other
back: the hierarchical variant is built from the p2p and a2a ones.
"""

from simsp.training.context_parallel.allgather import CpAllGather
from simsp.training.context_parallel.attention import CpAttention, CpUlysses
from simsp.training.context_parallel.hierarchical import CpHierarchical
from simsp.training.context_parallel.lone_ring import lone_ring


def cp_attention_of(world, rank: int):
    """Rank `rank`'s CP attention by --cp-comm-type: CpAttention (p2p), CpUlysses (a2a),
    CpAllGather (allgather, allgather.py) or CpHierarchical (a2a+p2p); None without context parallelism."""
    grid = world.grid
    if grid.cp == 1:
        return None
    members = grid.cp_group(rank)
    p = world.scenario.parallel
    args = (world.env, world.network, world.cp_rings, members, members.index(rank),
            world.scenario.model.seq_length)
    if p.cp_comm_type == "a2a+p2p":
        return CpHierarchical(*args, p.hcp_sizes[0])
    kind = {"a2a": CpUlysses, "allgather": CpAllGather}.get(p.cp_comm_type, CpAttention)
    attention = kind(*args)
    if kind is CpAttention:  # the plain p2p ring: its sends alone on their links where proven
        key = ("lone", members)  # found once per group, kept beside the group's rings
        if key not in world.cp_rings:
            world.cp_rings[key] = lone_ring(world, members)
        attention.lone = world.cp_rings[key]
    return attention
