"""What metrics.json's `shortcuts_used` says of each shortcut: used or not, and why (one sentence per
shortcut, from the facts shortcuts/check.py found; docs/shortcuts.md quotes them)."""

from simsp.cluster.topology import NODES_PER_LEAF
from simsp.shortcuts.clashes import meeting_themselves
from simsp.shortcuts.rail_symmetry import RailSymmetry
from simsp.shortcuts.traffic import has_expert_groups, routing_is_uniform
from simsp.training.pipeline.schedules import SPLIT_BACKWARD


def closed_form_why(clashes: list, stepwise: frozenset) -> str:
    """How collectives are timed: as a whole (alone on their links,
    engine/collectives/ring_alone.py) or, sharing links with other traffic, step by step."""
    own = len(meeting_themselves(clashes) - stepwise)
    if not own and not stepwise:
        return "used: no collective's ring shares a link"
    alone = (f"{own} collective group(s) share links only among their own channels and are "
             f"timed as their ring alone, run once step by step" if own else "")
    if not stepwise:
        return "used: " + alone
    return (f"used where exact: {len(stepwise)} collective group(s) share links with other "
            f"traffic and run step by step, loading them; "
            + (alone + "; the others are timed as a whole" if alone else
               "the others are timed as a whole"))


def segments_why(segments: frozenset, gpus_per_node: int, per_leaf: int = NODES_PER_LEAF) -> str:
    """What the verdict says of the groups run as pieces (docs/shortcuts.md)."""
    if not segments:
        return ""
    leaves = any(len({gpu // gpus_per_node // per_leaf for gpu in group}) > 1
                 for group in segments)
    return (f"; {len(segments)} of them meet only their own collectives (FSDP) and run as one "
            f"node's piece of one channel" + (", each like hop at its slowest latency (their "
                                              "rings cross a leaf boundary)" if leaves else ""))


def representative_why(not_rep: str, symmetry: RailSymmetry | None,
                       replicas: tuple[int, ...] = (0,)) -> str:
    """One rank per stage (or per orbit of the stage's rail symmetry, or per kind of FSDP
    shard), or why not."""
    if not_rep:
        return "not used: " + not_rep
    return "used: every rank of a stage is placed and loaded as its representative" + (
        "" if len(replicas) == 1 else f" of its DP replica's kind (replicas of "
        f"{len(replicas)} kinds, by placement on the leaves, under FSDP also by the SP-partial "
        f"slices of their shards: TP rank 0 of replicas {', '.join(map(str, replicas))} "
        f"runs)") + (
        "" if symmetry is None else f" up to rail symmetry ({len(symmetry.ranks)} ranks "
        f"simulated): " + (f"the {len(symmetry.loads)} hops they send also load their images' "
                           f"links, for the groups they leave out" if not symmetry.pieces else
                           f"the quotient by it, {len(symmetry.pieces)} ring groups run as the "
                           f"hops their simulated members send, each link as its orbit's")
        + (f"; node shifts by one refused: a shift by one node {symmetry.node_why}"
           if symmetry and symmetry.node_why else ""))


def templates_why(sc, not_rep: str, stepwise: frozenset, tp_groups: set,
                  ep_groups: set) -> str:
    """Layer templates (model/replay.py): used where every layer step of a stage is alike."""
    p, m = sc.parallel, sc.model
    if not_rep:
        return "not used: needs the representative shortcut"
    if p.overlap_moe_expert_parallel_comm:  # training/pipeline/combined_1f1b.py
        return ("not used: a combined 1F1B step runs two micro-batches' layers beside each "
                "other")
    if p.schedule_name in SPLIT_BACKWARD:  # model/base/wgrad_store.py
        return "not used: a split backward's weight-gradient GEMMs wait for their W step"
    if has_expert_groups(sc) and (stepwise & ep_groups or not routing_is_uniform(sc) or
                                  p.etp > 1):
        return "not used: the MoE all-to-alls run as flows whose time may vary"
    if m.num_experts is not None and m.moe_routing_imbalance > 0:
        return "not used: imbalanced routing loads each MoE layer differently"
    if stepwise & tp_groups:
        return "not used: TP collectives share links, so a layer step's time varies"
    if sc.cluster.sm_contention and (p.overlap_grad_reduce or p.overlap_param_gather or
                                     p.fsdp is not None):  # engine/sm_share.py
        return ("not used: SM contention slows a layer step by the data-parallel collectives "
                "running beside it")
    return "used: every layer step of a stage is alike, recorded once and replayed"



def cp_templates_why(sc, why: str) -> str:
    """Layer templates with context parallelism (model/replay.py SplitTemplate): where they
    would be used without it (`why`), split at the CP attention calls, which run."""
    if not why.startswith("used"):
        return why
    if sc.cluster.sm_contention:  # engine/sm_share.py: CP exchanges' kernels hold SMs
        return ("not used: SM contention could slow a layer step's compute by CP exchanges "
                "running beside it")
    return ("used: every layer step of a simulated rank is alike outside its CP attention "
            "calls; the parts around them are recorded once per rank and replayed, the CP "
            "calls run (a p2p ring alone on its links: each call's charges replayed at once "
            "per rank, its times worked out for the whole group in one vector pass)")
