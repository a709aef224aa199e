"""A p2p ring's K/V and dK/dV sends timed in arithmetic where nothing else shares their links
(docs/context-parallel.md, "A ring alone on its links").

Each rank of a CP ring waits for its step's send and receive to be delivered before it posts the
next step or leaves the attention call (training/context_parallel/ring.py), so at any moment the
ring's transfers are at most one per neighbour pair, all of one ring phase. Where the meta-mode
plan finds that no other owner's hop meets the CP group on its links (shortcuts/methods.py: its
method is not step by step), and every neighbour pair of one direction keeps its lone
max-min-fair rate (engine/fair_share.py) with all the pairs of that direction sending at once
(so with any subset: max-min rates never fall when flows leave), each transfer drains at its
lone rate from start to end: it is delivered bytes / rate + latency after both sides posted,
as the fair-shared network (engine/network.py) delivers it, in one event instead of the
network's solve, wake-up and delivery. Recorded and counted as the network records it.
"""

from functools import partial

import numpy as np

from simsp.engine.fair_share import max_min_rates
from simsp.engine.group_timing import STEP_BY_STEP
from simsp.engine.network import succeed_after
from simsp.engine.trace import TransferRecord
from simsp.model.replay import delay_to

_new = tuple.__new__  # skips NamedTuple's Python-level constructor, as engine/network.py


class LoneRing:
    """The lone-rate routes of one CP ring's neighbour pairs on a Network (`gpus` in cp-rank
    order), found once; `send` starts a transfer timed in arithmetic."""

    def __init__(self, network, gpus: tuple):
        self.network = network
        self.routes = {}  # (src gpu, dst gpu) -> (lone rate in B/s, latency in s)
        self.pass_kernels = {}  # ring_pass.py: its ranks' call charges -> their kernel seconds
        self.kinds = {}  # ring_pass.py: (gpus, phase, K/V bytes) -> its sends, found once
        self._pairs = {}  # (gpus, to) -> pair_arrays
        for to in (1, -1):  # forward sends go to rank + 1, backward ones to rank - 1
            pairs = [(g, gpus[(i + to) % len(gpus)]) for i, g in enumerate(gpus)]
            routes = [network.route_of(src, dst) for src, dst in pairs]
            together = max_min_rates(dict(enumerate(e for e, _ in routes)), network.capacity_Bps)
            for i, ((edges, latency_s), pair) in enumerate(zip(routes, pairs)):
                lone = max_min_rates({0: edges}, network.capacity_Bps)[0]
                if not edges or together[i] != lone:
                    raise ValueError(f"CP pair {pair} shares a link with its ring")
                self.routes[pair] = (lone, latency_s)

    def send(self, src: int, dst: int, nbytes: int, label: str, delivered) -> None:
        """Deliver `nbytes` from GPU src to dst at the pair's lone rate plus its latency:
        `delivered` succeeds with (start_s, end_s), the transfer recorded first."""
        env, network = self.network.env, self.network
        now = env.now
        end_s, delay = self._timing(src, dst, nbytes, now)
        delivered.callbacks.insert(0, partial(_record, network, src, dst, nbytes, now, label))
        succeed_after(delivered, end_s - now if delay is None else delay, (now, end_s))

    def _timing(self, src: int, dst: int, nbytes: int, start_s: float) -> tuple:
        """(drained-plus-latency time, the delay from start_s landing on it or None)."""
        rate_Bps, latency_s = self.routes[(src, dst)]
        end_s = self.end_time(start_s, nbytes, rate_Bps, latency_s)
        return end_s, delay_to(start_s, end_s)

    @staticmethod
    def end_time(start_s, nbytes: int, rate_Bps, latency_s):
        """A lone send's delivery: drained at its lone rate, then the route's latency (floats;
        ring_pass.py makes the same operations per element on (c,) arrays)."""
        return (start_s + LoneRing.drain_s(nbytes, rate_Bps)) + latency_s

    @staticmethod
    def drain_s(nbytes: int, rate_Bps):
        """Seconds `nbytes` take at the lone rate (a float, or (c,) for (c,) rates)."""
        return nbytes / rate_Bps

    def pair_arrays(self, gpus: tuple, to: int) -> tuple:
        """For each cp rank's send to rank + to (ring_pass.py): (src GPUs, dst GPUs, (c,) lone
        rates in B/s, (c,) latencies in s), in cp-rank order."""
        found = self._pairs.get((gpus, to))
        if found is None:
            c = len(gpus)
            srcs, dsts = list(gpus), [gpus[(i + to) % c] for i in range(c)]
            routes = [self.routes[pair] for pair in zip(srcs, dsts)]
            found = self._pairs[(gpus, to)] = (
                srcs, dsts, np.array([rate for rate, _ in routes], dtype=np.float64),
                np.array([latency for _, latency in routes], dtype=np.float64))
        return found

    def delivered_at(self, src: int, dst: int, nbytes: int, start_s: float, label: str) -> float:
        """When `send` at start_s would deliver (start_s plus the delay it schedules), the
        transfer recorded and counted as its delivery would (training/context_parallel/
        ring_pass.py, which works a whole ring call out at once)."""
        end_s, delay = self._timing(src, dst, nbytes, start_s)
        at_s = start_s + (end_s - start_s if delay is None else delay)
        network = self.network  # as Network.delivered, with the delivery time given
        network.trace.add_transfer(_new(TransferRecord, (src, dst, nbytes, start_s, at_s, label)))
        network.bytes_sent[src] += nbytes
        network.bytes_received[dst] += nbytes
        return at_s


def lone_ring(world, members: tuple) -> LoneRing | None:
    """The CP group's LoneRing where the plan keeps the group off other owners' links and the
    network has no image loads or link quotient; else None (its sends run as flows)."""
    network = world.network
    if (world.comm.timing_of(tuple(members)) == STEP_BY_STEP or network.image_loads
            or network.link_reps or len(members) < 2):
        return None
    try:
        return LoneRing(network, tuple(members))
    except ValueError:
        return None


def _record(network, src: int, dst: int, nbytes: int, start_s: float, label: str,
            _event) -> None:
    """The delivery's record and bytes, as the network's own (Network.delivered)."""
    network.delivered(src, dst, nbytes, start_s, label)
