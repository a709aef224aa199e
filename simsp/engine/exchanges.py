"""The communicator's all-to-alls and DeepEP two-hop exchanges: run as flows over the links, or
(TEMPLATE) timed alone once per placement and byte matrix or plan.

Mixed into engine/communicator.py Communicator, whose __init__ holds the state used here
(env, network, trace, timing_of, pair_orbits, alone_flows, the memos _plans, _alike) and
_placement.
"""

import numpy as np

from simsp.engine.collectives.all_to_all import all_to_all, alone_time, orbit_all_to_all
from simsp.engine.collectives.deepep import (alone_time as two_hop_alone_time, routes_key,
                                             two_hop, two_hop_plan)
from simsp.engine.group_timing import TEMPLATE
from simsp.engine.meeting import ALL_TO_ALL, DEEPEP, Meeting


class Exchanges:
    """A met all-to-all or DeepEP dispatch/combine, each member's received chunks."""

    def _all_to_all(self, meeting: Meeting, buffers: list):
        """Every member's row of bytes at once over the links; each member's received chunks.
        An absent member (meta, present-rank shortcut) sends as the first present one does,
        its row turned by their distance: j gets what the present member sends j − (i − p)."""
        present = next(i for i, b in enumerate(buffers) if b is not None)
        n, row = len(buffers), buffers[present][0]
        # under the quotient by rail symmetry (network.link_reps) an absent member's pairs are
        # images of a present one's: only the present send, unless timed alone (TEMPLATE)
        alone = self.timing_of(meeting.group) == TEMPLATE
        matrix = [b[0] if b is not None else [0] * n if self.network.link_reps and not alone
                  else [row[(j - i + present) % n] for j in range(n)]
                  for i, b in enumerate(buffers)]
        chunks = None if buffers[present][1] is None else [c for _row, c in buffers]
        if alone:
            start_s = self.env.now
            yield self.env.timeout(self._all_to_all_alone(meeting.group, matrix))
            received = [[None if chunks is None or chunks[i][j] is None
                         else chunks[i][j].copy() for i in range(n)] for j in range(n)]
            end_s = self.env.now
        elif chunks is None and meeting.group in self.pair_orbits:  # meta, rail-symmetric
            orbits, index = self.pair_orbits[meeting.group], meeting.group.index
            stats = yield from orbit_all_to_all(self.env, self.network, orbits, {
                (a, b): matrix[index(a)][index(b)] for a, b, _images in orbits})
            received, start_s, end_s = [[None] * n for _ in buffers], stats.start_s, stats.end_s
        else:
            received, stats = yield from all_to_all(self.env, self.network,
                                                    list(meeting.group), matrix, chunks,
                                                    meeting.tag or ALL_TO_ALL)
            start_s, end_s = stats.start_s, stats.end_s
        for rank in sorted(meeting.expected):
            self.trace.add_span(rank, "comm", meeting.tag or ALL_TO_ALL, start_s, end_s,
                                {"collective": ALL_TO_ALL, "group": meeting.group})
        return received

    def _deepep(self, meeting: Meeting, buffers: list):
        """DeepEP's two hops over the links (TEMPLATE: waits their time alone, memoised per
        placement and plan); each member's received chunks."""
        plan = self._deepep_plan(meeting, buffers)
        start_s, combine = self.env.now, meeting.collective == DEEPEP[1]
        if self.timing_of(meeting.group) == TEMPLATE:
            key = (DEEPEP[combine], self._placement(meeting.group), plan.key())
            if key not in self._alike:
                self._alike[key] = two_hop_alone_time(
                    self.network.graph, self.network.calibration, list(meeting.group), plan,
                    combine)
            yield self.env.timeout(self._alike[key])
        else:
            yield from two_hop(self.env, self.network, list(meeting.group), plan, meeting.tag,
                               combine)
        for rank in sorted(meeting.expected):
            self.trace.add_span(rank, "comm", meeting.tag, start_s, self.env.now,
                                {"collective": meeting.collective, "group": meeting.group,
                                 **plan.link_bytes()})
        n = len(buffers)
        chunks = [None if b is None else b[1] for b in buffers]  # chunks[i][j]: i's to j
        return [[None if chunks[i] is None or chunks[i][j] is None else chunks[i][j].copy()
                 for i in range(n)] for j in range(n)]

    def _deepep_plan(self, meeting: Meeting, buffers: list):
        """The two-hop plan of the members' routes, memoised per group, token bytes and routes.
        An absent member (meta, present-rank shortcut) routes as the first present one, its
        columns turned by their distance, as in _all_to_all."""
        present = next(i for i, b in enumerate(buffers) if b is not None)
        key = (DEEPEP, meeting.group, meeting.nbytes,
               tuple((i, routes_key(b[0])) for i, b in enumerate(buffers) if b is not None))
        if key not in self._plans:
            routes = [b[0] if b is not None else np.roll(buffers[present][0], i - present,
                                                         axis=1)
                      for i, b in enumerate(buffers)]  # each (T_i, n) bool
            group, per_node = meeting.group, self.network.graph.graph["gpus_per_node"]
            self._plans[key] = two_hop_plan(routes, [g // per_node for g in group],
                                            [g % per_node for g in group], meeting.nbytes)
        return self._plans[key]

    def _all_to_all_alone(self, group: tuple, matrix: list) -> float:
        """Seconds of an all-to-all of `group` alone on its links (TEMPLATE), memoised per
        placement and byte matrix."""
        graph = self.network.graph
        key = (self._placement(group), tuple(map(tuple, matrix)))
        if key not in self._alike:
            self._alike[key], flows = alone_time(graph, self.network.calibration, list(group),
                                                 matrix)
            self.alone_flows += flows
        return self._alike[key]
