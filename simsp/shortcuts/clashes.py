"""Which hops may cross one link at the same time (docs/shortcuts.md, "The traffic and its links").

Two hops on one link clash unless they are in turn: both owners include the GPU whose port or
NIC the link is, and one of them runs after that GPU's schedule. Two hops of one owner always
clash. A group whose hops clash with another owner's has a time that depends on what else runs;
one whose hops clash only with each other runs one collective at a time, alone on its links.
"""

from collections import Counter
from dataclasses import dataclass

from simsp.shortcuts.traffic import Edge, Owner, gpu_of_link

# the gradient reductions on one GPU's DP stream, dense buckets over DP and expert buckets over
# EDP alike (training/data_parallel/grad_buckets.py): one stream, so in turn with each other
REDUCTIONS = frozenset({"dp", "edp"})


@dataclass(frozen=True)
class Overlaps:
    """The flags that let one GPU's traffic kinds run at once: DP buckets during the backward
    pass (`overlap_grad_reduce`), pipeline transfers during compute and its TP collectives
    (`overlap_p2p_communication`). FP8 delayed scaling's amax all-reduce ("amax", on the compute
    stream: training/fp8_amax.py) overlaps them as a TP collective does."""

    grad_reduce: bool
    p2p: bool


def _in_turn(kinds: set[str], both_hold_x: bool, overlaps: Overlaps) -> bool:
    """Two owners of `kinds` on a link of GPU x that both include x (`both_hold_x`) run one
    after the other: x's collectives and blocking point-to-point calls complete for all members
    before x goes on, and training/data_parallel/finalize.py reduces gradients after x's
    schedule, DP before the tied embedding. Not so for the kinds that `overlaps` lets run at
    once."""
    if not both_hold_x:
        return False
    if overlaps.grad_reduce and kinds & REDUCTIONS and kinds & {"tp", "p2p", "ep", "amax"}:
        return False
    return not (overlaps.p2p and "p2p" in kinds and kinds & {"tp", "ep", "amax"})


def conflicts(users: dict[Edge, dict[Owner, int] | list[Owner]], overlaps: Overlaps):
    """(link, owner, other) for every two hops that may cross one link at the same time:
    two hops of one owner, or of two owners not in turn (_in_turn). Each clash once per link,
    in the order of its first appearance (an all-to-all puts dozens of one owner's hops on a
    NIC: their pairs are one clash). Per link its owners' hop counts (shortcuts/traffic.py
    link_users) or one entry per hop."""
    patterns: dict[tuple, tuple[tuple[int, int], ...]] = {}  # a link's owners -> its clashes
    for edge, owners in users.items():
        # distinct owners in first-appearance order, with their hops
        hops = owners if isinstance(owners, dict) else Counter(owners)
        if len(hops) < 2:
            if sum(hops.values()) > 1:
                yield edge, *hops, *hops
            continue
        distinct = list(hops)
        x = gpu_of_link(edge)
        # per owner: its kind, whether it includes the link's GPU, whether it has two hops here
        shape = tuple((owner[0], x in owner[1], hops[owner] > 1) for owner in distinct)
        pairs = patterns.get(shape)
        if pairs is None:
            pairs = patterns[shape] = _clashing_pairs(shape, overlaps)
        for i, j in pairs:
            yield edge, distinct[i], distinct[j]


def _clashing_pairs(shape: tuple[tuple[str, bool, bool], ...],
                    overlaps: Overlaps) -> tuple[tuple[int, int], ...]:
    """The (owner, other) positions that clash on a link whose owners have this shape (per
    owner: kind, holds the link's GPU, more than one hop), in conflicts' order: links of one
    shape clash alike, so a 16,384-GPU check works each shape out once, not per link."""
    pairs = []
    for i, (kind, holds, many) in enumerate(shape):
        if many:
            pairs.append((i, i))
        for j in range(i + 1, len(shape)):
            if not _in_turn({kind, shape[j][0]}, holds and shape[j][1], overlaps):
                pairs.append((i, j))
    return tuple(pairs)


def meeting_others(clashes: list) -> frozenset[tuple[int, ...]]:
    """Collective groups whose ring may share a link with another owner's hop (`clashes` from
    conflicts): their time depends on what else runs. A clash of two hops of one owner does
    not count: its collectives run one at a time (one stream per rank), so alone on their
    links (engine/collectives/ring_alone.py)."""
    shared = set()
    for _edge, owner, other in clashes:
        if owner != other:
            shared.update(o[1] for o in (owner, other) if o[0] != "p2p")
    return frozenset(shared)


def meeting_themselves(clashes: list) -> frozenset[tuple[int, ...]]:
    """Collective groups two of whose own hops cross one link (NCCL's rail channels on one
    NVLink port, an all-to-all's pairs on one NIC)."""
    return frozenset(owner[1] for _edge, owner, other in clashes
                     if owner == other and owner[0] != "p2p")
