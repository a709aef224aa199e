"""A flow in flight on the links, and like loads drained as one fair-share class: the
bookkeeping engine/network.py Network mixes in (its __init__ holds the state used here: _open,
_route_ids, _draining, _users, _finishes, _changed_links).

Loads that start at one instant with the same route, bytes and latency (an all-to-all's orbit
flows under the quotient by rail symmetry) are one flow in the solves, the first (the head)
standing for the others (`members`), its route's links listed once per member: max-min rates
of m like flows on the same links are one rate, and progressive filling of the class gives it
bit for bit (fair_share.max_min_rates). Each member keeps its own delivery; at a wake members
retire one by one in (finish, id) order as the flows would (Network._on_wake), and the rest of
a class partly retired regroup under a new head.
"""

from dataclasses import dataclass
import heapq
import math
import operator

import simpy


@dataclass(slots=True)
class Flow:
    """One transfer in flight: its route, bytes still to drain as of `updated_s`, its current
    fair rate and the time its last byte leaves at that rate."""

    flow_id: int
    src: int
    dst: int
    nbytes: int
    label: str
    edges: tuple[tuple[str, str], ...]
    route_id: int
    solve_id: int  # the route id the solve keys on: route_id, or a class's links x members
    latency_s: float
    start_s: float
    delivered: simpy.Event
    remaining: float
    updated_s: float  # when `remaining` was last brought up to date
    rate_Bps: float = 0.0  # 0 until the first rate computation after its start
    finish_s: float = math.inf  # updated_s + remaining / rate_Bps
    drained: simpy.Event | None = None  # succeeds when the last byte has left the sender
    recorded: bool = True  # a transfer (traced, bytes counted); False: a collective's load
    members: list | None = None  # the flows this one's class also stands for (ascending ids,
    # same route, bytes, latency and start); their own rate fields are never read


class FlowClasses:
    """Forming, closing, retiring and regrouping flow classes (mixed into Network)."""

    def _join_class(self, flow: Flow) -> bool:
        """Join `flow` to the class started at this instant (not yet solved) with its route,
        bytes and latency, if any (then True); else open a class of it."""
        key = (flow.route_id, flow.nbytes, flow.latency_s, flow.start_s)
        head = self._open.get(key)
        if head is None:
            self._open[key] = flow
            return False
        if head.members is None:
            head.members = []
        head.members.append(flow)
        return True

    def _close_classes(self) -> None:
        """The classes started since the last solve take no more members: each solves as its
        route's links once per member (fair_share weighs a link listed m times m-fold)."""
        for head in self._open.values():
            if head.members:
                self._set_solve_id(head)
        self._open.clear()

    def _set_solve_id(self, head: Flow) -> None:
        """The route id of a class's links, listed once per member."""
        count = 1 + len(head.members) if head.members else 1
        head.solve_id = self._route_ids.setdefault(head.edges * count, len(self._route_ids)) \
            if count > 1 else head.route_id

    @staticmethod
    def _open_class(head: Flow, due: list, opened: dict) -> None:
        """Take up a class for retiring: its members into `due` in (finish, id) order."""
        opened[head.flow_id] = head
        for member in (head, *head.members) if head.members else (head,):
            heapq.heappush(due, (head.finish_s, member.flow_id, member, head))

    def _settle(self, opened: dict[int, Flow], due: list) -> None:
        """After a wake: a class none of whose flows retired drains on as it was; one whose
        flows all did leaves its links; the rest of one partly retired drain on as a class of
        their own (its first member the new head, with its bytes left and rate)."""
        left: dict[int, list[Flow]] = {}  # class id -> its members not retired, ascending
        for _finish_s, _member_id, member, head in sorted(due, key=operator.itemgetter(1)):
            left.setdefault(head.flow_id, []).append(member)
        for class_id, head in opened.items():
            rest = left.get(class_id, [])
            if len(rest) == 1 + len(head.members or ()):
                heapq.heappush(self._finishes, (head.finish_s, class_id))
                continue
            self._unlink(head)
            if rest:
                self._regroup(head, rest)

    def _unlink(self, head: Flow) -> None:
        """A class leaves its links (its flows retired, or regrouped)."""
        del self._draining[head.flow_id]
        flow_id, users = head.flow_id, self._users
        for edge in head.edges:
            sharing = users.get(edge)
            if sharing is None or flow_id not in sharing:
                continue  # a link the load lists twice, left already
            del sharing[flow_id]
            if not sharing:
                del users[edge]
        self._changed_links.extend(head.edges)

    def _regroup(self, old: Flow, rest: list[Flow]) -> None:
        """The flows of class `old` not retired (ascending ids) drain on as one class headed
        by the first, at the old class's bytes left and rate."""
        head = rest[0]
        head.members = rest[1:] or None
        head.remaining, head.updated_s = old.remaining, old.updated_s
        head.rate_Bps, head.finish_s = old.rate_Bps, old.finish_s
        self._set_solve_id(head)
        self._draining[head.flow_id] = head
        self._draining = dict(sorted(self._draining.items()))  # in start order again (rare)
        for edge in head.edges:
            self._users.setdefault(edge, {})[head.flow_id] = None
        self._changed_links.extend(head.edges)
        heapq.heappush(self._finishes, (head.finish_s, head.flow_id))
