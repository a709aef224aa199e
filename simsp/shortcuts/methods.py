"""Every timing method of meta mode's plan, with the condition under which it is exact and the test
that shows it: the one table (docs/shortcuts.md). A group gets the first method of GROUP_METHODS
whose condition its facts meet (shortcuts/check.py finds the facts from the routes alone).

What each method makes the engine do is engine/group_timing.py; these are sufficient conditions,
not necessary ones: a method refused is never wrong, only slower.
"""

from collections.abc import Callable
from dataclasses import dataclass

from simsp.engine.group_timing import (CLOSED_FORM, NODE_PIECE, RING_ALONE, STEP_BY_STEP,
                                       TEMPLATE)

REPRESENTED = "representative"  # a group no simulated rank belongs to: not run, an image


@dataclass(frozen=True)
class GroupFacts:
    """What the routes say of one collective group (shortcuts/clashes.py, shortcuts/check.py)."""

    meets_others: bool  # a hop may cross a link while another owner's hop does
    meets_itself: bool  # two of its own hops cross one link (rail channels, all-to-all pairs)
    fsdp_ring: bool  # an FSDP DP ring: its gathers and reduce-scatters overlap (two streams)
    tp_own_overlap: bool  # a TP group under TE's dgrad reduce-scatter overlap: the input's
    # NCCL all-gather runs beside the dgrad's userbuffers reduce-scatter (docs/tp-overlap.md)
    pieces_allowed: bool  # every FSDP unit's collective splits into node pieces, and no CP
    all_to_all: bool  # an EP group: its hops are an all-to-all's pairs, not ring channels
    templates_allowed: bool  # no context parallelism (whose all-to-alls always run as flows)


@dataclass(frozen=True)
class Method:
    """A timing method: its engine name, when it is exact, and where that is shown."""

    name: str
    exact_when: str
    test: str
    applies: Callable[[GroupFacts], bool] | None = None  # None: not chosen per group


GROUP_METHODS = (
    Method(NODE_PIECE, "no other owner's hop meets the group, only its own overlapping "
           "collectives (FSDP's two streams), and every unit's buffer splits into node pieces "
           "(>= 2 nodes holding the members at the same GPUs, one channel per member, equal "
           "slices; a ring across a leaf boundary takes each like hop's slowest latency); "
           "no context parallelism. One node's piece of one channel then stands for its "
           "images in every node and channel: the quotient of the full simulation by the "
           "ring's symmetry. Also given after the representative verdict to a ring of one "
           "member per node that only pipeline pairs meet (shortcuts/check.py "
           "_pieces_beside_sends)", "tests/test_fsdp_segments.py",
           lambda f: f.fsdp_ring and f.pieces_allowed and not f.meets_others),
    Method(STEP_BY_STEP, "always (the full model); given where a hop may share a link with "
           "another owner's hop at the same time, or where the group's own collectives "
           "overlap (FSDP; TE's dgrad reduce-scatter beside the input's all-gather), so that "
           "its flows load the links as in the full simulation",
           "tests/test_communicator.py, tests/test_shortcut_layouts.py, "
           "tests/test_tp_overlap_rs_dgrad.py",
           lambda f: f.meets_others or f.fsdp_ring or f.tp_own_overlap),
    Method(TEMPLATE, "an EP group no other owner's hop meets, without context parallelism: "
           "its all-to-all's time depends only on its placement and byte matrix, found once "
           "alone; a DeepEP dispatch's or combine's (some of the all-to-all's pairs) on its "
           "placement and two-hop plan", "tests/test_moe_shortcuts.py, tests/test_deepep.py",
           lambda f: f.all_to_all and f.templates_allowed),
    Method(RING_ALONE, "no other owner's hop meets the group; its own hops may share links "
           "(NCCL's rail channels on one NVLink port): it runs one collective at a time (one "
           "stream per rank), alone on its links, so its ring run once step by step alone "
           "(one node's piece of one channel where nodes and slices are alike) is its time",
           "tests/test_shortcut_layouts.py, tests/test_ring_links.py",
           lambda f: f.meets_itself or f.all_to_all),
    Method(CLOSED_FORM, "no link carries two of the group's hops nor another owner's hop: "
           "rates are constant, and the max-plus recurrence of the ring's dataflow grows by "
           "the slowest hop each step", "tests/test_ring_links.py, tests/test_communicator.py",
           lambda f: True),
)

# groups the check lists no traffic for: with ETP > 1 the ETP·EP groups' token-count
# all-gathers and the ETP groups' all-to-alls (which RING_ALONE runs as flows): their rings are
# timed alone, as before the plan (the expert data-parallel groups are listed: traffic.py)
UNLISTED = Method(RING_ALONE, "assumed, not checked: shortcuts/traffic.py and "
                  "shortcuts/cp_traffic.py do not list these groups' traffic", "none")

RANK_METHODS = (
    Method(REPRESENTED, "t*d and t tile the GPUs per node and every clash between executed and "
           "left-out traffic is mirrored by a move of whole nodes onto the representative's "
           "(shortcuts/representative.py); or the stage is rail-symmetric and one rank per "
           "orbit runs, its hops loading their images' links (shortcuts/rail_symmetry.py; "
           "with experts only under ETP 1, the alltoall dispatcher and uniform routing, each "
           "EP all-to-all as one flow per orbit of its pairs), or, where every executed ring "
           "has its piece and no EP group runs, as the full simulation's quotient: "
           "one hop per orbit on one link per orbit (shortcuts/quotient.py); "
           "with context parallelism TP rank 0's CP ranks run where d = 1, t divides the GPUs "
           "per node and no link carries executed and left-out traffic at once",
           "tests/test_shortcut_layouts.py, tests/test_shortcuts.py, tests/test_cp_shortcuts.py, "
           "tests/test_rail_symmetry_experts.py"),
    Method("layer_templates", "the representative shortcut holds and no TP group runs step by "
           "step; with experts also uniform routing, ETP 1 and no EP group step by step "
           "(model/replay.py records a layer step once and replays it)",
           "tests/test_shortcuts.py, tests/test_moe_shortcuts.py"),
)


def method_for(facts: GroupFacts) -> str:
    """The first method of GROUP_METHODS whose condition the group's facts meet."""
    return next(m.name for m in GROUP_METHODS if m.applies(facts))
