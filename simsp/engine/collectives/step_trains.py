"""One-hop ring pieces advanced in arithmetic while nothing but such pieces uses their links.

A ring of one member per node runs as one hop, its steps one after another: each drains a
chunk over the hop's links at its max-min fair rate, then waits the step latency
(ring_alone.py segment_run). While the only flows on those links are such pieces' steps on the
very same links (FSDP's gather and reduce-scatter of one DP group, docs/fsdp.md), every rate
is the links' fair share among the pieces draining, which depends on how many drain and on
nothing else: the network would solve the same rates at every step. A `StepTrains` group then
advances the pieces in plain arithmetic, the same updates the network makes (bytes left
brought up to date when a rate changes, the finish at bytes left / rate, delivery one latency
after), and wakes the simulation only when a piece ends. The first other flow to start on one
of its links (a pipeline send, a stepped ring) dissolves the group at that instant: each
piece's step in flight becomes a real flow of its bytes left (or a delivery after the latency
left) and the piece goes on step by step until its links are quiet again. docs/fsdp.md, "Cost of
the simulation".
"""

from dataclasses import dataclass, replace
import math

import simpy

from simsp.engine.fair_share import max_min_rates
from simsp.engine.network import DRAINED_FRACTION, Network, succeed_after

Edge = tuple[str, str]


@dataclass(slots=True, eq=False)
class _Train:
    """One piece in a group: its step's chunk and latency, the steps after the current one,
    and the current step's state (draining: bytes left as of `updated_s` at `rate_Bps`, the
    last byte leaving at `due_s`; else delivered at `due_s`)."""

    chunk: float
    latency_s: float
    steps_left: int
    done: simpy.Event  # None when the piece ends; (delivery, steps left) when dissolved
    draining: bool = True
    remaining: float = 0.0
    updated_s: float = 0.0
    rate_Bps: float = 0.0
    due_s: float = math.inf  # its next event: the drain's end, or the delivery


class StepTrains:
    """The pieces running virtually on one tuple of links (registered on each of them in
    `network.trains`): `trains` as they stand at `at_s`, and, worked out ahead, as they stand
    when the first of them ends."""

    def __init__(self, network: Network, edges: tuple[Edge, ...]):
        self.network, self.env, self.edges = network, network.env, edges
        self.trains: list[_Train] = []  # in join order, as of the last commit
        self._ahead: tuple = ()  # (the trains copied and advanced to the first end, indices of those ended)
        self._rates: dict[int, float] = {}  # pieces draining -> each one's fair rate
        self._token = 0  # bumps when the pending wake-up is replaced or cancelled
        for edge in edges:
            network.trains[edge] = self

    def join(self, chunk: float, latency_s: float, steps_left: int) -> simpy.Event:
        """A piece starts a step now, `steps_left` more after it; the event returned succeeds
        with None when its last step is delivered, or with (the current step's delivery,
        steps left) if the group dissolves first."""
        now = self.env.now
        self._commit(now)
        train = _Train(chunk, latency_s, steps_left, self.env.event(), remaining=float(chunk),
                       updated_s=now)
        self.trains.append(train)
        _retime(self.trains, now, self._rate_table(len(self.trains)))
        self._schedule()
        return train.done

    def dissolve(self) -> None:
        """Another flow starts on these links: hand every piece's step in flight back to the
        network as it stands now, and leave the links."""
        now = self.env.now
        self._commit(now)
        self._leave()
        for train in self.trains:
            if train.draining:
                left = train.remaining - train.rate_Bps * (now - train.updated_s)
                delivery = self.network.load(self.edges, max(left, 0.0), train.latency_s)
            else:
                delivery = self.env.event()
                succeed_after(delivery, max(train.due_s - now, 0.0), None)
            train.done.succeed((delivery, train.steps_left))
        self.trains = []

    def _commit(self, now: float) -> None:
        """Bring the trains up to `now` (ending any whose last delivery is due by then)."""
        _end_s, ended = self._advance(self.trains, now, stop_at_end=False)
        self._end(ended)

    def _end(self, ended: list[_Train]) -> None:
        for train in ended:
            self.trains.remove(train)
            train.done.succeed(None)

    def _leave(self) -> None:
        """Unregister from the links and cancel the pending wake-up."""
        self._token += 1
        for edge in self.edges:
            if self.network.trains.get(edge) is self:
                del self.network.trains[edge]

    def _schedule(self) -> None:
        """Work out (on copies) when the first piece ends if nothing interrupts, and wake
        then."""
        self._token += 1
        if not self.trains:
            self._leave()
            return
        copies = [replace(train) for train in self.trains]
        end_s, ended = self._advance(copies, math.inf, stop_at_end=True)
        self._ahead = (copies, [copies.index(train) for train in ended])
        wake = self.env.timeout(max(end_s - self.env.now, 0.0))
        wake.callbacks.append(lambda _e, token=self._token: self._wake(token))

    def _wake(self, token: int) -> None:
        """The predicted end: the trains as worked out ahead; end those that ended."""
        if token != self._token:
            return
        copies, ended = self._ahead
        self.trains = copies
        self._end([copies[i] for i in ended])
        self._schedule()

    def _advance(self, trains: list[_Train], until_s: float, stop_at_end: bool) -> tuple:
        """Process every step event at or before `until_s` (drains ending, deliveries, next
        steps starting) in time order, in place; stop after the first instant a piece ends if
        `stop_at_end`. Returns (that instant or inf, the pieces that ended)."""
        live, ended = list(trains), []
        rates = self._rate_table(len(live))
        while live:
            if len(live) == 1:
                end_s = self._alone(live[0], until_s)
                if end_s <= until_s:
                    ended.append(live[0])
                return end_s, ended
            next_s = math.inf
            for train in live:
                if train.due_s < next_s:
                    next_s = train.due_s
            if next_s > until_s:
                break
            changed = False
            for train in live:
                if train.draining:
                    if train.due_s == next_s or train.remaining - train.rate_Bps * (
                            next_s - train.updated_s) <= DRAINED_FRACTION * train.chunk:
                        train.draining, train.due_s = False, next_s + train.latency_s
                        changed = True
                elif train.due_s == next_s:
                    if not train.steps_left:
                        ended.append(train)
                        continue
                    train.steps_left -= 1
                    train.draining, train.remaining = True, float(train.chunk)
                    train.updated_s, train.rate_Bps, changed = next_s, 0.0, True
            if ended and ended[-1] in live:
                live = [t for t in live if t not in ended]
            if changed:
                _retime(live, next_s, rates)
            if ended and stop_at_end:
                return next_s, ended
        return math.inf, ended

    def _alone(self, train: _Train, until_s: float) -> float:
        """One piece alone on the links, advanced to `until_s` in closed form: at its own
        fair rate R every later step drains its chunk in x = chunk / R and is delivered one
        latency L later, so step i after the current one's delivery d0 starts at
        d0 + (i - 1)(x + L). Returns when its last step is delivered."""
        rate = self._rate(1)
        # a draining piece is at `rate` already: _retime runs whenever the draining count moves
        first_s = train.due_s + train.latency_s if train.draining else train.due_s
        period_s = train.chunk / rate + train.latency_s
        end_s = first_s + train.steps_left * period_s
        if end_s <= until_s or until_s < first_s:
            if train.draining and train.due_s <= until_s:
                train.draining, train.due_s = False, first_s
            return end_s
        done = min(int((until_s - first_s) // period_s), train.steps_left - 1)  # steps since
        start_s = first_s + done * period_s  # the step in flight at until_s started then
        train.steps_left -= done + 1
        drain_s = start_s + train.chunk / rate
        if until_s < drain_s:
            train.draining, train.remaining, train.updated_s = True, float(train.chunk), start_s
            train.rate_Bps, train.due_s = rate, drain_s
        else:
            train.draining, train.due_s = False, start_s + period_s
        return end_s

    def _rate_table(self, pieces: int) -> list[float]:
        """[k] each piece's fair rate with k of `pieces` draining (k = 0: none, 0.0)."""
        return [0.0] + [self._rate(k) for k in range(1, pieces + 1)]

    def _rate(self, draining: int) -> float:
        """Each piece's max-min fair rate with `draining` of them on the links alone."""
        if draining not in self._rates:
            flows = {i: self.edges for i in range(draining)}
            self._rates[draining] = max_min_rates(flows, self.network.capacity_Bps)[0]
        return self._rates[draining]


def _retime(trains: list[_Train], now: float, rates: list[float]) -> None:
    """The network's _retime for every draining piece whose fair rate changed (`rates`: each
    one's rate by the number draining)."""
    draining = 0
    for train in trains:
        draining += train.draining
    rate = rates[draining]
    for train in trains:
        if train.draining and rate != train.rate_Bps:
            left = train.remaining - train.rate_Bps * (now - train.updated_s)
            train.remaining = left if left > 0.0 else 0.0
            train.updated_s, train.rate_Bps = now, rate
            train.due_s = now + train.remaining / rate


def joinable(network: Network, edges: tuple[Edge, ...]) -> StepTrains | None:
    """The group a piece stepping on `edges` may run in now: the one on exactly these links,
    or a new one; None where a real flow or another group uses one of them."""
    if not network.step_trains or not network.quiet(edges):
        return None
    groups = {network.trains.get(edge) for edge in edges}
    if groups == {None}:
        return StepTrains(network, edges)
    group = groups.pop()
    return group if not groups and group is not None and group.edges == edges else None


def lone_hop_steps(env: simpy.Environment, network: Network, hop: tuple, steps: int):
    """A one-hop piece's `steps` steps (ring_alone.py _position with one position: each step
    starts when the last is delivered), run in a StepTrains group while its links allow."""
    edges, latency_s, chunk = hop
    while steps:
        group = joinable(network, edges)
        if group is None:
            steps -= 1
            yield network.load(edges, chunk, latency_s)
            continue
        outcome = yield group.join(chunk, latency_s, steps - 1)
        if outcome is None:
            return
        delivery, steps = outcome
        yield delivery
