"""A multi-hop ring piece's phase advanced in arithmetic while only it and the other ring of
the same hops use its links.

FSDP replicas placed unlike on the leaves run a DP ring of one member per node as one hop per
simulated member, NIC up to the next simulated member's NIC down (ring_alone.py
_lone_member_hops). No two of those hops share a link, so while no other flow uses their
links each hop drains every chunk at its own constant rate R and the phase is the max-plus
recurrence of ring_alone.py's positions; with the other ring of the same DP group on the same
hops (the backward's gather beside the reduce-scatter) the two are worked out together by the
hops' fair shares (hop_timelines.py). A `_Phase` works that out from the steps begun so far and
wakes the simulation at its end. The first other flow to start on one of its links dissolves
it (and its pair) at that instant, as a step_trains.py group is: each position's step in
flight becomes a real flow of its bytes left (or a delivery after the latency left) and the
positions go on step by step, each step a flow, until a position about to start a step finds
only this ring's and the other ring's steps on the links: those are taken off the links
(network.py withdraw) and the rest is worked out again. docs/fsdp.md, "Cost of the
simulation".
"""

from weakref import WeakKeyDictionary

import simpy

from simsp.engine.collectives.hop_timelines import (NOT_BEGUN, Begun, Hop, Timeline,
                                                     alone_timeline, begun_at,
                                                     begun_from_deliveries, joint_timelines)
from simsp.engine.fair_share import max_min_rates
from simsp.engine.network import Network, succeed_after


# network -> the multi-hop ring phases stepping on its links now (insertion-ordered keys)
_STEPPING: WeakKeyDictionary = WeakKeyDictionary()
# network -> {a hop's links (listed twice for two flows): a flow's fair rate on them}
_RATES: WeakKeyDictionary = WeakKeyDictionary()


def ring_phase(env: simpy.Environment, network: Network, hops: list[Hop], steps: int):
    """One phase of a ring of len(hops) positions, `steps` steps each (a process body): in
    arithmetic while no two hops share a link and only it and the other ring of its hops use
    their links, else step by step."""
    phase = _Phase(network, hops, steps)
    phase.resume([[] for _ in hops])
    yield phase.done


class _Phase:
    """One phase of a multi-hop ring: `done` succeeds at its end. In arithmetic it is
    registered on every link of the ring in `network.trains` (alone, or with the other ring
    on the same hops as a `_Pair`; dissolved by the next flow there); stepped, its positions
    are processes of the current `generation`."""

    def __init__(self, network: Network, hops: list[Hop], steps: int):
        self.network, self.env, self.hops, self.steps = network, network.env, hops, steps
        self.edges = tuple(edge for hop_edges, _l, _c in hops for edge in hop_edges)
        self.hop_edges = [hop_edges for hop_edges, _l, _c in hops]  # [position]
        self.distinct = len(set(self.edges)) == len(self.edges)
        self.rates = [_rate(network, edges) for edges, _l, _c in hops]  # [position]
        self.done = self.env.event()
        self.generation = 0
        self.timeline: Timeline | None = None  # the steps worked out in arithmetic
        self.begun: list[list] = []  # stepped: [position] each begun step's delivery
        self.arrived: list = []  # stepped: [step][position] its delivery signalled
        self.pair: _Pair | None = None  # the pair it runs in, if any

    def resume(self, begun: list[list]) -> None:
        """Go on from the steps begun ([position] each begun step's delivery: its time, or
        its event): in arithmetic where only this ring and the other of its hops use their
        links (_in_arithmetic), else step by step."""
        self.generation += 1
        if not self._in_arithmetic(begun):
            self._stepped(begun)

    def _in_arithmetic(self, begun: list[list]) -> bool:
        """Where only this ring's steps and those of the other ring on the same hops (stepped,
        or alone in arithmetic) use the links: take their steps draining off the links, work
        both out from now (hop_timelines.py: alone in lockstep or by the recurrence, together
        by the fair shares) and wake at each one's end. False, touching nothing, elsewhere."""
        other = self._other()
        if other is False:
            return False
        mine = self._draining(begun)
        theirs = other._draining(other.begun) if other and other.timeline is None else {}
        if mine is None or theirs is None or not self._only(mine, theirs):
            return False
        now = self.env.now
        self.generation += 1  # its processes, if stepped, no longer hold
        rings = [(self, self._begun(begun, mine))]
        if other:
            other.generation += 1  # its processes, or its wake-up at its end, no longer hold
            state = (begun_at(other.timeline, now) if other.timeline is not None
                     else other._begun(other.begun, theirs))
            rings.append((other, state))
        for phase, _state in rings:
            _STEPPING.get(self.network, {}).pop(phase, None)
        self._release(mine)
        if other and other.timeline is None:
            other._release(theirs)
        if other:
            self.pair = other.pair = _Pair(self, other)
        else:
            for edge in self.edges:
                self.network.trains[edge] = self
        for (phase, _state), timeline in zip(rings, self._work_out(rings, now)):
            phase.timeline = timeline
            wake = self.env.timeout(max(timeline.end_s() - now, 0.0))
            wake.callbacks.append(lambda _e, phase=phase, generation=phase.generation:
                                  phase._end(generation))
        return True

    def _release(self, draining: dict) -> None:
        """Let go of the positions' processes of the last stepped generation (each waits on
        an event of `arrived` that now never comes) and the deliveries of the steps taken off
        the links: their callbacks cleared, so they are freed by reference counting (the
        cyclic collector is paused during a run, gc_pause.py)."""
        for events in self.arrived:
            for event in events or ():
                if not event.triggered:
                    event.callbacks.clear()
        for delivery in draining.values():
            delivery.callbacks.clear()
        self.arrived = []

    def _work_out(self, rings: list[tuple], now: float) -> list[Timeline]:
        """The timelines of `rings` ((phase, steps begun) each) from now: one ring with no
        step draining by the recurrence, else by the fair shares of its hops."""
        if len(rings) == 1 and not any(state is not None for state in rings[0][1].draining):
            known = [list(times) for times in rings[0][1].deliveries]
            return [alone_timeline(self.rates, self.hops, self.steps, known, now)]
        rates = [(0.0, alone, _rate(self.network, edges + edges))
                 for alone, edges in zip(self.rates, self.hop_edges)]  # [position] by draining
        return joint_timelines([(phase.hops, phase.steps, state) for phase, state in rings],
                               rates, now)

    def _other(self):
        """The other ring on exactly these hops (stepped, or alone in arithmetic), None where
        there is none, False where the links are held otherwise (or arithmetic is off)."""
        network = self.network
        if not (network.step_trains and self.distinct):
            return False
        held = {id(network.trains.get(edge)): network.trains.get(edge) for edge in self.edges}
        stepping = [phase for phase in _STEPPING.get(network, {})
                    if phase is not self and phase.hop_edges == self.hop_edges]
        if len(held) > 1 or len(stepping) > 1 or (stepping and None not in held.values()):
            return False
        group = next(iter(held.values()))
        if group is None:
            return stepping[0] if stepping else None
        if not isinstance(group, _Phase) or group.pair is not None \
                or group.hop_edges != self.hop_edges:
            return False
        return group

    def _draining(self, begun: list[list]) -> dict | None:
        """{position: its step's delivery event} for the steps that still drain as flows;
        None where an earlier step's time is not known."""
        draining = {}
        for p, items in enumerate(begun):
            for item in items[-2::-1]:
                if _known_s(item) is None:
                    return None
                break
            if items and _known_s(items[-1]) is None:
                draining[p] = items[-1]
        return draining

    def _only(self, mine: dict, theirs: dict) -> bool:
        """Whether the flows on the ring's links are exactly these steps draining, each a
        lone flow (not a class: network.py withdraw)."""
        flows = self.network.flows_on(self.edges)
        ours = {id(event) for event in (*mine.values(), *theirs.values())}
        return len(flows) == len(ours) and all(
            id(flow.delivered) in ours and not flow.members for flow in flows)

    def _begun(self, begun: list[list], draining: dict) -> Begun:
        """The steps begun as hop_timelines.py takes them, those draining taken off the
        links (network.py withdraw) with their bytes left, as of when, and rate."""
        state = begun_from_deliveries([[_known_s(item) for item in items[:-1]]
                                       + ([] if p in draining or not items
                                          else [_known_s(items[-1])])
                                       for p, items in enumerate(begun)])
        for p, delivery in draining.items():
            state.starts[p].append(NOT_BEGUN)
            state.draining[p] = self.network.withdraw(self.hops[p][0], delivery)
        return state

    def _end(self, generation: int) -> None:
        if generation == self.generation:
            if self.pair is not None:
                self.pair.ended(self)
            else:
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
        timeline = self.timeline
        begun = []
        for p, (edges, latency_s, _chunk) in enumerate(self.hops):
            step = timeline.begun(p, now)  # steps begun by now
            items: list = timeline.deliveries[p][:step]
            last = step - 1
            if timeline.drains[p][last] > now:  # draining: its bytes left as the network holds them
                left, since_s, rate = timeline.draining(p, last, now)
                items[last] = self.network.load(edges, _bytes_left(left, rate, now - since_s),
                                                latency_s)
            elif timeline.deliveries[p][last] > now:  # in its latency
                delay_s = max(timeline.deliveries[p][last] - now, 0.0)
                items[last] = self.env.event()
                succeed_after(items[last], delay_s, (None, now + delay_s))
            begun.append(items)
        self._stepped(begun)

    def _stepped(self, begun: list[list]) -> None:
        """The positions as processes from the steps begun (floats delivered by now, events
        pending), each signalling `arrived[step][position]` at its delivery."""
        self.generation += 1
        self.timeline, self.begun = None, begun
        _STEPPING.setdefault(self.network, {})[self] = None
        env, generation = self.env, self.generation
        first = max(min(map(len, begun)) - 1, 0)  # no position waits on an earlier step
        arrived = [[env.event() for _ in self.hops] if i >= first else None
                   for i in range(self.steps)]  # [step][position]
        self.arrived = arrived
        left = {p for p, items in enumerate(begun) if len(items) < self.steps
                or not _arrived_by(items[-1], env.now)}
        for p, items in enumerate(begun):
            for i in range(first, len(items)):
                self._signal(items[i], arrived[i][p], generation)
        if not left:
            self._stepped_end()
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
            if self._in_arithmetic(begun):
                return
            delivery = self.network.load(edges, chunk, latency_s)
            begun[p].append(delivery)
            self._signal(delivery, arrived[step][p], generation)
        yield arrived[self.steps - 1][p]
        if generation == self.generation:
            left.discard(p)
            if not left:
                self._stepped_end()

    def _stepped_end(self) -> None:
        _STEPPING.get(self.network, {}).pop(self, None)
        self.done.succeed()


def _bytes_left(remaining: float, rate_Bps: float, drained_s: float) -> float:
    """A drain's bytes left after `drained_s` more at its rate (network.py _retime's update)."""
    left = remaining - rate_Bps * drained_s
    return left if left > 0.0 else 0.0


def _known_s(item) -> float | None:
    """A begun step's delivery time: a float, or a pending delivery's once its drain ended
    (network.py sets its value, (start, delivery time), then); None while it drains."""
    if not isinstance(item, simpy.Event):
        return item
    return item.value[1] if item.triggered else None


def _arrived_by(item, now: float) -> bool:
    return item.processed if isinstance(item, simpy.Event) else item <= now


def _rate(network: Network, edges: tuple) -> float:
    """A flow's max-min fair rate alone on `edges` (as the network solves it; each of two
    like flows' where the links are listed twice: fair_share weighs them so), solved once
    per network and links."""
    rates = _RATES.setdefault(network, {})
    if edges not in rates:
        rates[edges] = max_min_rates({0: edges}, network.capacity_Bps)[0]
    return rates[edges]



class _Pair:
    """Two rings on the same hops in arithmetic together, registered on their links: the next
    other flow there dissolves both; when one ends the other stays there alone."""

    def __init__(self, first: _Phase, second: _Phase):
        self.phases = [first, second]
        self.network = first.network
        for edge in first.edges:
            self.network.trains[edge] = self

    def dissolve(self) -> None:
        """Hand both rings' steps in flight back to the network (network.py)."""
        for edge in self.phases[0].edges:
            if self.network.trains.get(edge) is self:
                del self.network.trains[edge]
        for phase in self.phases:
            phase.pair = None
        for phase in self.phases:
            phase.dissolve()

    def ended(self, phase: _Phase) -> None:
        """`phase` ended: the other runs on alone (its timeline already holds that)."""
        other = self.phases[1] if phase is self.phases[0] else self.phases[0]
        phase.pair = other.pair = None
        for edge in phase.edges:
            self.network.trains[edge] = other
