"""Point-to-point transfers over the cluster graph, with links shared fluidly and fairly.

A transfer drains its bytes along its route at the max-min fair rate of the links it crosses
(rates are recomputed whenever a transfer starts or finishes), then arrives after the route's
latency. Time = latency + bytes / rate, where a link's capacity is its configured bandwidth times
the calibrated efficiency of its kind (simsp.hardware.LinkCalibration).
"""

from collections import defaultdict
from dataclasses import dataclass
from functools import partial

import networkx as nx
import simpy

from simsp.cluster.topology import gpu_name, route, route_latency_s
from simsp.engine.fair_share import max_min_rates
from simsp.engine.trace import Trace, TransferRecord
from simsp.hardware import LinkCalibration

# A flow counts as drained when fewer than this fraction of its bytes remain (float rounding).
DRAINED_FRACTION = 1e-9


@dataclass
class _Flow:
    """One transfer in flight: its route, bytes still to drain and current fair rate."""

    flow_id: int
    src: int
    dst: int
    nbytes: int
    label: str
    edges: tuple[tuple[str, str], ...]
    latency_s: float
    start_s: float
    delivered: simpy.Event
    remaining: float
    rate_Bps: float = 0.0


class Network:
    """The links of one cluster graph inside one simpy environment."""

    def __init__(self, env: simpy.Environment, graph: nx.DiGraph,
                 calibration: LinkCalibration | None = None, trace: Trace | None = None):
        self.env = env
        self.graph = graph
        self.calibration = calibration or LinkCalibration()
        self.trace = trace if trace is not None else Trace()
        self.capacity_Bps = {(u, v): d["bandwidth_Bps"] * self.calibration.efficiency(d["kind"])
                             for u, v, d in graph.edges(data=True)}
        self.bytes_sent: dict[int, int] = defaultdict(int)  # GPU -> bytes delivered from it
        self.bytes_received: dict[int, int] = defaultdict(int)  # GPU -> bytes delivered to it
        self._draining: dict[int, _Flow] = {}  # flow id -> flow, in start order
        self._next_id = 0
        self._updated_s = env.now
        self._generation = 0  # bumps on every rate change; stale wake-ups are ignored

    @property
    def transfers(self) -> list[TransferRecord]:
        """Every delivered transfer, in delivery order."""
        return self.trace.transfers

    def transfer(self, src_gpu: int, dst_gpu: int, nbytes: int, label: str = "") -> simpy.Event:
        """Start sending `nbytes` from `src_gpu` to `dst_gpu`; the event succeeds on delivery."""
        if nbytes < 0:
            raise ValueError(f"cannot send {nbytes} bytes")
        flow = self._new_flow(src_gpu, dst_gpu, nbytes, label)
        if nbytes == 0 or not flow.edges:  # nothing shares a link: only the latency remains
            self._deliver_after_latency(flow)
        else:
            self._advance()
            self._draining[flow.flow_id] = flow
            self._reschedule()
        return flow.delivered

    def _new_flow(self, src_gpu: int, dst_gpu: int, nbytes: int, label: str) -> _Flow:
        """A flow record for a new transfer along the cached route."""
        edges = tuple(route(self.graph, gpu_name(src_gpu), gpu_name(dst_gpu)))
        latency_s = route_latency_s(self.graph, edges)
        if edges:
            latency_s += self.calibration.transfer_overhead_s
        flow = _Flow(self._next_id, src_gpu, dst_gpu, nbytes, label, edges, latency_s,
                     self.env.now, self.env.event(), float(nbytes))
        self._next_id += 1
        return flow

    def _advance(self) -> None:
        """Drain every flow at its current rate up to now."""
        elapsed_s = self.env.now - self._updated_s
        if elapsed_s > 0:
            for flow in self._draining.values():
                flow.remaining -= flow.rate_Bps * elapsed_s
        self._updated_s = self.env.now

    def _reschedule(self) -> None:
        """Recompute fair rates and wake up when the first flow finishes draining."""
        self._generation += 1
        if not self._draining:
            return
        rates = max_min_rates({i: f.edges for i, f in self._draining.items()}, self.capacity_Bps)
        for flow_id, flow in self._draining.items():
            flow.rate_Bps = rates[flow_id]
        first = min(self._draining.values(), key=lambda f: max(f.remaining, 0.0) / f.rate_Bps)
        wake = self.env.timeout(max(first.remaining, 0.0) / first.rate_Bps)
        wake.callbacks.append(partial(self._on_wake, self._generation, first.flow_id))

    def _on_wake(self, generation: int, flow_id: int, _event: simpy.Event) -> None:
        """A flow should have drained: retire it (and any finishing with it), then reschedule."""
        if generation != self._generation:
            return
        self._advance()
        self._draining[flow_id].remaining = 0.0
        for flow in [f for f in self._draining.values()
                     if f.remaining <= DRAINED_FRACTION * f.nbytes]:
            del self._draining[flow.flow_id]
            self._deliver_after_latency(flow)
        self._reschedule()

    def _deliver_after_latency(self, flow: _Flow) -> None:
        """The last byte arrives one route latency after it left."""
        arrival = self.env.timeout(flow.latency_s)
        arrival.callbacks.append(partial(self._finish, flow))

    def _finish(self, flow: _Flow, _event: simpy.Event) -> None:
        """Record the delivered transfer, count its bytes and wake whoever waits on it."""
        self.trace.add_transfer(TransferRecord(flow.src, flow.dst, flow.nbytes, flow.start_s,
                                               self.env.now, flow.label))
        self.bytes_sent[flow.src] += flow.nbytes
        self.bytes_received[flow.dst] += flow.nbytes
        flow.delivered.succeed()
