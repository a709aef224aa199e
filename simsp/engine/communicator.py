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
The rendezvous lives here; a met collective timed other than hop by hop is
engine/timed_collectives.py, an all-to-all or DeepEP exchange engine/exchanges.py.
"""

import numpy as np
import simpy

from simsp.cluster.topology import placement
from simsp.engine.collectives.deepep import NUM_SMS
from simsp.engine.collectives.nccl_group import nccl_choice
from simsp.engine.collectives.nccl_tuning import p2p_channels
from simsp.engine.collectives.ring import DEFAULT_ELEM_BYTES, RING_COLLECTIVES, CollectiveStats
from simsp.engine.collectives.ring_plan import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from simsp.engine.exchanges import Exchanges
from simsp.engine.group_timing import NODE_PIECE, STEP_BY_STEP, STEPPED, EveryGroup, TimingOf
from simsp.engine.meeting import ALL_TO_ALL, DEEPEP, Meeting
from simsp.engine.network import Network
from simsp.engine.timed_collectives import TimedCollectives, direct_results
from simsp.engine.trace import Trace
from simsp.errors import SimulationError

__all__ = ["Communicator"]


class Communicator(TimedCollectives, Exchanges):
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
        self._meetings: dict[tuple, Meeting] = {}  # (group, communicator name, call number)
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
        self.twins: dict = {}  # rank -> the first placed as it is (FSDP replicas placed unlike)
        # CP leaders' slices (training/context_parallel/shadows.py): a leader joins a
        # collective for its shadows
        self.slices = None

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
        shadows = self.slices.spans(group, rank) if self.slices is not None else ()
        if shadows:  # a CP leader for its shadows too, at the latest slice's arrival
            yield from self.slices.meet()
            for shadow in shadows:
                self._join(collective, group, shadow, None, nbytes, tag,
                           elem_bytes or self.elem_bytes, name)
        meeting = self._join(collective, group, rank, buffer, nbytes, tag,
                             elem_bytes or self.elem_bytes, name)
        results = yield from self._hold_sms(meeting, rank, sms)
        return results[group.index(rank)]

    def _hold_sms(self, meeting: Meeting, rank: int, sms: int | None = None):
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

    def _channels(self, meeting: Meeting) -> int:
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
              name: str = "") -> Meeting:
        """Register `rank`'s arrival at its next call on communicator `name` of `group`; start
        the ring if it is last."""
        expected = self._expected(group, rank, buffer)
        sequence = self._calls.get((group, rank, name), 0)
        self._calls[(group, rank, name)] = sequence + 1
        key = (group, name, sequence)
        if key not in self._meetings:
            self._meetings[key] = Meeting(collective, group, nbytes, tag, expected,
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

    def _execute(self, meeting: Meeting):
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
        ring_steps = method in STEPPED and self.runs_as_rings(meeting)
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
            stats = yield from self._as_a_whole(meeting, method, self._nvls(meeting))
            results = direct_results(meeting.collective, buffers, meeting.nbytes,
                                      meeting.elem_bytes)
        self.stats.append(stats)
        for rank in sorted(meeting.expected):
            self.trace.add_span(rank, "comm", meeting.tag or meeting.collective, stats.start_s,
                                stats.end_s, {"collective": meeting.collective,
                                              "nbytes": meeting.nbytes, "group": meeting.group})
        meeting.done.succeed(results)

    def _placement(self, group: tuple) -> tuple:
        graph = self.network.graph.graph
        return placement(group, graph["gpus_per_node"], graph["nodes"], graph.get("fabric"))
