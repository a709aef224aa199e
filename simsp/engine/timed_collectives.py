"""The communicator's ring-family collectives timed other than hop by hop: in-network (NVLS,
CollNet, NVLS_TREE), as a tree, alone or in closed form, as one node's piece or a ring piece.

Mixed into engine/communicator.py Communicator, whose __init__ holds the state used here
(env, network, sharp_groups, the memos _plans, _alike) and _placement.
"""

from dataclasses import replace

import numpy as np

from simsp.engine.collectives.collnet import sharp_in_group
from simsp.engine.collectives.nccl_group import link_speeds_GBps, nccl_choice
from simsp.engine.collectives.nccl_tuning import TREE
from simsp.engine.collectives.nvls import NVLS, nvls_bytes_per_direction, nvls_in_group
from simsp.engine.collectives.ring import CollectiveStats, element_count
from simsp.engine.collectives.ring_alone import alone_stats, node_segment, segment_run
from simsp.engine.collectives.ring_piece import RingPiece, piece_plan, piece_run
from simsp.engine.collectives.ring_plan import (ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, channel_bytes,
                                    channel_rings, chunk_counts, chunk_offsets)
from simsp.engine.collectives.ring_timing import closed_form_stats, collective_time
from simsp.engine.group_timing import CLOSED_FORM, RING_ALONE
from simsp.engine.meeting import Meeting
from simsp.errors import SimulationError


class TimedCollectives:
    """A met all-reduce, reduce-scatter or all-gather timed as a whole or run as a piece."""

    def _as_a_whole(self, meeting: Meeting, method: str, nvls: CollectiveStats | None = None):
        """An NVLS or tree all-reduce, or a ring timed alone or in closed form (`method`):
        wait its time alone on its links, without flows."""
        start_s = self.env.now
        alone = nvls or (self._tree(meeting) if self._runs_as_tree(meeting)
                         else self._alone(meeting, method))
        yield self.env.timeout(alone.time_s)
        return replace(alone, start_s=start_s, end_s=self.env.now, channels=())

    def _nvls(self, meeting: Meeting) -> CollectiveStats | None:
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

    def _in_network(self, meeting: Meeting, sharp: bool) -> CollectiveStats | None:
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

    def _segment(self, meeting: Meeting):
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
                                   slowest_latency=True, one_per_node=True,
                                   twins=self.twins, present=self.present)
            if segment is None:  # its whole ring would load links the pieces stand for
                raise SimulationError(f"{meeting.collective} of {meeting.nbytes} B on a group "
                                      f"run as pieces of its ring does not split evenly")
            self._plans[key] = segment, closed_form_stats(
                meeting.collective, self.network.graph, gpus, meeting.nbytes,
                self.network.calibration, meeting.elem_bytes)
        return self._plans[key]

    def _segment_ring(self, meeting: Meeting, segment, piece: RingPiece | None = None):
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

    def _piece_plan(self, meeting: Meeting, piece: RingPiece) -> tuple:
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

    def runs_as_rings(self, meeting: Meeting) -> bool:
        """NCCL runs this collective as rings, neither in-network nor as a tree: only then do
        its steps run as flows and leave transfer records (shortcuts/record_counts.py asks)."""
        return self._nvls(meeting) is None and not self._runs_as_tree(meeting)

    def _runs_as_tree(self, meeting: Meeting) -> bool:
        """NCCL runs this all-reduce as a tree: timed in closed form whatever the group's method
        (ring_timing.tree_time; the stepwise tree is engine/collectives/tree.py, for `simsp ring`)."""
        return meeting.collective == ALL_REDUCE and nccl_choice(
            ALL_REDUCE, self.network.graph, list(meeting.group), meeting.nbytes,
            self.network.calibration).algorithm == TREE

    def _tree(self, meeting: Meeting) -> CollectiveStats:
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

    def _alone(self, meeting: Meeting, method: str = RING_ALONE) -> CollectiveStats:
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


def direct_results(collective: str, buffers: list, nbytes: int, elem_bytes: int) -> list:
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
