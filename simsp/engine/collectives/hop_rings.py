"""A multi-hop ring piece's phase advanced in arithmetic while nothing else uses its links.

FSDP replicas placed unlike on the leaves run a DP ring of one member per node as one hop per
simulated member, NIC up to the next simulated member's NIC down (ring_alone.py
_lone_member_hops). No two of those hops share a link, so while no other flow uses their
links each hop drains every chunk at its own constant rate R (its links' max-min fair rate
alone, the rate the network solves) and the phase is the max-plus recurrence of
ring_alone.py _position: step i of position p starts when its step i - 1 and its
predecessor's are delivered, drains until start + chunk / R and is delivered one latency
later. A `HopRing` works that out once at the phase's start and wakes the simulation at its
end. The first other flow to start on one of its links dissolves it at that instant, as a
step_trains.py group is: each position's step in flight becomes a real flow of its bytes left
(or a delivery after the latency left) and the positions go on step by step, each step a
one-step piece in a step_trains.py group while its links allow (a flow where not).
docs/fsdp.md, "Cost of the simulation".
"""

from bisect import bisect_right

import simpy

from simsp.engine.fair_share import max_min_rates
from simsp.engine.collectives.step_trains import joinable
from simsp.engine.network import Network, succeed_after

Edge = tuple[str, str]
Hop = tuple[tuple[Edge, ...], float, float]  # (links, latency_s, wire bytes per step)


def ring_phase(env: simpy.Environment, network: Network, hops: list[Hop], steps: int):
    """One phase of a ring of len(hops) positions, `steps` steps each (a process body): in
    arithmetic where its links are quiet and no two hops share a link, else step by step."""
    edges = [edge for hop_edges, _l, _c in hops for edge in hop_edges]
    quiet = network.step_trains and len(set(edges)) == len(edges) and not any(
        network._users.get(edge) or network.trains.get(edge) for edge in edges)
    inboxes = [[env.event() for _ in hops] for _ in range(steps)]  # [step][position]
    if not quiet:
        yield env.all_of([env.process(_position(env, network, hops, p, inboxes))
                          for p in range(len(hops))])
        return
    outcome = yield HopRing(network, hops, steps, tuple(edges)).done
    if outcome is not None:  # dissolved: the positions going on step by step
        yield env.all_of(outcome)


class HopRing:
    """One phase of a multi-hop ring, worked out at its start (registered on every link of
    it in `network.trains`): `done` succeeds with None at its end, or with the processes of
    its positions going on step by step if another flow dissolves it first."""

    def __init__(self, network: Network, hops: list[Hop], steps: int, edges: tuple[Edge, ...]):
        self.network, self.env, self.hops, self.edges = network, network.env, hops, edges
        self.done = self.env.event()
        self.starts, self.drains, self.deliveries = _timeline(network, hops, steps,
                                                              self.env.now)
        for edge in edges:
            network.trains[edge] = self
        end_s = max(times[-1] for times in self.deliveries)
        self._wake = self.env.timeout(max(end_s - self.env.now, 0.0))
        self._wake.callbacks.append(self._end)

    def _end(self, _event: simpy.Event) -> None:
        if self.done.triggered:
            return
        self._leave()
        self.done.succeed(None)

    def _leave(self) -> None:
        for edge in self.edges:
            if self.network.trains.get(edge) is self:
                del self.network.trains[edge]

    def dissolve(self) -> None:
        """Another flow starts on these links: each position's step in flight handed back to
        the network as it stands now, the positions then going on step by step."""
        now, env, hops = self.env.now, self.env, self.hops
        self._leave()
        inboxes = [[env.event() for _ in hops] for _ in self.starts[0]]  # [step][position]
        current = []  # [position] (its step in flight, that step's delivery or None)
        for p, (edges, latency_s, chunk) in enumerate(hops):
            after = (p + 1) % len(hops)
            step = bisect_right(self.starts[p], now) - 1  # steps start at the phase start
            for i in range(step):
                inboxes[i][after].succeed()
            drain_s, delivery_s = self.drains[p][step], self.deliveries[p][step]
            if delivery_s <= now:
                inboxes[step][after].succeed()
                current.append((step, None))
                continue
            if drain_s > now:  # draining: its bytes left as the network would hold them
                left = chunk - _rate(self.network, edges) * (now - self.starts[p][step])
                delivery = self.network.load(edges, max(left, 0.0), latency_s)
            else:
                delivery = env.event()
                succeed_after(delivery, max(delivery_s - now, 0.0), None)
            delivery.callbacks.append(lambda _e, box=inboxes[step][after]: box.succeed())
            current.append((step, delivery))
        self.done.succeed([env.process(_position(env, self.network, hops, p, inboxes, *now_at))
                           for p, now_at in enumerate(current)])


def _timeline(network: Network, hops: list[Hop], steps: int, start_s: float) -> tuple:
    """([position][step] each step's start, drain end and delivery) of the phase run alone
    from `start_s`: the recurrence of _position at each hop's rate alone on its links."""
    rates = [_rate(network, edges) for edges, _l, _c in hops]
    n = len(hops)
    starts = [[start_s] * steps for _ in hops]
    drains = [[0.0] * steps for _ in hops]
    deliveries = [[0.0] * steps for _ in hops]
    for i in range(steps):
        for p, (_edges, latency_s, chunk) in enumerate(hops):
            if i:
                own, before = deliveries[p][i - 1], deliveries[p - 1 if p else n - 1][i - 1]
                starts[p][i] = own if own > before else before
            drains[p][i] = starts[p][i] + chunk / rates[p]
            deliveries[p][i] = drains[p][i] + latency_s
    return starts, drains, deliveries


def _rate(network: Network, edges: tuple[Edge, ...]) -> float:
    """A flow's max-min fair rate alone on `edges` (as the network solves it)."""
    return max_min_rates({0: edges}, network.capacity_Bps)[0]


def _position(env: simpy.Environment, network: Network, hops: list[Hop], position: int,
              inboxes: list[list[simpy.Event]], step: int | None = None,
              delivery: simpy.Event | None = None):
    """One position's steps (from the start, or after `step`, begun already: its delivery
    `delivery` in flight, None if delivered): send its chunk to the next position, wait for
    its own delivery and for its predecessor's chunk (_Ring.rank_loop)."""
    edges, latency_s, chunk = hops[position]
    after = (position + 1) % len(hops)
    if step is not None:
        yield inboxes[step][position]
        if delivery is not None:
            yield delivery
    for inbox in inboxes[0 if step is None else step + 1:]:
        delivered = _step(env, network, hops[position])
        delivered.callbacks.append(lambda _e, box=inbox[after]: box.succeed())
        yield inbox[position]
        yield delivered


def _step(env: simpy.Environment, network: Network, hop: Hop) -> simpy.Event:
    """One step of a hop (an event succeeding at its delivery): a one-step piece in a
    step_trains.py group where its links hold nothing but such pieces (the same updates the
    network makes, without a rate solve), else a flow."""
    edges, latency_s, chunk = hop
    group = joinable(network, edges)
    if group is None:
        return network.load(edges, chunk, latency_s)
    delivered = env.event()

    def on_outcome(joined: simpy.Event) -> None:
        if joined.value is None:  # delivered in arithmetic
            delivered.succeed()
        else:  # dissolved: the step's delivery as the network now holds it
            joined.value[0].callbacks.append(lambda _e: delivered.succeed())

    group.join(chunk, latency_s, 0).callbacks.append(on_outcome)
    return delivered
