"""How the communicator times one group's collectives: the methods a timing plan may give a group.

The engine knows no group lists: the caller passes one `timing_of(group) -> method` (meta mode's
plan, simsp/shortcuts/plan.py, decided before the run; where each method is exact is stated in
simsp/shortcuts/methods.py). What each method makes engine/communicator.py do:

- STEP_BY_STEP: every ring step as flows on the shared links (engine/collectives/ring.py), an
  all-to-all as its flows (engine/collectives/all_to_all.py; in meta mode under a rail
  symmetry one flow per orbit of its pairs, Communicator.pair_orbits). The full model; the
  plain path (`--no-shortcuts`) gives it to every group.
- NODE_PIECE: a meta ring as one node's piece of one channel on the shared links
  (engine/collectives/ring_alone.py node_segment, segment_run); an all-to-all as flows.
- RING_ALONE: a ring waits the time it takes alone on its links (ring_alone.alone_stats: its
  closed form where no link carries two of its hops, else its ring run once step by step in a
  private simulation), loading no link; an all-to-all as flows.
- CLOSED_FORM: a ring waits its closed-form time (engine/collectives/ring_timing.py
  closed_form_stats: no link carries two of its hops), loading no link; an all-to-all as flows.
- TEMPLATE: an all-to-all waits its time alone, found once per placement and byte matrix in a
  private simulation of its flows (all_to_all.alone_time); a DeepEP dispatch or combine likewise
  once per placement and two-hop plan (collectives/deepep.py alone_time); a ring as RING_ALONE.

Whatever the method, an all-reduce NCCL runs as a tree or as NVLS is timed in closed form
(it loads no link in either path: docs/shortcuts.md, "One choice for both paths").
"""

from collections.abc import Callable
from dataclasses import dataclass

STEP_BY_STEP = "step_by_step"
NODE_PIECE = "node_piece"
RING_ALONE = "ring_alone"
CLOSED_FORM = "closed_form"
TEMPLATE = "template"
METHODS = (STEP_BY_STEP, NODE_PIECE, RING_ALONE, CLOSED_FORM, TEMPLATE)
STEPPED = frozenset({STEP_BY_STEP, NODE_PIECE})  # rings whose flows load the shared links

TimingOf = Callable[[tuple[int, ...]], str]  # group (its ranks, ring order) -> one of METHODS


@dataclass(frozen=True)
class EveryGroup:
    """One method for every group: STEP_BY_STEP is the full simulation; RING_ALONE times every
    collective as a whole (`simsp layer`, hand-built worlds)."""

    method: str

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"timing method must be one of {METHODS}, got {self.method!r}")

    def __call__(self, group: tuple[int, ...]) -> str:
        """The same method, whatever the group."""
        return self.method
