"""Collectives called from inside per-rank simpy processes, NCCL-communicator style.

Every member of a group calls the same collective; the k-th call of each member on a group
meets the k-th call of the others (key: (group, k)). When all expected members have arrived one
ring runs over the network and each caller gets its own result:
    result = yield from comm.all_reduce(group, rank, buffer, nbytes, tag)
Shortcut `present`: only these ranks run programs; the others are assumed to behave exactly like
them (meta mode), so the ring still moves their bytes but the rendezvous does not wait for them.
How each group's collectives are timed is one `timing_of(group)` passed in (the methods of
engine/group_timing.py: step by step, as one node's piece, as its ring alone, in closed form, an
all-to-all as a template); the plain default runs every group step by step. Which group gets
which method is decided before the run by the caller (meta mode's plan, simsp/shortcuts/plan.py).
"""

from dataclasses import dataclass, field, replace

import numpy as np
import simpy

from simsp.cluster.topology import placement
from simsp.engine.collectives.all_to_all import all_to_all, alone_time, orbit_all_to_all
from simsp.engine.collectives.collnet import sharp_in_group
from simsp.engine.collectives.deepep import (NUM_SMS, alone_time as two_hop_alone_time,
                                             routes_key, two_hop, two_hop_plan)
from simsp.engine.collectives.ring import (DEFAULT_ELEM_BYTES, RING_COLLECTIVES, CollectiveStats,
                                      element_count)
from simsp.engine.collectives.nccl_group import link_speeds_GBps, nccl_choice
from simsp.engine.collectives.nccl_tuning import TREE, p2p_channels
from simsp.engine.network import Network
from simsp.engine.collectives.nvls import NVLS, nvls_bytes_per_direction, nvls_in_group
from simsp.engine.collectives.ring_alone import alone_stats, node_segment, segment_run
from simsp.engine.collectives.ring_piece import RingPiece, piece_plan, piece_run
from simsp.engine.collectives.ring_plan import (ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, channel_bytes,
                                    channel_rings, chunk_counts, chunk_offsets)
from simsp.engine.collectives.ring_timing import closed_form_stats, collective_time
from simsp.engine.group_timing import (CLOSED_FORM, NODE_PIECE, RING_ALONE, STEP_BY_STEP, STEPPED,
                                      TEMPLATE, EveryGroup, TimingOf)
from simsp.engine.trace import Trace
from simsp.errors import SimulationError

ALL_TO_ALL = "all_to_all"
DEEPEP = ("deepep_dispatch", "deepep_combine")  # DeepEP's normal kernels (collectives/deepep.py)

__all__ = ["Communicator", "collective_time"]


@dataclass
class _Meeting:
    """One pending collective: who is expected, who has arrived with what."""

    collective: str
    group: tuple[int, ...]
    nbytes: int
    tag: str
    expected: frozenset[int]
    done: simpy.Event
    elem_bytes: int
    buffers: dict[int, object] = field(default_factory=dict)
    name: str = ""  # the communicator's name ("": the group's default one)


class Communicator:
    """Rendezvous and ring execution of collectives over one Network (rank r on GPU r)."""

    def __init__(self, env: simpy.Environment, network: Network, present: set[int] | None = None,
                 elem_bytes: int = DEFAULT_ELEM_BYTES, trace: Trace | None = None,
                 timing_of: TimingOf = EveryGroup(STEP_BY_STEP), pieces: dict | None = None):
        self.env = env
        self.network = network
        self.present = None if present is None else frozenset(present)
        self.elem_bytes = elem_bytes
        self.trace = trace if trace is not None else network.trace
        self.timing_of = timing_of  # group -> its method (engine/group_timing.py)
        # stepped ring group -> the positions that run (collectives/ring_piece.py: meta only)
        self.pieces = pieces or {}
        self.stats: list[CollectiveStats] = []  # one per finished collective, in finish order
        self._calls: dict[tuple, int] = {}  # (group, rank, communicator name) -> calls so far
        self._meetings: dict[tuple, _Meeting] = {}  # (group, communicator name, call number)
        self._plans: dict[tuple, object] = {}  # alone stats by (collective, group, S, elem); DeepEP plans
        self._alike: dict[tuple, object] = {}  # alone, by placement: stats, all-to-all seconds
        self.alone_flows = 0  # flows the TEMPLATE all-to-alls' private simulations started
        self.sm_share = None  # engine/sm_share.py SmShare where communication SMs are modelled
        self.nccl_sms = True  # whether NCCL's channels hold SMs (the world sets --sm-contention)
        self._sm_counts: dict[tuple, int] = {}  # (collective, group, bytes) -> SMs it holds
        # the groups whose default communicators have NCCL_COLLNET_ENABLE (Megatron's
        # --use-sharp: the DP-CP groups; the world sets them); None: every communicator, as the
        # calibration says
        self.sharp_groups: frozenset | None = None
        self.pair_orbits: dict = {}  # EP group -> its pairs' orbits (rail_symmetry.pair_orbits)

    def all_reduce(self, group, rank: int, buffer, nbytes: int, tag: str = "",
                   elem_bytes: int | None = None, sms: int | None = None, name: str = ""):
        """Sum of every member's buffer, same shape (None in meta mode). Use with `yield from`.
        `name` tells apart communicators over the same ranks (their calls meet separately)."""
        return (yield from self._call(ALL_REDUCE, group, rank, buffer, nbytes, tag, elem_bytes,
                                      sms, name))

    def reduce_scatter(self, group, rank: int, buffer, nbytes: int, tag: str = "",
                       elem_bytes: int | None = None, sms: int | None = None):
        """This member's chunk of the sum (1-D; None in meta). `nbytes` is the full size S;
        `sms`: the SMs its kernel holds (a userbuffers kernel's), default NCCL's channels."""
        return (yield from self._call(REDUCE_SCATTER, group, rank, buffer, nbytes, tag,
                                      elem_bytes, sms))

    def all_gather(self, group, rank: int, chunk, nbytes: int, tag: str = "",
                   elem_bytes: int | None = None, sms: int | None = None):
        """Concatenation of every member's chunk (1-D; None in meta). `nbytes` is the whole S."""
        return (yield from self._call(ALL_GATHER, group, rank, chunk, nbytes, tag, elem_bytes,
                                      sms))

    def all_to_all(self, group, rank: int, chunks: list | None, send_bytes: list[int],
                   tag: str = "", sms: int | None = None):
        """All-to-all(-v): this member sends send_bytes[j] bytes (chunks[j] in numeric mode) to
        group[j]; returns what each member sent it, in group order (None in meta). Run as flows
        over the links (engine/collectives/all_to_all.py), or where the group's method is
        TEMPLATE timed as those flows alone."""
        group = tuple(group)
        meeting = self._join(ALL_TO_ALL, group, rank, (list(send_bytes), chunks), 0, tag, 1)
        results = yield from self._hold_sms(meeting, rank, sms)
        return results[group.index(rank)]

    def deepep(self, group, rank: int, chunks: list | None, in_rank: np.ndarray,
               token_bytes: int, tag: str, combine: bool = False):
        """DeepEP's dispatch (or `combine`): this member's tokens in_rank (T, n) bool to the
        members each reaches, two hops across nodes (engine/collectives/deepep.py); chunks[j]
        (numeric) is what group[j] gets. Returns what each member sent it (None in meta)."""
        group = tuple(group)
        meeting = self._join(DEEPEP[combine], group, rank, (in_rank, chunks), token_bytes, tag,
                             1)
        results = yield from self._hold_sms(meeting, rank)
        return results[group.index(rank)]

    def _call(self, collective: str, group, rank: int, buffer, nbytes: int, tag: str,
              elem_bytes: int | None = None, sms: int | None = None, name: str = ""):
        """Join the rendezvous, wait for the ring to finish, return this member's result.

        `elem_bytes` (default: the communicator's) sizes the elements, e.g. 4 for fp32 grads."""
        group = tuple(group)
        meeting = self._join(collective, group, rank, buffer, nbytes, tag,
                             elem_bytes or self.elem_bytes, name)
        results = yield from self._hold_sms(meeting, rank, sms)
        return results[group.index(rank)]

    def _hold_sms(self, meeting: _Meeting, rank: int, sms: int | None = None):
        """Wait for the collective to finish, its kernel holding on `rank` `sms` SMs (default:
        one per NCCL channel, where --sm-contention models them) from the rank's arrival (the
        kernel is launched and waits for its peers) to the end (engine/sm_share.py); the
        results."""
        if sms is None:
            sms = self._channels(meeting) if self.nccl_sms else 0
        if self.sm_share is None or sms == 0:
            return (yield meeting.done)
        self.sm_share.take(rank, sms)
        results = yield meeting.done
        self.sm_share.give_back(rank, sms)
        return results

    def _channels(self, meeting: _Meeting) -> int:
        """The channels (thread blocks) NCCL launches this collective on, memoised: a ring or
        tree's as NCCL's tuning picks them (engine/collectives/nccl_tuning.py, enqueue.cc); an
        all-to-all, grouped sends and receives, on the communicator's p2p channels
        (src/graph/paths.cc ncclTopoComputeP2pChannels: its channels rounded up to a power of
        two). An in-network all-reduce (NVLS, CollNet, NVLS_TREE) is counted as the ring or
        tree NCCL would run otherwise."""
        key = (meeting.collective, meeting.group, meeting.nbytes)
        if meeting.collective in DEEPEP:  # the kernels' own SM budget, not NCCL channels
            return NUM_SMS
        if key not in self._sm_counts:
            collective = ALL_REDUCE if meeting.collective == ALL_TO_ALL else meeting.collective
            choice = nccl_choice(collective, self.network.graph, list(meeting.group),
                                 max(meeting.nbytes, 1), self.network.calibration)
            self._sm_counts[key] = (p2p_channels(choice.max_channels)
                                    if meeting.collective == ALL_TO_ALL else choice.nchannels)
        return self._sm_counts[key]

    def _join(self, collective, group, rank, buffer, nbytes, tag, elem_bytes,
              name: str = "") -> _Meeting:
        """Register `rank`'s arrival at its next call on communicator `name` of `group`; start
        the ring if it is last."""
        expected = self._expected(group, rank, buffer)
        sequence = self._calls.get((group, rank, name), 0)
        self._calls[(group, rank, name)] = sequence + 1
        key = (group, name, sequence)
        if key not in self._meetings:
            self._meetings[key] = _Meeting(collective, group, nbytes, tag, expected,
                                           self.env.event(), elem_bytes, name=name)
        meeting = self._meetings[key]
        if (meeting.collective, meeting.nbytes, meeting.tag) != (collective, nbytes, tag):
            raise SimulationError(f"rank {rank} called {collective} {tag!r} ({nbytes} B) on "
                                  f"{group} where others called {meeting.collective} "
                                  f"{meeting.tag!r} ({meeting.nbytes} B)")
        meeting.buffers[rank] = buffer
        if len(meeting.buffers) == len(expected):
            del self._meetings[key]
            self.env.process(self._execute(meeting))
        return meeting

    def _expected(self, group: tuple[int, ...], rank: int, buffer) -> frozenset[int]:
        """The members whose arrival the rendezvous waits for, checking `rank` may call."""
        if rank not in group:
            raise SimulationError(f"rank {rank} is not a member of group {group}")
        if self.present is None:
            return frozenset(group)
        if rank not in self.present:
            raise SimulationError(f"rank {rank} is not present but called a collective")
        expected = frozenset(group) & self.present
        if isinstance(buffer, tuple):  # all-to-all: (row of bytes, chunks)
            buffer = buffer[1]
        if buffer is not None and len(expected) < len(group):
            raise SimulationError("absent ranks have no data: the present-rank shortcut is "
                                  "meta only")
        return expected

    def _execute(self, meeting: _Meeting):
        """Run the ring (or time it as a whole), record stats and spans, hand out results."""
        buffers = [meeting.buffers.get(rank) for rank in meeting.group]
        if meeting.collective in DEEPEP:
            results = yield from self._deepep(meeting, buffers)
            meeting.done.succeed(results)
            return
        if meeting.collective == ALL_TO_ALL:
            results = yield from self._all_to_all(meeting, buffers)
            meeting.done.succeed(results)
            return
        method = self.timing_of(meeting.group)
        nvls = self._nvls(meeting)
        ring_steps = method in STEPPED and nvls is None and not self._runs_as_tree(meeting)
        segment = self._segment(meeting) if ring_steps and method == NODE_PIECE else None
        piece = self.pieces.get(meeting.group) if ring_steps and all(
            b is None for b in buffers) else None
        if segment is not None or piece is not None:
            stats = yield from self._segment_ring(meeting, segment, piece)
            results = [None] * len(buffers)
        elif ring_steps:
            ring = RING_COLLECTIVES[meeting.collective]
            results, stats = yield from ring(self.env, self.network, list(meeting.group),
                                             buffers, meeting.nbytes, meeting.elem_bytes,
                                             meeting.tag or meeting.collective)
        else:
            stats = yield from self._as_a_whole(meeting, method, nvls)
            results = _direct_results(meeting.collective, buffers, meeting.nbytes,
                                      meeting.elem_bytes)
        self.stats.append(stats)
        for rank in sorted(meeting.expected):
            self.trace.add_span(rank, "comm", meeting.tag or meeting.collective, stats.start_s,
                                stats.end_s, {"collective": meeting.collective,
                                              "nbytes": meeting.nbytes, "group": meeting.group})
        meeting.done.succeed(results)

    def _as_a_whole(self, meeting: _Meeting, method: str, nvls: CollectiveStats | None = None):
        """An NVLS or tree all-reduce, or a ring timed alone or in closed form (`method`):
        wait its time alone on its links, without flows."""
        start_s = self.env.now
        alone = nvls or (self._tree(meeting) if self._runs_as_tree(meeting)
                         else self._alone(meeting, method))
        yield self.env.timeout(alone.time_s)
        return replace(alone, start_s=start_s, end_s=self.env.now, channels=())

    def _all_to_all(self, meeting: _Meeting, buffers: list):
        """Every member's row of bytes at once over the links; each member's received chunks.
        An absent member (meta, present-rank shortcut) sends as the first present one does,
        its row turned by their distance: j gets what the present member sends j − (i − p)."""
        present = next(i for i, b in enumerate(buffers) if b is not None)
        n, row = len(buffers), buffers[present][0]
        # under the quotient by rail symmetry (network.link_reps) an absent member's pairs are
        # images of a present one's: only the present send, unless timed alone (TEMPLATE)
        alone = self.timing_of(meeting.group) == TEMPLATE
        matrix = [b[0] if b is not None else [0] * n if self.network.link_reps and not alone
                  else [row[(j - i + present) % n] for j in range(n)]
                  for i, b in enumerate(buffers)]
        chunks = None if buffers[present][1] is None else [c for _row, c in buffers]
        if alone:
            start_s = self.env.now
            yield self.env.timeout(self._all_to_all_alone(meeting.group, matrix))
            received = [[None if chunks is None or chunks[i][j] is None
                         else chunks[i][j].copy() for i in range(n)] for j in range(n)]
            end_s = self.env.now
        elif chunks is None and meeting.group in self.pair_orbits:  # meta, rail-symmetric
            orbits, index = self.pair_orbits[meeting.group], meeting.group.index
            stats = yield from orbit_all_to_all(self.env, self.network, orbits, {
                (a, b): matrix[index(a)][index(b)] for a, b, _images in orbits})
            received, start_s, end_s = [[None] * n for _ in buffers], stats.start_s, stats.end_s
        else:
            received, stats = yield from all_to_all(self.env, self.network,
                                                    list(meeting.group), matrix, chunks,
                                                    meeting.tag or ALL_TO_ALL)
            start_s, end_s = stats.start_s, stats.end_s
        for rank in sorted(meeting.expected):
            self.trace.add_span(rank, "comm", meeting.tag or ALL_TO_ALL, start_s, end_s,
                                {"collective": ALL_TO_ALL, "group": meeting.group})
        return received

    def _deepep(self, meeting: _Meeting, buffers: list):
        """DeepEP's two hops over the links (TEMPLATE: waits their time alone, memoised per
        placement and plan); each member's received chunks."""
        plan = self._deepep_plan(meeting, buffers)
        start_s, combine = self.env.now, meeting.collective == DEEPEP[1]
        if self.timing_of(meeting.group) == TEMPLATE:
            key = (DEEPEP[combine], self._placement(meeting.group), plan.key())
            if key not in self._alike:
                self._alike[key] = two_hop_alone_time(
                    self.network.graph, self.network.calibration, list(meeting.group), plan,
                    combine)
            yield self.env.timeout(self._alike[key])
        else:
            yield from two_hop(self.env, self.network, list(meeting.group), plan, meeting.tag,
                               combine)
        for rank in sorted(meeting.expected):
            self.trace.add_span(rank, "comm", meeting.tag, start_s, self.env.now,
                                {"collective": meeting.collective, "group": meeting.group,
                                 **plan.link_bytes()})
        n = len(buffers)
        chunks = [None if b is None else b[1] for b in buffers]  # chunks[i][j]: i's to j
        return [[None if chunks[i] is None or chunks[i][j] is None else chunks[i][j].copy()
                 for i in range(n)] for j in range(n)]

    def _deepep_plan(self, meeting: _Meeting, buffers: list):
        """The two-hop plan of the members' routes, memoised per group, token bytes and routes.
        An absent member (meta, present-rank shortcut) routes as the first present one, its
        columns turned by their distance, as in _all_to_all."""
        present = next(i for i, b in enumerate(buffers) if b is not None)
        key = (DEEPEP, meeting.group, meeting.nbytes,
               tuple((i, routes_key(b[0])) for i, b in enumerate(buffers) if b is not None))
        if key not in self._plans:
            routes = [b[0] if b is not None else np.roll(buffers[present][0], i - present,
                                                         axis=1)
                      for i, b in enumerate(buffers)]  # each (T_i, n) bool
            group, per_node = meeting.group, self.network.graph.graph["gpus_per_node"]
            self._plans[key] = two_hop_plan(routes, [g // per_node for g in group],
                                            [g % per_node for g in group], meeting.nbytes)
        return self._plans[key]

    def _nvls(self, meeting: _Meeting) -> CollectiveStats | None:
        """NCCL's in-network collective where it runs one and it beats the ring or tree: an
        NVLS all-reduce inside one NVLink domain (engine/collectives/nvls.py); across nodes an
        NVLS_TREE all-reduce (NCCL_NVLS_ENABLE's default) and, under --use-sharp on the DP-CP
        groups, CollNet or NVLS all-reduces and NVLS or CollNet Direct reduce-scatters and
        all-gathers (engine/collectives/collnet.py); closed form, loading no link, as the tree;
        memoised; else None."""
        calibration = self.network.calibration
        sharp = calibration.sharp_collnet and (self.sharp_groups is None or (
            meeting.name == "" and meeting.group in self.sharp_groups))
        if meeting.collective not in (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER) or not (
                calibration.nvls_nvlink_generation or sharp) or (
                meeting.collective != ALL_REDUCE and not sharp):
            return None
        key = (NVLS, meeting.collective, meeting.group, meeting.nbytes, meeting.elem_bytes,
               sharp)
        if key not in self._plans:
            self._plans[key] = self._in_network(meeting, sharp)
        return self._plans[key]

    def _in_network(self, meeting: _Meeting, sharp: bool) -> CollectiveStats | None:
        """The stats of NVLS, CollNet or NVLS_TREE for this collective, or None (NCCL keeps
        its ring or tree); CollNet and multi-node NVLS only where its communicator has CollNet
        (`sharp`)."""
        graph, n, calibration = self.network.graph, len(meeting.group), self.network.calibration
        collective = meeting.collective
        other = nccl_choice(collective, graph, list(meeting.group), meeting.nbytes,
                            calibration)  # NCCL's estimate of its ring or tree
        per_node, (nvlink, ib) = graph.graph["gpus_per_node"], link_speeds_GBps(graph)
        seconds = None if collective != ALL_REDUCE else nvls_in_group(
            meeting.group, meeting.nbytes, per_node, nvlink, calibration,
            other.estimated_time_s * 1e6)
        algorithm, sent = NVLS, round(nvls_bytes_per_direction(meeting.nbytes, n))
        if seconds is None:
            calibration = replace(calibration, sharp_collnet=sharp)
            across = sharp_in_group(meeting.group, meeting.nbytes, per_node, nvlink, ib,
                                    calibration, other.estimated_time_s * 1e6, collective)
            if across is None:
                return None
            algorithm, seconds, sent = across
        return CollectiveStats(collective, meeting.group, meeting.nbytes, 1, (sent,) * n,
                               (sent,) * n, 0.0, seconds, (), algorithm, "Simple", 0)

    def _placement(self, group: tuple) -> tuple:
        graph = self.network.graph.graph
        return placement(group, graph["gpus_per_node"], graph["nodes"], graph.get("fabric"))

    def _all_to_all_alone(self, group: tuple, matrix: list) -> float:
        """Seconds of an all-to-all of `group` alone on its links (TEMPLATE), memoised per
        placement and byte matrix."""
        graph = self.network.graph
        key = (self._placement(group), tuple(map(tuple, matrix)))
        if key not in self._alike:
            self._alike[key], flows = alone_time(graph, self.network.calibration, list(group),
                                                 matrix)
            self.alone_flows += flows
        return self._alike[key]

    def _segment(self, meeting: _Meeting):
        """One node's piece of one channel of this ring where it is that symmetric and meta
        (engine/collectives/ring_alone.py node_segment), with the ring's closed-form stats;
        else None. Both depend only on the collective, group, size and element size, so they
        are worked out once per such key (an FSDP unit's gathers repeat every micro-batch)."""
        if any(b is not None for b in meeting.buffers.values()):
            return None
        key = ("segment", meeting.collective, meeting.group, meeting.nbytes, meeting.elem_bytes)
        if key not in self._plans:
            gpus = list(meeting.group)
            segment = node_segment(self.network.graph, gpus, self.network.calibration,
                                   meeting.collective, meeting.nbytes, meeting.elem_bytes,
                                   slowest_latency=True, one_per_node=True)
            if segment is None:  # its whole ring would load links the pieces stand for
                raise SimulationError(f"{meeting.collective} of {meeting.nbytes} B on a group "
                                      f"run as pieces of its ring does not split evenly")
            self._plans[key] = segment, closed_form_stats(
                meeting.collective, self.network.graph, gpus, meeting.nbytes,
                self.network.calibration, meeting.elem_bytes)
        return self._plans[key]

    def _segment_ring(self, meeting: _Meeting, segment, piece: RingPiece | None = None):
        """A ring whose group meets only its own collectives, run as one node's piece of one
        channel on the shared links: each link of the piece stands for its images in every
        node and channel, which the group's other collectives load alike (the quotient of the
        full simulation by the ring's symmetry, docs/shortcuts.md). Stats as the closed form's
        (`segment`: the node piece and those stats, _segment) with the span it took. Or a ring
        run as its `piece` (collectives/ring_piece.py)."""
        start_s = self.env.now
        if piece is None:
            segment, closed = segment
            run = segment_run(self.env, self.network, meeting.collective, len(meeting.group),
                              segment)
        else:
            closed, plan = self._piece_plan(meeting, piece)
            run = piece_run(self.env, self.network, plan)
        yield self.env.process(run)
        return replace(closed, start_s=start_s, end_s=self.env.now,
                       channels=tuple(replace(c, start_s=start_s, end_s=self.env.now)
                                      for c in closed.channels))

    def _piece_plan(self, meeting: _Meeting, piece: RingPiece) -> tuple:
        """(the ring's closed-form stats, its piece's plan), worked out once per collective,
        group, size and element size."""
        key = ("piece", meeting.collective, meeting.group, meeting.nbytes, meeting.elem_bytes)
        if key not in self._plans:
            gpus = list(meeting.group)
            self._plans[key] = (closed_form_stats(
                meeting.collective, self.network.graph, gpus, meeting.nbytes,
                self.network.calibration, meeting.elem_bytes), piece_plan(
                self.network, meeting.collective, gpus, meeting.nbytes, meeting.elem_bytes,
                piece))
        return self._plans[key]

    def _runs_as_tree(self, meeting: _Meeting) -> bool:
        """NCCL runs this all-reduce as a tree: timed in closed form whatever the group's method
        (ring_timing.tree_time; the stepwise tree is engine/collectives/tree.py, for `simsp ring`)."""
        return meeting.collective == ALL_REDUCE and nccl_choice(
            ALL_REDUCE, self.network.graph, list(meeting.group), meeting.nbytes,
            self.network.calibration).algorithm == TREE

    def _tree(self, meeting: _Meeting) -> CollectiveStats:
        """The tree all-reduce's closed-form time (it loads no link in either timing), the
        ring's bytes and NCCL's labels (tree, its protocol), memoised."""
        key = (TREE, meeting.group, meeting.nbytes, meeting.elem_bytes)
        if key not in self._plans:
            group, n = meeting.group, len(meeting.group)
            counts = chunk_counts(element_count(meeting.nbytes, meeting.elem_bytes), n)
            channels = channel_rings(list(group), self.network.graph.graph["gpus_per_node"])
            sent, received = map(tuple, channel_bytes(ALL_REDUCE, counts, meeting.elem_bytes,
                                                      channels))
            duration = collective_time(ALL_REDUCE, self.network.graph, list(group),
                                       meeting.nbytes, self.network.calibration,
                                       meeting.elem_bytes)
            choice = nccl_choice(ALL_REDUCE, self.network.graph, list(group), meeting.nbytes,
                                 self.network.calibration)
            self._plans[key] = CollectiveStats(ALL_REDUCE, group, meeting.nbytes, 2 * (n - 1),
                                               sent, received, 0.0, duration,
                                               algorithm=TREE, protocol=choice.protocol,
                                               nchannels=choice.nchannels)
        return self._plans[key]

    def _alone(self, meeting: _Meeting, method: str = RING_ALONE) -> CollectiveStats:
        """The ring alone on its links (engine/collectives/ring_alone.py alone_stats; its closed
        form, ring_timing.closed_form_stats, where `method` is CLOSED_FORM: no link carries two
        of its hops, so the two agree), memoised per group and, as a ring runs alike on like
        links, per placement (cluster/topology.py placement): e.g. the DP groups of every
        pipeline stage."""
        key = (meeting.collective, meeting.group, meeting.nbytes, meeting.elem_bytes)
        if key not in self._plans:
            graph = self.network.graph
            alike = (meeting.collective, self._placement(meeting.group), meeting.nbytes,
                     meeting.elem_bytes)
            if alike not in self._alike:
                timing = closed_form_stats if method == CLOSED_FORM else alone_stats
                self._alike[alike] = timing(meeting.collective, graph, list(meeting.group),
                                            meeting.nbytes, self.network.calibration,
                                            meeting.elem_bytes)
            stats = self._alike[alike]
            self._plans[key] = (stats if stats.gpus == meeting.group else
                                replace(stats, gpus=meeting.group, channels=()))
        return self._plans[key]


def _direct_results(collective: str, buffers: list, nbytes: int, elem_bytes: int) -> list:
    """What the ring computes, without the ring: sum, its chunks, or the concatenation."""
    if all(b is None for b in buffers):
        return [None] * len(buffers)
    counts = chunk_counts(nbytes // elem_bytes, len(buffers))
    if collective == ALL_GATHER:
        whole = np.concatenate([np.asarray(b).reshape(-1) for b in buffers])  # (count,)
        return [whole.copy() for _ in buffers]
    total = sum(np.asarray(b) for b in buffers)  # shape of one buffer
    if collective == ALL_REDUCE:
        return [total.copy() for _ in buffers]
    flat = total.reshape(-1)  # (count,)
    return [flat[o:o + c].copy() for o, c in zip(chunk_offsets(counts), counts)]
