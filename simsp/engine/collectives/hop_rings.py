"""A multi-hop ring piece's phase advanced in arithmetic while nothing else uses its links.

FSDP replicas placed unlike on the leaves run a DP ring of one member per node as one hop per
simulated member, NIC up to the next simulated member's NIC down (ring_alone.py
_lone_member_hops). No two of those hops share a link, so while no other flow uses their
links each hop drains every chunk at its own constant rate R (its links' max-min fair rate
alone, the rate the network solves) and the phase is the max-plus recurrence of
ring_alone.py's positions: step i of position p starts when its step i - 1 and its
predecessor's are delivered, drains until start + chunk / R and is delivered one latency
later. A `_Phase` works that out from the steps begun so far and wakes the simulation at its
end. The first other flow to start on one of its links dissolves it at that instant, as a
step_trains.py group is: each position's step in flight becomes a real flow of its bytes left
(or a delivery after the latency left) and the positions go on step by step, each step a flow,
until a position about to start a step finds every link of the ring quiet again: every step
begun then is delivered or in its latency (its delivery time known), and the rest is worked
out again. docs/fsdp.md, "Cost of the simulation".
"""

from bisect import bisect_right

import simpy

from simsp.engine.fair_share import max_min_rates
from simsp.engine.network import Network, succeed_after

Edge = tuple[str, str]
Hop = tuple[tuple[Edge, ...], float, float]  # (links, latency_s, wire bytes per step)
NOT_BEGUN = float("-inf")  # the start and drain end of a step begun before the timeline


def ring_phase(env: simpy.Environment, network: Network, hops: list[Hop], steps: int):
    """One phase of a ring of len(hops) positions, `steps` steps each (a process body): in
    arithmetic while its links are quiet and no two hops share a link, else step by step."""
    phase = _Phase(network, hops, steps)
    phase.resume([[] for _ in hops])
    yield phase.done


class _Phase:
    """One phase of a multi-hop ring: `done` succeeds at its end. In arithmetic it is
    registered on every link of the ring in `network.trains` (dissolved by the next flow
    there); stepped, its positions are processes of the current `generation`."""

    def __init__(self, network: Network, hops: list[Hop], steps: int):
        self.network, self.env, self.hops, self.steps = network, network.env, hops, steps
        self.edges = tuple(edge for hop_edges, _l, _c in hops for edge in hop_edges)
        self.distinct = len(set(self.edges)) == len(self.edges)
        self.rates = [_rate(network, edges) for edges, _l, _c in hops]  # [position]
        self.done = self.env.event()
        self.generation = 0
        self.timeline: tuple = ()  # ([position][step] start, drain end, delivery)

    def quiet(self) -> bool:
        """Whether the ring may run in arithmetic now: distinct links, none in use."""
        users, trains = self.network._users, self.network.trains
        return self.network.step_trains and self.distinct and not any(
            users.get(edge) or trains.get(edge) for edge in self.edges)

    def resume(self, begun: list[list]) -> None:
        """Go on from the steps begun ([position] each begun step's delivery: its time, or
        its event): in arithmetic where every one's time is known and the links are quiet,
        else step by step."""
        self.generation += 1
        known = [[_known_s(item) for item in items] for items in begun]
        if self.quiet() and all(t is not None for times in known for t in times):
            self._in_arithmetic(known)
        else:
            self._stepped(begun)

    def _in_arithmetic(self, known: list[list[float]]) -> None:
        self.timeline = _timeline(self.rates, self.hops, self.steps, known, self.env.now)
        for edge in self.edges:
            self.network.trains[edge] = self
        end_s = max(times[-1] for times in self.timeline[2])
        wake = self.env.timeout(max(end_s - self.env.now, 0.0))
        wake.callbacks.append(lambda _e, generation=self.generation: self._end(generation))

    def _end(self, generation: int) -> None:
        if generation == self.generation:
            self._leave()
            self.done.succeed()

    def _leave(self) -> None:
        for edge in self.edges:
            if self.network.trains.get(edge) is self:
                del self.network.trains[edge]

    def dissolve(self) -> None:
        """Another flow starts on these links: each position's step in flight handed back to
        the network as it stands now, the positions then going on step by step."""
        now = self.env.now
        self._leave()
        starts, drains, deliveries = self.timeline
        begun = []
        for p, (edges, latency_s, chunk) in enumerate(self.hops):
            step = bisect_right(starts[p], now)  # steps begun by now
            items: list = deliveries[p][:step]
            last = step - 1
            if drains[p][last] > now:  # draining: its bytes left as the network holds them
                left = _bytes_left(chunk, self.rates[p], now - starts[p][last])
                items[last] = self.network.load(edges, left, latency_s)
            elif deliveries[p][last] > now:  # in its latency
                delay_s = max(deliveries[p][last] - now, 0.0)
                items[last] = self.env.event()
                succeed_after(items[last], delay_s, (None, now + delay_s))
            begun.append(items)
        self._stepped(begun)

    def _stepped(self, begun: list[list]) -> None:
        """The positions as processes from the steps begun (floats delivered by now, events
        pending), each signalling `arrived[step][position]` at its delivery."""
        self.generation += 1
        env, generation = self.env, self.generation
        first = max(min(map(len, begun)) - 1, 0)  # no position waits on an earlier step
        arrived = [[env.event() for _ in self.hops] if i >= first else None
                   for i in range(self.steps)]  # [step][position]
        left = {p for p, items in enumerate(begun) if len(items) < self.steps
                or not _arrived_by(items[-1], env.now)}
        for p, items in enumerate(begun):
            for i in range(first, len(items)):
                self._signal(items[i], arrived[i][p], generation)
        if not left:
            self.done.succeed()
            return
        for p in range(len(self.hops)):
            env.process(self._position(p, begun, arrived, left, generation))

    def _signal(self, item, event: simpy.Event, generation: int) -> None:
        """Succeed `event` when the step's delivery `item` (a time by now, or an event) is."""
        if not isinstance(item, simpy.Event) or item.processed:
            event.succeed()
        else:
            item.callbacks.append(lambda _e: generation == self.generation and event.succeed())

    def _position(self, p: int, begun: list[list], arrived: list[list[simpy.Event]],
                  left: set[int], generation: int):
        """Position p's steps from the first not begun: each when its last step and its
        predecessor's are delivered, as a flow, unless the ring's links are all quiet then
        (the rest worked out again, resume); then its last delivery."""
        edges, latency_s, chunk = self.hops[p]
        before = p - 1 if p else len(self.hops) - 1
        for step in range(len(begun[p]), self.steps):
            if step:
                yield arrived[step - 1][before]
                yield arrived[step - 1][p]
                if generation != self.generation:
                    return
            if self.quiet():
                self.resume(begun)
                return
            delivery = self.network.load(edges, chunk, latency_s)
            begun[p].append(delivery)
            self._signal(delivery, arrived[step][p], generation)
        yield arrived[self.steps - 1][p]
        if generation == self.generation:
            left.discard(p)
            if not left:
                self.done.succeed()


def _bytes_left(chunk: float, rate_Bps: float, drained_s: float) -> float:
    """A drain's bytes left after `drained_s` at its rate (network.py _retime's update)."""
    left = chunk - rate_Bps * drained_s
    return left if left > 0.0 else 0.0


def _known_s(item) -> float | None:
    """A begun step's delivery time: a float, or a pending delivery's once its drain ended
    (network.py sets its value, (start, delivery time), then); None while it drains."""
    if not isinstance(item, simpy.Event):
        return item
    return item.value[1] if item.triggered else None


def _arrived_by(item, now: float) -> bool:
    return item.processed if isinstance(item, simpy.Event) else item <= now


def _timeline(rates: list[float], hops: list[Hop], steps: int, known: list[list[float]],
              now: float) -> tuple:
    """([position][step] each step's start, drain end and delivery) of the phase run alone
    from `now`, the steps begun before it delivered at `known` [position][step] times: the
    recurrence of _position at each hop's rate alone on its links."""
    n = len(hops)
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
    return starts, drains, deliveries


def _rate(network: Network, edges: tuple[Edge, ...]) -> float:
    """A flow's max-min fair rate alone on `edges` (as the network solves it)."""
    return max_min_rates({0: edges}, network.capacity_Bps)[0]
