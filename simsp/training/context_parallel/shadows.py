"""A CP group run as one program (docs/context-parallel.md, "A CP group as one program").

With d = 1 every op a CP rank runs outside its CP attention calls is the same on each CP rank
of its stage; so CP rank 0 of each stage (the leader) runs as a simpy process and CP ranks
1..c−1 (its shadows) run no program: the ranks of CP index j on every stage form slice j, and
engine/slice_clocks.py carries every event's time in each slice, (c,) floats. A slice's time
moves as its own run would move it: a pure delay by the same addition; the points where slices
differ set their vectors from arithmetic each rank's run makes:
- a CP ring call: the prologue and epilogue kernels (TE's bookkeeping, per CP rank: its own
  kernel seconds added in turn) and the ring pass (ring_pass.py group_side, every rank's entry
  its slice's clock, its ends the pass's);
- a pipeline transfer: it starts at the later of its two posts in each slice and drains alone
  on its links (`cp_shadow_why_not` proves no link carries two of them), delivered as the
  network delivers a lone flow: (start + bytes / lone rate) + latency;
- a collective over ranks of several slices (the dp_cp gradient reduce-scatter and parameter
  all-gather): it starts at the latest slice's arrival, the leader waiting there, the shadows
  joining with it; after it every slice is at the same time.
A shadow's counters are charged its own CP kernels; its other FLOPs are the leader's (settled at
the end); its memory rows are its leader's (the same allocations in the same order).
"""

from bisect import bisect_left, bisect_right
from collections import Counter
from typing import NamedTuple

import numpy as np

from simsp.engine.fair_share import max_min_rates
from simsp.engine.slice_clocks import SliceClocks, SlicesRefused
from simsp.model.replay import delay_to
from simsp.training.context_parallel.ring import diagonal_step
from simsp.training.context_parallel.ring_pass import GroupCharges
from simsp.training.context_parallel.step_clock import CallCharges, _charge


class CpShadows:
    """The run's slices: the leaders, each leader's shadows, the slice clocks."""

    def __init__(self, world, leaders: dict):
        """`leaders`: leader rank -> its CP group's ranks in cp order (the leader first)."""
        self.world, self.grid = world, world.grid
        self.c = world.grid.cp
        self.clocks = SliceClocks(world.env, self.c)
        self.groups = dict(leaders)  # leader -> (c,) ranks
        self.leader_of = {s: lead for lead, group in leaders.items() for s in group[1:]}
        self._shadowed = frozenset(self.leader_of)
        self.cp_flops = {lead: {} for lead in leaders}  # leader -> FLOPs its CP calls added
        self.ends = {}  # leader -> (c,) its slices' clocks at its end
        # (src, dst) leader ranks -> ((c,) lone rates B/s, (c,) latencies s, per slice links)
        self._p2p = {}
        # link -> ([finish s], [(start s, B/s)]) of the transfers on it, in finish order
        self._busy = {}
        self._kernels = {}  # (leader, bookkeeping key) -> (kernels, c) their seconds
        self._groups = {}  # (leader, call shapes, ring phase) -> its GroupCharges
        self._calls = {}  # ((call shapes, ring phase), CP index) -> a shadow's charges
        # (call shapes, ring phase, diagonal, bookkeeping bytes) -> a step's charges
        self._steps = {}
        self._bookkeeping = {}  # (phase, kernels' bytes) -> their seconds
        self._safe = _safe_links(world, leaders)  # links no pipeline transfers can fill
        world.comm.slices = self
        world.mailbox.slices = self
        for lead, group in leaders.items():
            cp = world.ranks[lead].cp
            cp.shadows, cp.slices = [world.ranks[rank] for rank in group], self

    def shadowed(self) -> frozenset:
        """The ranks that run no program."""
        return self._shadowed

    # --- CP calls -----------------------------------------------------------------------
    def kernels_end(self, start, group: list, kernels_of, key: tuple) -> np.ndarray:
        """(c,) each rank's clock after its bookkeeping kernels `kernels_of(cp)` (`key`: what
        they depend on), the leader's run already (step_clock.run_step, its charges memoised):
        each rank's `start` plus its kernels' seconds added in turn (np.add.accumulate down a
        (1 + kernels, c) matrix, zero-padded: x + 0.0 == x). Elementwise kernels count no
        FLOPs: a shadow's are timed, not charged."""
        matrix = self._kernels.get((group[0].rank, key))
        if matrix is None:
            matrix = self._kernels[(group[0].rank, key)] = self._kernel_matrix(group, kernels_of)
        matrix[0] = start  # the row kept for the clocks
        return np.add.accumulate(matrix, axis=0)[-1]  # (c,)

    def _kernel_matrix(self, group: list, kernels_of) -> np.ndarray:
        """(1 + kernels, c) every rank's bookkeeping kernel seconds in order below a row for
        its clock, zero-padded."""
        leader, seconds = group[0], []
        for j, rank in enumerate(group):
            kernels = kernels_of(j) if rank.cp.size > 1 else []
            if j == 0:
                memo = rank.cp.steps.get(("kernels", tuple(kernels), leader.phase))
                seconds.append(() if memo is None else tuple(s for _, s in memo[1]))
                continue
            seconds.append(self._bookkeeping_seconds(rank, leader.phase, kernels))
        matrix = np.zeros((1 + max(map(len, seconds)), len(group)))  # (1 + kernels, c)
        for j, column in enumerate(seconds):
            matrix[1:1 + len(column), j] = column
        return matrix

    def _bookkeeping_seconds(self, rank, phase: str, kernels: list) -> tuple:
        """A shadow's bookkeeping kernel seconds (the same kernels on the same GPU model take
        the same time: found once per kernel list), charging nothing."""
        key = (phase, tuple(nbytes for _, nbytes in kernels))
        found = self._bookkeeping.get(key)
        if found is None:
            rank.phase = phase
            added, held, _ = _apart(rank, lambda r: rank.cp._kernels(r, kernels))
            if any(added.values()):
                raise SlicesRefused("a bookkeeping kernel counted FLOPs")
            found = self._bookkeeping[key] = tuple(s for _, s in held)
        return found

    def group_charges(self, group: list, key: tuple, own, kernels_of) -> GroupCharges:
        """The group's charges of a ring call (`key`: its shapes and ring phase; `own`: the
        leader's, charged by its run; `kernels_of(j, rank)`: shadow j's (after(step): a step's
        bookkeeping kernels, kernels(r, ring phase, step): a step's kernels)), found the first
        time and taken again after while the leader's are the same (its memo's), every call
        counted: its shadows' FLOPs owed (`settle`), whole numbers only."""
        found = self._groups.get((group[0].rank, key))
        if found is not None and found.charges[0] is own:
            found.calls += 1
            return found
        found = GroupCharges([own] + [self._shadow_call(j, rank, key, kernels_of)
                                      for j, rank in enumerate(group[1:], start=1)], self)
        if all(type(charges) is ShadowCall for charges in found.charges[1:]):
            found.calls = 1
            self._groups[(group[0].rank, key)] = found
        else:  # fractional FLOPs: each shadow charged in order, as its own run would
            for rank, charges in zip(group[1:], found.charges[1:]):
                charges.recharge(rank)
        return found

    def _shadow_call(self, j: int, rank, key: tuple, kernels_of):
        """Shadow j's charges of a ring call of `key` (_shadow_charges), found once per run:
        its kernels depend on the call's shapes, its CP index and the GPU model alone (the
        bookkeeping bytes te_p2p_kernels gives j's steps, the block at the diagonal step), so
        each stage's shadow j takes the first's."""
        found = self._calls.get((key, j))
        if found is None:
            found = self._calls[(key, j)] = self._shadow_charges(rank, key, *kernels_of(j, rank))
        return found

    def _shadow_charges(self, rank, key: tuple, after, kernels):
        """A shadow's charges of a ring call, charging nothing: step by step, a step's
        charges found once per (call, diagonal or not, its bookkeeping kernels' bytes): the
        same kernels on the same GPU model. A ShadowCall where its FLOPs are whole numbers,
        else the CallCharges its own run would recharge."""
        ring_phase, c = key[1], rank.cp.size
        diagonal = diagonal_step(ring_phase, c)
        steps = []
        for step in range(c):
            sig = (key, step == diagonal, tuple(nbytes for _, nbytes in after(step)))
            found = self._steps.get(sig)
            if found is None:
                found = self._steps[sig] = _apart(
                    rank, lambda r, s=step: kernels(r, ring_phase, s))
            steps.append(found)
        flops = {}  # phase -> FLOPs of the call, whole numbers
        for added, _, _ in steps:
            for phase, value in added.items():
                if not float(value).is_integer():
                    return CallCharges(steps)
                flops[phase] = flops.get(phase, 0) + value
        return ShadowCall(tuple(step[2] for step in steps), tuple(
            (phase, (value,)) for phase, value in flops.items()))

    def land(self, vector) -> None:
        """The current clock becomes `vector` (slice 0 checked against the simulation's)."""
        self.clocks.landed(vector)

    def count_cp_flops(self, leader: int, before: dict, after: dict) -> None:
        """Add the FLOPs a leader's CP call charged it (its shadows get the rest as its)."""
        total = self.cp_flops[leader]
        for phase, value in after.items():
            delta = value - before.get(phase, 0)
            if delta:
                total[phase] = total.get(phase, 0) + delta

    # --- pipeline transfers -------------------------------------------------------------
    def delivery(self, src: int, dst: int, nbytes: int, start) -> np.ndarray:
        """(c,) each slice's delivery of a transfer src -> dst (leader ranks) started at
        `start` (c,), as the network delivers a lone flow."""
        rates, latencies, links = self._p2p.get((src, dst)) or self._routes(src, dst)
        if nbytes == 0:
            return start + latencies
        # engine/network.py: finish = start + bytes / rate (_retime), a wake-up that far
        # after the start (_wake_at_first_finish), then the latency (_deliver_after_latency)
        finish = start + nbytes / rates  # (c,)
        if links:
            self._alone(links, rates.tolist(), start.tolist(), finish.tolist())
        drained = start + (finish - start)  # (c,)
        return drained + latencies

    def _alone(self, links: list, rates: list, starts: list, finishes: list) -> None:
        """Record each slice's transfer on its links from start to finish at its lone rate;
        where the lone rates of the transfers a link carries meanwhile (any slice or stage,
        whether or not at once) exceed its capacity, the network would share it, which the
        arithmetic does not: the run is refused (SlicesRefused). Within capacity every
        transfer keeps its lone rate under max-min fairness (engine/fair_share.py)."""
        busy = self._busy
        for edges, rate, start, finish in zip(links, rates, starts, finishes):
            for edge, copies, capacity in edges:
                finishes, held = busy.get(edge) or busy.setdefault(edge, ([], []))
                first = bisect_left(finishes, start)  # those finished before start: apart
                load = rate * copies + sum(other for other_start, other in held[first:]
                                           if other_start <= finish)
                if load > capacity:
                    raise SlicesRefused(f"pipeline transfers share link {edge}")
                at = bisect_right(finishes, finish)  # kept in finish order
                finishes.insert(at, finish)
                held.insert(at, (start, rate * copies))

    def _routes(self, src: int, dst: int) -> tuple:
        network, grid = self.world.network, self.grid
        a, b = grid.coords(src), grid.coords(dst)
        rates, latencies = np.empty(self.c), np.empty(self.c)  # (c,) each
        links = []  # per slice (link, copies, capacity) of its route's links others may fill
        for j in range(self.c):
            edges, latency, _ = network._route(grid.rank_of(a.tp, a.dp, a.pp, j),
                                               grid.rank_of(b.tp, b.dp, b.pp, j), None)
            rates[j] = _lone_rate(network, edges) if edges else np.inf
            latencies[j] = latency
            links.append(tuple((edge, copies, network.capacity_Bps[edge]) for edge, copies
                               in Counter(edges).items() if edge not in self._safe))
        found = self._p2p[(src, dst)] = (rates, latencies, links if any(links) else ())
        return found

    # --- collectives over several slices ------------------------------------------------
    def spans(self, group: tuple, rank: int) -> list:
        """The shadows of leader `rank` in `group` (a collective over several slices), else
        []."""
        leader_of = self.leader_of
        return [member for member in group if leader_of.get(member) == rank]

    def meet(self):
        """Wait until the latest slice's time, every slice then at it (a generator)."""
        env, clocks = self.world.env, self.clocks
        latest = float(clocks.now.max())
        if latest > env.now:
            delay = delay_to(env.now, latest)
            if delay is None:
                raise AssertionError("no delay lands on the slices' latest arrival")
            timeout = env.timeout(delay)
            clocks.at(timeout, np.full(self.c, latest))
            yield timeout
        clocks.landed(np.full(self.c, latest))

    # --- after the run ------------------------------------------------------------------
    def settle(self, results) -> None:
        """Each shadow's end (its slice's clock at its leader's end) and FLOPs (its CP
        calls' own, the rest its leader's)."""
        ranks = self.world.ranks
        for lead, group in self.groups.items():
            leader = ranks[lead]
            ends = self.ends[lead]
            cp_flops = self.cp_flops[lead]
            for j, rank in enumerate(group[1:], start=1):
                results.end_s[rank] = float(ends[j])
                shadow = ranks[rank]
                for (owner, _), group_calls in self._groups.items():
                    if owner == lead and group_calls.calls:
                        for phase, values in group_calls.charges[j].flops:
                            shadow.flops[phase] += group_calls.calls * sum(values)
                for phase, value in leader.flops.items():
                    shadow.flops[phase] = (value - cp_flops.get(phase, 0)) + \
                        shadow.flops.get(phase, 0)


def _lone_rate(network, edges: list) -> float:
    """B/s a flow over `edges` drains at alone on them (engine/fair_share.py, the network's
    own solve with it the only flow)."""
    return max_min_rates({0: edges}, network.capacity_Bps)[0]


def _safe_links(world, leaders: dict) -> frozenset:
    """The links whose capacity holds twice the lone rate of every pipeline transfer route
    crossing them (any slice, either direction, the interleaved wrap included): a blocking
    call sends at most two at once from a rank, so no transfers there ever exceed it."""
    grid, network = world.grid, world.network
    loads = {}  # link -> summed lone rates of the routes crossing it, B/s
    for lead in leaders:
        a = grid.coords(lead)
        for step in (1, -1):
            if grid.pp == 1:
                continue
            for j in range(grid.cp):
                src = grid.rank_of(a.tp, a.dp, a.pp, j)
                dst = grid.rank_of(a.tp, a.dp, (a.pp + step) % grid.pp, j)
                edges = network._route(src, dst, None)[0]
                if not edges:
                    continue
                rate = _lone_rate(network, edges)
                for edge, copies in Counter(edges).items():
                    loads[edge] = loads.get(edge, 0.0) + 2 * copies * rate
    return frozenset(edge for edge, load in loads.items()
                     if load <= network.capacity_Bps[edge])


class ShadowCall(NamedTuple):
    """A shadow's ring call as ring_pass.py reads it (its kernel seconds per step) and its
    FLOPs per phase, whole numbers (so added at the end in any order, the same sums)."""

    seconds: tuple  # per step (kernel s, ...) in order
    flops: tuple  # ((phase, (FLOPs,)), ...)


def _apart(rank, kernels) -> tuple:
    """step_clock._charge of `kernels` on `rank`, its counters left as they were (a shadow's
    FLOPs are settled at the end)."""
    flops, busy = dict(rank.flops), dict(rank.busy_s)
    try:
        return _charge(rank, kernels)
    finally:
        rank.flops.clear()
        rank.flops.update(flops)
        rank.busy_s.clear()
        rank.busy_s.update(busy)
