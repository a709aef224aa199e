"""Multi-hop ring phases worked out in arithmetic: one ring alone on its hops, or two rings on
the very same hops, with the network's own float operations (engine/network.py).

Alone, every hop drains each chunk at its links' max-min rate alone R and the phase is the
ring's max-plus recurrence (hop_rings.py). Two rings of one group (FSDP's backward gather and
reduce-scatter) cross the same hops: at hop p only their two steps there can share its links,
so each drains at the links' fair share among the steps draining at p (R alone, the two-flow
rate, R / 2 on the NIC pair, while both drain) and the hops couple only through the rings'
dataflow. `joint_timelines` replays that as the network would: instants in time order, at
each the drains ending (with those within DRAINED_FRACTION of their bytes), the deliveries
and the steps they start, then every changed hop's draining steps retimed (bytes left brought
up to date at the old rate, the finish at bytes left / new rate). A ring whose hops, chunks,
latencies and begun steps are alike at every position runs in lockstep: one position is
worked out and its lists stand for every position (the same float operations on the same
inputs). docs/fsdp.md, "Cost of the simulation".
"""

from bisect import bisect_right
from dataclasses import dataclass, field
import heapq
import math

from simsp.engine.network import DRAINED_FRACTION

Edge = tuple[str, str]
Hop = tuple[tuple[Edge, ...], float, float]  # (links, latency_s, wire bytes per step)
NOT_BEGUN = float("-inf")  # the start and drain end of a step begun before the timeline
_DRAIN, _DELIVERY = 0, 1  # event kinds, in the order an instant takes them up


@dataclass(slots=True)
class Timeline:
    """A phase's steps as worked out ([position][step] lists, one list shared by every position
    in lockstep) and the rate history of steps whose rate may have moved while they drained
    ({(position, step): [(since_s, bytes left then, rate)]}; a step without one drained at its
    hop's rate alone from its start)."""

    starts: list[list[float]]
    drains: list[list[float]]
    deliveries: list[list[float]]
    alone: list[float]  # [position] its hop's rate alone
    chunks: list[float]  # [position] its hop's wire bytes per step
    history: dict = field(default_factory=dict)
    lockstep: bool = False  # every position's steps are position 0's (its history holds them)

    def end_s(self) -> float:
        """When its last step is delivered."""
        return max(times[-1] for times in self.deliveries)

    def begun(self, p: int, now: float) -> int:
        """Position p's steps begun by `now`."""
        return bisect_right(self.starts[p], now)

    def draining(self, p: int, step: int, now: float) -> tuple[float, float, float]:
        """(bytes left, as of when, rate) of position p's `step` draining at `now`: the last
        rate it was given by then, as the network holds a flow."""
        changes = self.history.get((0 if self.lockstep else p, step))
        if changes is None:
            return self.chunks[p], self.starts[p][step], self.alone[p]
        since_s, left, rate = changes[bisect_right(changes, (now, math.inf, math.inf)) - 1]
        return left, since_s, rate


@dataclass(slots=True)
class Begun:
    """A ring's steps begun when its timeline is worked out: [position] their starts
    (NOT_BEGUN where unknown), drain ends and deliveries (one fewer where the last still
    drains), and the last's drain state if it does ((bytes left, as of when, rate) or None)."""

    starts: list[list[float]]
    drains: list[list[float]]
    deliveries: list[list[float]]
    draining: list[tuple | None]


def begun_from_deliveries(known: list[list[float]]) -> Begun:
    """Steps begun and delivered or in their latency, delivered at `known` [position][step]."""
    return Begun([[NOT_BEGUN] * len(times) for times in known],
                 [[NOT_BEGUN] * len(times) for times in known], [list(t) for t in known],
                 [None] * len(known))


def begun_at(timeline: Timeline, now: float) -> Begun:
    """A worked-out timeline's steps begun by `now`, as they stand then."""
    starts, drains, deliveries, draining = [], [], [], []
    for p in range(len(timeline.starts)):
        step = timeline.begun(p, now)
        ended = step if step == 0 or timeline.drains[p][step - 1] <= now else step - 1
        starts.append(timeline.starts[p][:step])
        drains.append(timeline.drains[p][:ended])
        deliveries.append(timeline.deliveries[p][:ended])
        draining.append(timeline.draining(p, step - 1, now) if ended < step else None)
    return Begun(starts, drains, deliveries, draining)


def alone_timeline(rates: list[float], hops: list[Hop], steps: int, known: list[list[float]],
                   now: float) -> Timeline:
    """The phase run alone from `now`, the steps begun before it delivered at `known`
    [position][step] times: step i of position p starts when its step i - 1 and its
    predecessor's are delivered (not before `now`), drains until start + chunk / R and is
    delivered one latency later (in lockstep: one position for all)."""
    n = len(hops)
    if n > 1 and _alike(rates, hops) and all(times == known[0] for times in known):
        one = alone_timeline(rates[:1], hops[:1], steps, known[:1], now)
        return Timeline(one.starts * n, one.drains * n, one.deliveries * n, list(rates),
                        [chunk for _e, _l, chunk in hops], lockstep=True)
    starts = [[NOT_BEGUN] * len(times) + [now] * (steps - len(times)) for times in known]
    drains = [[NOT_BEGUN] * steps for _ in hops]
    deliveries = [times + [0.0] * (steps - len(times)) for times in known]
    for i in range(min(map(len, known)), steps):
        for p, (_edges, latency_s, chunk) in enumerate(hops):
            if i < len(known[p]):
                continue
            if i:
                own, before = deliveries[p][i - 1], deliveries[p - 1 if p else n - 1][i - 1]
                start = own if own > before else before
                starts[p][i] = start if start > now else now
            drains[p][i] = starts[p][i] + chunk / rates[p]
            deliveries[p][i] = drains[p][i] + latency_s
    return Timeline(starts, drains, deliveries, list(rates), [chunk for _e, _l, chunk in hops])


def _alike(rates: list, hops: list[Hop]) -> bool:
    """Whether every hop has the first's rates, latency and chunk."""
    return all(r == rates[0] for r in rates) and all(h[1:] == hops[0][1:] for h in hops)


def joint_timelines(rings: list[tuple[list[Hop], int, Begun]], rates: list[tuple],
                    now: float) -> list[Timeline]:
    """Two rings on the same hops ((hops, steps, steps begun) each) from `now`: `rates`
    [position] (0.0, the rate of one step draining at its hop, of each of two). In lockstep
    (every position alike in both rings) one position stands for all."""
    n = len(rates)
    if n > 1 and all(r == rates[0] for r in rates) and all(
            _alike(rates, hops) and _alike_begun(begun) for hops, _s, begun in rings):
        ones = _one_hop([(hops[0], steps, _first(begun)) for hops, steps, begun in rings],
                        rates[0], now)
        return [Timeline(one.starts * n, one.drains * n, one.deliveries * n, one.alone * n,
                         one.chunks * n, one.history, lockstep=True) for one in ones]
    return _Replay(rings, rates, now).run()


def _one_hop(rings: list[tuple[Hop, int, Begun]], rates: tuple, now: float) -> list[Timeline]:
    """_Replay of rings of one position each (lockstep: the position its own predecessor), in
    a plain loop: each instant the drains ending there (and those within DRAINED_FRACTION of
    their bytes), then the deliveries there starting the next steps, then the draining steps
    retimed at the hop's fair share (network.py _retime)."""
    flows, due, lists = _one_hop_state(rings, now)
    history: list[dict] = [{} for _ in rings]
    latencies = [hop[1] for hop, _s, _b in rings]  # [ring]
    chunks = [float(hop[2]) for hop, _s, _b in rings]  # [ring]
    limits = [DRAINED_FRACTION * hop[2] for hop, _s, _b in rings]  # [ring] bytes left: drained
    steps = [count for _h, count, _b in rings]  # [ring]
    each = range(len(rings))
    finished: set[int] = set()  # rings whose last step is delivered
    ended: list = []
    delivered = [r for r in each if due[r] is None]
    changed = any(flow is not None for flow in flows)  # steps in flight: their rates now
    while True:
        for r in ended:
            flow, flows[r] = flows[r], None
            drains, deliveries = lists[r][1], lists[r][2]
            history[r][(0, len(drains))] = flow[4]
            drains.append(now)
            deliveries.append(now + latencies[r])
            due[r] = now + latencies[r]
        for r in delivered:
            due[r] = None
            starts, deliveries = lists[r][0], lists[r][2]
            if len(starts) < steps[r] and flows[r] is None and len(deliveries) == len(starts):
                starts.append(now)
                flows[r] = [chunks[r], now, 0.0, math.inf, []]
                changed = True
            elif len(starts) == steps[r] == len(deliveries):
                finished.add(r)
        if changed or ended:
            rate = rates[sum(flow is not None for flow in flows)]
            for flow in flows:
                if flow is not None and flow[2] != rate:
                    left = flow[0] - flow[2] * (now - flow[1])
                    flow[0] = left = left if left > 0.0 else 0.0
                    flow[1], flow[2], flow[3] = now, rate, now + left / rate
                    flow[4].append((now, left, rate))
        if len(finished) == len(rings) - 1:  # one ring left: alone on the hop from here
            r = next(r for r in each if r not in finished)
            _rest_alone(lists[r], history[r], flows[r], due[r], steps[r], chunks[r] / rates[1],
                        latencies[r])
            break
        changed = False
        now, ended, delivered = _next_instant(flows, due, limits)
        if now == math.inf:
            break
    return [Timeline([starts], [drains], [deliveries], [rates[1]], [hop[2]], history[r])
            for r, ((starts, drains, deliveries), (hop, _s, _b)) in enumerate(zip(lists, rings))]


def _one_hop_state(rings: list[tuple[Hop, int, Begun]], now: float) -> tuple[list, list, list]:
    """_one_hop's state at `now` from the steps begun: each ring's step draining ([bytes left,
    as of, rate, finish, history]; rate 0 where it started now, not yet solved), its last
    delivery while pending, and copies of its (starts, drains, deliveries)."""
    flows: list = [None] * len(rings)  # [ring] [bytes left, as of, rate, finish, history]
    due: list = [None] * len(rings)  # [ring] its last step's delivery, while pending
    lists = [(list(b.starts[0]), list(b.drains[0]), list(b.deliveries[0])) for _h, _s, b in rings]
    for r, (_hop, _steps, begun) in enumerate(rings):
        state = begun.draining[0]
        if state is not None and state[2] == 0.0:  # started now, its rate not yet solved
            flows[r] = [state[0], now, 0.0, math.inf, []]
        elif state is not None:
            left, since, rate = state
            flows[r] = [left, since, rate, since + left / rate, [(since, left, rate)]]
        elif lists[r][2] and lists[r][2][-1] > now:
            due[r] = lists[r][2][-1]
    return flows, due, lists


def _next_instant(flows: list, due: list, limits: list) -> tuple[float, list, list]:
    """The next instant of _one_hop (a drain's end or a delivery; inf when none), the rings
    whose drains end there (with those within their DRAINED_FRACTION limit) and those whose
    deliveries fall there."""
    now, ended, delivered = math.inf, [], []
    for r, flow in enumerate(flows):
        due_s = flow[3] if flow is not None else due[r]
        if due_s is not None and due_s < now:
            now = due_s
    for r, flow in enumerate(flows):
        if flow is not None and flow[3] == now:
            ended.append(r)
        elif flow is None and due[r] == now:
            delivered.append(r)
    if ended:
        ended += [r for r, flow in enumerate(flows) if r not in ended and flow is not None
                  and flow[0] - flow[2] * (now - flow[1]) <= limits[r]]
    return now, ended, delivered


def _rest_alone(lists: tuple, history: dict, flow: list | None, due_s: float | None,
                steps: int, drain_s: float, latency_s: float) -> None:
    """The rest of a ring of one position alone on its hop, appended to its (starts, drains,
    deliveries): the step draining (`flow`, at the rate alone now) ends at its finish, or the
    step in its latency is delivered at `due_s`; each next step starts at the last one's
    delivery, drains chunk / R (`drain_s`, the network's start + chunk / rate) and is delivered
    one latency later."""
    starts, drains, deliveries = lists
    if flow is not None:
        history[(0, len(drains))] = flow[4]
        drains.append(flow[3])
        deliveries.append(flow[3] + latency_s)
    elif due_s is None and len(starts) == len(deliveries) == 0:
        return
    while len(starts) < steps:
        start = deliveries[-1]
        starts.append(start)
        drains.append(start + drain_s)
        deliveries.append(drains[-1] + latency_s)


def _alike_begun(begun: Begun) -> bool:
    """Whether every position's begun steps are the first's."""
    return all(begun.starts[p] == begun.starts[0] and begun.deliveries[p] == begun.deliveries[0]
               and begun.drains[p] == begun.drains[0] and begun.draining[p] == begun.draining[0]
               for p in range(len(begun.starts)))


def _first(begun: Begun) -> Begun:
    return Begun(begun.starts[:1], begun.drains[:1], begun.deliveries[:1], begun.draining[:1])


class _Replay:
    """The network's handling of the rings' steps on their hops, replayed in arithmetic."""

    def __init__(self, rings: list[tuple[list[Hop], int, Begun]], rates: list[tuple],
                 now: float):
        self.rings, self.rates, self.n = rings, rates, len(rates)
        self.starts = [[list(s) for s in begun.starts] for _h, _s, begun in rings]
        self.drains = [[list(s) for s in begun.drains] for _h, _s, begun in rings]
        self.deliveries = [[list(s) for s in begun.deliveries] for _h, _s, begun in rings]
        self.flows = [[None] * self.n for _ in rings]  # [ring][position] the step draining:
        # [bytes left, as of, rate, finish, token, its rate history]
        self.history = [{} for _ in rings]  # [ring] (position, step) -> rate history
        self.heap: list = []  # (time, kind, ring, position, token)
        self.token = 0
        self.changed: set[int] = set()  # hops whose draining count moved this instant
        for r, (_hops, _steps, begun) in enumerate(rings):
            for p, state in enumerate(begun.draining):
                if state is not None and state[2] == 0.0:  # started now, its rate not yet
                    self._drain(r, p, [state[0], now, 0.0, math.inf, 0, []])  # solved
                elif state is not None:
                    left, since, rate = state
                    self.token += 1
                    self._drain(r, p, [left, since, rate, since + left / rate, self.token,
                                       [(since, left, rate)]])
                    heapq.heappush(self.heap, (since + left / rate, _DRAIN, r, p, self.token))
                elif self.deliveries[r][p] and self.deliveries[r][p][-1] > now:
                    heapq.heappush(self.heap, (self.deliveries[r][p][-1], _DELIVERY, r, p, 0))
        self._instant(now, [], [(r, p) for r in range(len(rings)) for p in range(self.n)])

    def run(self) -> list[Timeline]:
        """Every instant until both rings end; their timelines."""
        heap = self.heap
        while heap:
            now = heap[0][0]
            ended, delivered = [], []
            while heap and heap[0][0] == now:
                _t, kind, r, p, token = heapq.heappop(heap)
                flow = self.flows[r][p]
                if kind == _DELIVERY:
                    delivered.append((r, p))
                elif flow is not None and flow[4] == token:
                    ended.append((r, p))
            self._instant(now, ended, delivered)
        return [Timeline(self.starts[r], self.drains[r], self.deliveries[r],
                         [rate[1] for rate in self.rates], [h[2] for h in hops], self.history[r])
                for r, (hops, _steps, _begun) in enumerate(self.rings)]

    def _instant(self, now: float, ended: list, delivered: list) -> None:
        """One instant: drains ending (and any within DRAINED_FRACTION of their bytes, as
        network.py _on_wake retires them), deliveries starting next steps, hops retimed."""
        if ended:
            for r, flows in enumerate(self.flows):
                for p, flow in enumerate(flows):
                    if flow is not None and (r, p) not in ended and flow[0] - flow[2] * (
                            now - flow[1]) <= DRAINED_FRACTION * self.rings[r][0][p][2]:
                        ended.append((r, p))
        for r, p in ended:
            self._drained(r, p, now)
        for r, p in delivered:
            self._start(r, p, now)
            self._start(r, (p + 1) % self.n, now)
        for p in self.changed:
            self._retime(p, now)
        self.changed.clear()

    def _drained(self, r: int, p: int, now: float) -> None:
        flow, self.flows[r][p] = self.flows[r][p], None
        self.history[r][(p, len(self.drains[r][p]))] = flow[5]
        latency_s = self.rings[r][0][p][1]
        self.drains[r][p].append(now)
        self.deliveries[r][p].append(now + latency_s)
        heapq.heappush(self.heap, (now + latency_s, _DELIVERY, r, p, 0))
        self.changed.add(p)

    def _start(self, r: int, p: int, now: float) -> None:
        """Position p of ring r begins its next step now if it has one, none in flight, and
        its own and its predecessor's last steps are delivered by now."""
        hops, steps, _begun = self.rings[r]
        step, deliveries = len(self.starts[r][p]), self.deliveries[r]
        if step >= steps or len(deliveries[p]) < step:
            return
        if step:
            before = deliveries[p - 1 if p else self.n - 1]
            if len(before) < step or before[step - 1] > now or deliveries[p][step - 1] > now:
                return
        chunk = hops[p][2]
        self.starts[r][p].append(now)
        self._drain(r, p, [float(chunk), now, 0.0, math.inf, 0, []])

    def _drain(self, r: int, p: int, flow: list) -> None:
        self.flows[r][p] = flow
        self.changed.add(p)

    def _retime(self, p: int, now: float) -> None:
        """network.py _retime for every step draining at hop p whose fair rate moved."""
        draining = [flows[p] for flows in self.flows if flows[p] is not None]
        rate = self.rates[p][len(draining)]
        for r, flows in enumerate(self.flows):
            flow = flows[p]
            if flow is None or flow[2] == rate:
                continue
            left = flow[0] - flow[2] * (now - flow[1])
            flow[0] = left = left if left > 0.0 else 0.0
            flow[1], flow[2], flow[3] = now, rate, now + left / rate
            self.token += 1
            flow[4] = self.token
            flow[5].append((now, left, rate))
            heapq.heappush(self.heap, (flow[3], _DRAIN, r, p, self.token))
