"""Point-to-point transfers over the cluster graph, with links shared fluidly and fairly.

A transfer drains its bytes along its route at the max-min fair rate of the links it crosses,
then arrives after the route's latency. Rates are recomputed once per instant at which transfers
start or finish (a ring step's hops all start together: one computation, not one per hop), only
for the flows joined to a link that a flow entered or left through shared links (their connected
components: fair_share.linked_flows; the others' rates cannot move), and memoised per sequence of
those flows' routes (a hit returns the very same floats). Loads that start at one instant
with the same route, bytes and latency (an all-to-all's orbit flows under the quotient) drain as
one class: one flow in the solve with its links listed once per member (fair_share: the same
rates, bit for bit), each member delivered on its own. Only a flow whose
rate changed is touched: its bytes left are brought up to date and its finish time goes into a
heap, so an instant costs what changed, not every flow in flight. A wake-up is only scheduled
when the first finish changes, so no wake-up is stale. Time = latency + bytes / rate, where a
link's capacity is its configured bandwidth times the calibrated efficiency of its kind
(simsp.hardware.constants.LinkCalibration).
"""

from collections import defaultdict
from functools import partial
import heapq
import operator

import networkx as nx
import simpy
from simpy.events import NORMAL

from simsp.cluster.topology import hop_route, route_latency_s
from simsp.engine.fair_share import linked_flows, max_min_rates
from simsp.engine.flow_classes import Flow, FlowClasses
from simsp.engine.trace import Trace, TransferRecord
from simsp.hardware.constants import LinkCalibration

_SOLVE_ID = operator.attrgetter("solve_id")
_new = tuple.__new__  # skips NamedTuple's Python-level constructor on the hot path
# A flow counts as drained when fewer than this fraction of its bytes remain (float rounding).
DRAINED_FRACTION = 1e-9
# Route ids held by the memo's keys before it starts afresh (~100 MB of keys and rates).
MEMO_LIMIT = 2_000_000


class LinkCapacities(dict):
    """Link -> achieved bytes/s (bandwidth x its kind's efficiency), worked out on first use: a
    private simulation on a 4,096-GPU graph touches a few dozen of its ~17,000 links."""

    def __init__(self, graph: nx.DiGraph, calibration: LinkCalibration):
        super().__init__()
        self.graph, self.calibration = graph, calibration

    def __missing__(self, edge: tuple[str, str]) -> float:
        data = self.graph.edges[edge]
        capacity = self[edge] = data["bandwidth_Bps"] * self.calibration.efficiency(data["kind"])
        return capacity


class Network(FlowClasses):
    """The links of one cluster graph inside one simpy environment."""

    step_trains = True  # one-hop ring pieces in arithmetic (off: stepped on the links, the
    # reference tests/test_fsdp_step_trains.py compares with)
    flow_classes = True  # like loads starting together drain as one class (off: one by one,
    # the reference tests/test_fair_share_classes.py compares with)

    def __init__(self, env: simpy.Environment, graph: nx.DiGraph,
                 calibration: LinkCalibration | None = None, trace: Trace | None = None,
                 image_loads: dict | None = None, link_reps: dict | None = None):
        self.env = env
        self.graph = graph
        self.calibration = calibration or LinkCalibration()
        self.trace = trace if trace is not None else Trace()
        # (src, dst, via) -> links a transfer on that hop also loads, at its own rate: the
        # images of the flows a representative stands for (shortcuts/rail_symmetry.py)
        self.image_loads = image_loads or {}
        # link -> the link standing for its orbit (a quotient by the layout's symmetry: every
        # flow runs on the representatives of its links, shortcuts/quotient.py)
        self.link_reps = link_reps or {}
        # a representative run keeps no record of its ring steps (a trace draws only pipeline
        # transfers; the full simulation's millions of ring steps would fill the memory)
        self.record_ring_steps = True
        self.capacity_Bps = LinkCapacities(graph, self.calibration)
        self.bytes_sent: dict[int, int] = defaultdict(int)  # GPU -> bytes delivered from it
        self.bytes_received: dict[int, int] = defaultdict(int)  # GPU -> bytes delivered to it
        self._draining: dict[int, Flow] = {}  # class id (its first member's) -> the class's
        # first flow, in start order
        self._open: dict[tuple, Flow] = {}  # (route id, bytes, latency, start) -> a class
        # started since the last solve, which a like flow starting now joins
        self._finishes: list[tuple[float, int]] = []  # heap of (finish_s, flow id)
        self._users: dict[tuple[str, str], dict[int, None]] = {}  # link -> draining flow ids
        self._changed_links: list[tuple[str, str]] = []  # links a flow entered or left since
        # the last solve
        self._next_id = 0
        self._route_ids: dict[tuple, int] = {}  # route edges -> small integer id
        self._routes: dict[tuple, tuple] = {}  # (src, dst, via) -> (edges, latency_s, route id)
        self._plain_routes: dict[tuple, tuple] = {}  # (src, dst, via) -> (edges, latency_s)
        self._memo: dict[tuple[int, ...], tuple[float, ...]] = {}  # route ids -> rates
        self._memo_size = 0  # route ids held by the memo's keys
        self._recompute_pending = False
        self._wake: tuple[float, int, int] | None = None  # (time, flow id, token) of the wake
        self._token = 0  # bumps when a new wake-up replaces the pending one
        self.rate_computations = 0  # fair-share solves actually run (memo misses)
        self.flow_visits = 0  # flows (classes) whose rates the solves took up, summed over
        # the solves
        # link -> the one-hop ring pieces advanced in arithmetic on it (collectives/step_trains.py)
        self.trains: dict = {}
        # (gpus, order, via, NCCL choice) -> a ring channel's step latency (collectives/ring.py)
        self.step_latencies: dict = {}

    @property
    def flows_started(self) -> int:
        """Flows started on the links so far, transfers and loads (the work estimate's count,
        simsp/scenario/work.py)."""
        return self._next_id

    @property
    def transfers(self) -> list[TransferRecord]:
        """Every delivered transfer, in delivery order."""
        return self.trace.transfers

    def transfer(self, src_gpu: int, dst_gpu: int, nbytes: int, label: str = "",
                 via_gpu: int | None = None, drained: simpy.Event | None = None,
                 delivered: simpy.Event | None = None, latency_s: float | None = None,
                 ring_step: bool = False) -> simpy.Event:
        """Start sending `nbytes` from `src_gpu` to `dst_gpu`; the event returned (`delivered`
        if given, else a new one) succeeds on delivery with (start_s, end_s).

        `via_gpu`: relay through that GPU's links (NCCL PXN: NVLink to the GPU whose NIC is on
        the destination's rail, then its NIC). `drained`: an event to succeed when the last byte
        has left (one latency before delivery), so a pipelined sender can start its next slot.
        `latency_s`: the transfer's latency in place of its route's (a ring step's pipelined
        NCCL latency, engine/collectives/nccl_group.py). `ring_step`: a collective's ring
        step, traced and counted unless `record_ring_steps` is off."""
        if nbytes < 0:
            raise ValueError(f"cannot send {nbytes} bytes")
        flow = self._new_flow(src_gpu, dst_gpu, nbytes, label, via_gpu,
                              delivered if delivered is not None else self.env.event())
        if latency_s is not None:
            flow.latency_s = latency_s
        flow.drained = drained
        if ring_step and not self.record_ring_steps:
            flow.recorded = False
        if nbytes == 0 or not flow.edges:  # nothing shares a link: only the latency remains
            self._deliver_after_latency(flow)
        else:
            self._start_draining(flow)
        return flow.delivered

    def load(self, edges: tuple[tuple[str, str], ...], nbytes: float, latency_s: float,
             label: str = "") -> simpy.Event:
        """Drain `nbytes` over a multiset of links at one fair rate (a link listed m times
        carries m times that rate: fair_share weighs it so), then wait `latency_s`; the event
        returned succeeds then with (start_s, end_s). Not a transfer: nothing is traced or
        counted (engine/collectives/ring_alone.py: a hop standing for its copies in a symmetric ring)."""
        if nbytes < 0:
            raise ValueError(f"cannot load {nbytes} bytes")
        now = self.env.now
        route_id = self._route_ids.setdefault(edges, len(self._route_ids))
        flow = Flow(self._next_id, -1, -1, nbytes, label, edges, route_id, route_id, latency_s,
                    now, self.env.event(), float(nbytes), now, recorded=False)
        self._next_id += 1
        if nbytes == 0 or not edges:
            self._deliver_after_latency(flow)
        else:
            self._start_draining(flow, self.flow_classes)
        return flow.delivered

    def flows_on(self, edges) -> list:
        """The flows draining on any of `edges` (links), each once."""
        ids = {flow_id for edge in edges for flow_id in self._users.get(edge, ())}
        return [self._draining[flow_id] for flow_id in ids]

    def quiet(self, edges) -> bool:
        """Whether no flow drains on any of `edges` (links)."""
        return not any(self._users.get(edge) for edge in edges)

    def withdraw(self, edges: tuple[tuple[str, str], ...], delivered: simpy.Event
                 ) -> tuple[float, float, float] | None:
        """Take the load on `edges` whose delivery is `delivered` off the links while it
        drains (that delivery never comes: engine/collectives/hop_rings.py works the rest out
        in arithmetic): its (bytes left, as of when, rate) as held; None where it is not a
        lone load draining (a class's member or head, or drained)."""
        for flow_id in self._users.get(edges[0], ()):
            flow = self._draining[flow_id]
            if flow.delivered is delivered:
                break
        else:
            return None
        if flow.members:
            return None
        if self._open.get((flow.route_id, flow.nbytes, flow.latency_s, flow.start_s)) is flow:
            del self._open[(flow.route_id, flow.nbytes, flow.latency_s, flow.start_s)]
        self._unlink(flow)
        if self._wake is not None and self._wake[1] == flow.flow_id:
            self._wake, self._token = None, self._token + 1  # its wake-up no longer holds
        self._request_recompute()
        return flow.remaining, flow.updated_s, flow.rate_Bps

    def _new_flow(self, src_gpu: int, dst_gpu: int, nbytes: int, label: str,
                  via_gpu: int | None, delivered: simpy.Event) -> Flow:
        """A flow record for a new transfer along the cached route."""
        edges, latency_s, route_id = self._route(src_gpu, dst_gpu, via_gpu)
        now = self.env.now
        flow = Flow(self._next_id, src_gpu, dst_gpu, nbytes, label, edges, route_id, route_id,
                    latency_s, now, delivered, float(nbytes), now)
        self._next_id += 1
        return flow

    def route_of(self, src_gpu: int, dst_gpu: int, via_gpu: int | None = None
                 ) -> tuple[tuple, float]:
        """(links, latency in seconds) of a transfer's route without its image loads, worked
        out once per route: also what a flow standing for a transfer (load) drains over and
        then waits (engine/collectives/all_to_all.py orbit_all_to_all)."""
        key = (src_gpu, dst_gpu, via_gpu)
        if key not in self._plain_routes:
            edges = hop_route(self.graph, src_gpu, dst_gpu, via_gpu)
            latency_s = route_latency_s(self.graph, edges)
            if edges:
                latency_s += self.calibration.transfer_overhead_s
            if self.link_reps:  # the quotient: every link as its orbit's
                edges = tuple(self.link_reps.get(edge, edge) for edge in edges)
            self._plain_routes[key] = (edges, latency_s)
        return self._plain_routes[key]

    def _route(self, src_gpu: int, dst_gpu: int, via_gpu: int | None) -> tuple:
        """(edges, latency in seconds, route id) of a transfer, worked out once per route."""
        key = (src_gpu, dst_gpu, via_gpu)
        if key not in self._routes:
            edges, latency_s = self.route_of(src_gpu, dst_gpu, via_gpu)
            edges = edges + self.image_loads.get(key, ())
            route_id = self._route_ids.setdefault(edges, len(self._route_ids))
            self._routes[key] = (edges, latency_s, route_id)
        return self._routes[key]

    def _start_draining(self, flow: Flow, alike: bool = False) -> None:
        """A flow starts sharing its links: index it and mark its links changed (first handing
        back to the network any pieces running in arithmetic on them, step_trains.py); with
        `alike` (a load) it joins a like load's class started now, if any."""
        if self.trains:
            for group in dict.fromkeys(self.trains.get(edge) for edge in flow.edges):
                if group is not None:
                    group.dissolve()
        if alike and self._join_class(flow):
            return
        self._draining[flow.flow_id] = flow
        flow_id, users = flow.flow_id, self._users
        for edge in flow.edges:
            users.setdefault(edge, {})[flow_id] = None
        self._changed_links.extend(flow.edges)
        self._request_recompute()

    def _request_recompute(self) -> None:
        """Recompute the rates once, after every start and finish at this instant."""
        if not self._recompute_pending:
            self._recompute_pending = True
            self.env.timeout(0).callbacks.append(self._reschedule)

    def _reschedule(self, _event: simpy.Event | None = None) -> None:
        """Recompute the fair rates of the flows a start or finish since the last solve can
        affect (those linked to a changed link through shared links, fair_share.linked_flows:
        the others' rates cannot move), re-time those whose rate changed, and wake up when the
        first flow finishes draining."""
        self._recompute_pending = False
        if self._open:
            self._close_classes()
        changed, self._changed_links = self._changed_links, []
        if not self._draining:
            self._wake = None
            return
        draining = self._draining
        flows = [draining[flow_id] for flow_id in linked_flows(changed, self._users, draining)]
        self.flow_visits += len(flows)
        now = self.env.now
        for flow, rate in zip(flows, self._rates(flows) if flows else ()):
            if rate != flow.rate_Bps:
                self._retime(flow, rate, now)
        self._wake_at_first_finish()

    def _retime(self, flow: Flow, rate_Bps: float, now: float) -> None:
        """Bring a flow's bytes left up to now at its old rate, then finish it at the new one."""
        remaining = flow.remaining - flow.rate_Bps * (now - flow.updated_s)
        flow.remaining = remaining = 0.0 if 0.0 > remaining else remaining
        flow.updated_s, flow.rate_Bps = now, rate_Bps
        flow.finish_s = now + remaining / rate_Bps  # rates are finite and positive
        heapq.heappush(self._finishes, (flow.finish_s, flow.flow_id))

    def _first_finish(self) -> Flow | None:
        """The flow that drains first (earliest started on a tie); stale heap entries (flows
        retimed or retired since) are dropped on the way."""
        heap, draining = self._finishes, self._draining
        while heap:
            finish_s, flow_id = heap[0]
            flow = draining.get(flow_id)
            if flow is not None and flow.finish_s == finish_s:
                return flow
            heapq.heappop(heap)
        return None

    def _wake_at_first_finish(self) -> None:
        """Schedule the wake-up for the first finish, unless the pending one is it already."""
        first = self._first_finish()
        if first is None:
            self._wake = None
            return
        if self._wake is not None and self._wake[:2] == (first.finish_s, first.flow_id):
            return  # the pending wake-up is still the right one
        self._token += 1
        self._wake = (first.finish_s, first.flow_id, self._token)
        delay_s = first.finish_s - self.env.now
        wake = self.env.timeout(0.0 if 0.0 > delay_s else delay_s)
        wake.callbacks.append(partial(self._on_wake, self._token, first.flow_id))

    def _rates(self, flows: list[Flow]) -> tuple[float, ...]:
        """Max-min fair rates of `flows`, memoised per sequence of routes (same order, same
        floats: fair_share breaks ties by first appearance)."""
        key = tuple(map(_SOLVE_ID, flows))
        rates = self._memo.get(key)
        if rates is None:
            self._memo_size += len(key)
            if self._memo_size > MEMO_LIMIT:
                self._memo.clear()
                self._memo_size = len(key)
            solved = max_min_rates({i: f.edges * (1 + len(f.members)) if f.members else f.edges
                                    for i, f in enumerate(flows)}, self.capacity_Bps)
            rates = self._memo[key] = tuple(solved[i] for i in range(len(flows)))
            self.rate_computations += 1
        return rates

    def _on_wake(self, token: int, flow_id: int, _event: simpy.Event) -> None:
        """A flow should have drained: retire it, then each next first finish while it has
        drained (fewer than DRAINED_FRACTION of its bytes left now), one by one in (finish,
        id) order as the flows of the classes would go one by one, then reschedule."""
        if token != self._token:
            return
        self._wake = None
        due: list = []  # heap of (finish_s, member id, member, class) of the opened classes
        opened: dict[int, Flow] = {}  # class id -> class taken up at this wake
        woken = self._draining[flow_id]
        if woken.members is None:
            self._retire(woken)
        else:
            self._open_class(woken, due, opened)
            self._deliver_after_latency(heapq.heappop(due)[2])  # the flow woken for
        now = self.env.now
        while True:
            head = self._first_finish()
            if head is not None and head.flow_id in opened:
                heapq.heappop(self._finishes)  # taken up already: its members are in `due`
            elif not due:  # the next flow is a class's first: retire a lone one here
                if head is None or not _drained(head, now):
                    break
                if head.members is None:
                    self._retire(head)
                else:
                    self._open_class(head, due, opened)
            elif head is not None and (head.finish_s, head.flow_id) < due[0][:2]:
                self._open_class(head, due, opened)
            elif _drained(due[0][3], now):
                self._deliver_after_latency(heapq.heappop(due)[2])
            else:
                break
        if opened:
            self._settle(opened, due)
        if not self._recompute_pending:  # the rates of the flows left, now (a transfer that
            self._reschedule()  # starts later in this instant asks for them again)

    def _retire(self, flow: Flow) -> None:
        """A lone flow's last byte has left: it no longer shares links; delivery follows."""
        self._unlink(flow)
        self._deliver_after_latency(flow)

    def _deliver_after_latency(self, flow: Flow) -> None:
        """The last byte arrives one route latency after it left: the delivery event is
        scheduled for then (recorded and counted first, by its first callback)."""
        if flow.drained is not None:
            flow.drained.succeed()
        if flow.recorded:
            flow.delivered.callbacks.insert(0, partial(self._finish, flow))
        succeed_after(flow.delivered, flow.latency_s, (flow.start_s, self.env.now + flow.latency_s))

    def _finish(self, flow: Flow, _event: simpy.Event) -> None:
        """Record the delivered transfer and count its bytes."""
        self.delivered(flow.src, flow.dst, flow.nbytes, flow.start_s, flow.label)

    def delivered(self, src: int, dst: int, nbytes: int, start_s: float, label: str) -> None:
        """A transfer delivered now (a flow's, or one timed outside the links): its record and
        its bytes counted."""
        self.trace.add_transfer(_new(TransferRecord, (src, dst, nbytes, start_s, self.env.now,
                                                      label)))
        self.bytes_sent[src] += nbytes
        self.bytes_received[dst] += nbytes


def _drained(flow: Flow, now: float) -> bool:
    """Whether fewer than DRAINED_FRACTION of a flow's bytes are left now."""
    return flow.remaining - flow.rate_Bps * (now - flow.updated_s) <= \
        DRAINED_FRACTION * flow.nbytes


def succeed_after(event: simpy.Event, delay_s: float, value) -> None:
    """`event.succeed(value)`, but `delay_s` from now: one event where a timeout whose callback
    succeeds it would be two (simpy's Timeout sets these same fields)."""
    if event.triggered:
        raise RuntimeError(f"{event} has already been triggered")
    event._ok, event._value = True, value
    event.env.schedule(event, NORMAL, delay_s)
