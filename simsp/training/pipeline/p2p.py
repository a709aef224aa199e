"""Point-to-point activation and gradient transfers between pipeline stages, as Megatron's
`_communicate` does them (megatron/core/pipeline_parallel/p2p_communication.py).

A call posts its sends and receives together (`batch_isend_irecv`). A transfer starts once both
its send and its matching receive are posted (NCCL p2p is a rendezvous) and crosses the network;
the call completes when every one of its sends and receives has, and the stage waits for it
(or, with `--overlap-p2p-communication`, before its next compute that needs that direction).
Blocked time is split into transfer (some of the call's data is moving) and wait (the peer has
not posted yet: pipeline fill, bubble, drain). A sender frees a tensor once it is sent (K22
App. B, output-tensor deallocation); a receive buffer is allocated when posted.
"""

from dataclasses import dataclass, field
from functools import partial
from operator import attrgetter

import numpy as np
import simpy

from simsp.model.tensor import Tensor


class Mailbox:
    """Posted sends and receives keyed by (kind, micro_batch, virtual_stage, tp, dp).

    Both sides of a transfer wait on one event, made by whichever posts first; it succeeds
    with (start_s, end_s) once the data has crossed (engine/network.py)."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self._posted: dict[tuple, list] = {}  # key -> [event, send (network, src, dst, nbytes)
        #                                        or None, receive posted]
        self.payloads: dict[tuple, object] = {}  # key -> data on its way (numeric mode)
        # CP leaders' slices (training/context_parallel/shadows.py), else None; then
        # key -> (c,) each slice's clock at the first post
        self.slices, self._posted_at = None, {}

    def post_send(self, key: tuple, network, src: int, dst: int, nbytes: int, payload):
        """Post a send; its event succeeds once the data has crossed."""
        if payload is not None:
            self.payloads[key] = payload
        entry = self._posted.get(key)
        if entry is None:  # the receive is not posted yet
            event = self.env.event()
            self._posted[key] = [event, (network, src, dst, nbytes), False]
            if self.slices is not None:
                self._posted_at[key] = self.slices.clocks.now
            return event
        entry[1] = (network, src, dst, nbytes)
        self._start(key, entry)
        return entry[0]

    def post_recv(self, key: tuple) -> simpy.Event:
        """Post a receive; its event succeeds once the sender's data has arrived."""
        entry = self._posted.get(key)
        if entry is None:  # the send is not posted yet
            event = self.env.event()
            self._posted[key] = [event, None, True]
            if self.slices is not None:
                self._posted_at[key] = self.slices.clocks.now
            return event
        entry[2] = True
        self._start(key, entry)
        return entry[0]

    def _start(self, key: tuple, entry: list) -> None:
        """Both sides posted: the transfer starts now (NCCL p2p is a rendezvous)."""
        del self._posted[key]
        network, src, dst, nbytes = entry[1]
        if self.slices is not None:  # each slice's transfer from its later post, alone
            start = np.maximum(self._posted_at.pop(key), self.slices.clocks.now)  # (c,)
            self.slices.clocks.fix(entry[0], self.slices.delivery(src, dst, nbytes, start))
        network.transfer(src, dst, nbytes, label=_label(key), delivered=entry[0])


def _label(key: tuple) -> str:
    """"p2p " and the key's first three fields as a tuple's repr (ints formatted directly)."""
    if len(key) > 2 and type(key[1]) is int and type(key[2]) is int:
        head = _LABEL_HEADS.get(key[0])
        if head is not None:
            return head % (key[1], key[2])
        return "p2p (%r, %d, %d)" % key[:3]
    return f"p2p {key[:3]}"


_LABEL_HEADS = {kind: "p2p (%r, %%d, %%d)" % kind for kind in ("act", "grad")}  # repr made once


@dataclass(slots=True)
class SendOp:
    """Send `nbytes` of `tensor` (its `payload` in numeric mode) to `dst`; free it once sent."""

    key: tuple
    dst: int
    tensor: Tensor
    nbytes: int
    payload: object


@dataclass(slots=True)
class RecvOp:
    """Receive `key` into `buffer`, a tensor of this rank's ledger allocated when posted."""

    key: tuple
    buffer: Tensor


@dataclass(slots=True)
class Handle:
    """A posted call: its events and, per receive, the buffer it fills."""

    name: str
    posted_s: float
    mailbox: Mailbox
    events: list = field(default_factory=list)
    recvs: list = field(default_factory=list)  # RecvOp


def post(r, mailbox: Mailbox, network, name: str, sends: list, recvs: list) -> Handle:
    """Post every send and receive of one call at once (batch_isend_irecv)."""
    handle = Handle(name, r.env.now, mailbox)
    for op in sends:
        event = mailbox.post_send(op.key, network, r.rank, op.dst, op.nbytes, op.payload)
        event.callbacks.append(partial(_free_sent, r, op.tensor))  # deallocate once sent
        handle.events.append(event)
    for op in recvs:
        handle.events.append(mailbox.post_recv(op.key))
        handle.recvs.append(op)
    return handle


def _free_sent(r, tensor: Tensor, _event: simpy.Event) -> None:
    r.free(tensor)


def wait(r, handle: Handle) -> dict:
    """Block until the call completed; count transfer vs wait; return {key: received tensor}."""
    start = r.env.now
    for event in handle.events:  # resumes when the last one is done, as AllOf would
        # not processed yet (simpy's Event.processed); with slices every one, each slice's
        # clock then the later of its own and the event's (engine/slice_clocks.py)
        if event.callbacks is not None or handle.mailbox.slices is not None:
            yield event
    moving, now = _moving_s(handle.events, start), r.env.now
    r.count_exposed("pp_transfer", moving)
    r.count_exposed("pp_wait", now - start - moving)
    if r.trace is not None and handle.events:
        r.trace.add_span(r.rank, "pp_comm", handle.name, handle.posted_s, now,
                         {"blocked_s": now - start, "transfer_s": moving})
    received = {}
    for op in handle.recvs:
        if r.numeric:
            op.buffer.data = handle.mailbox.payloads.pop(op.key).reshape(op.buffer.shape)
        received[op.key] = op.buffer
    return received


def _moving_s(events: list, start: float) -> float:
    """Seconds since `start` during which some of the events' transfers (start_s, end_s) were
    moving: their union, clipped to begin at `start`."""
    if len(events) == 2:  # a combined call's send and receive: the common case, in closed form
        (a0, a1), (b0, b1) = events[0]._value, events[1]._value
        a0, b0 = (a0 if a0 > start else start), (b0 if b0 > start else start)
        if a1 <= a0 or b1 <= b0:  # an empty one adds nothing
            return max(a1 - a0, b1 - b0, 0.0)
        if (a0, a1) > (b0, b1):  # in start order, as _union_length sorts them
            a0, a1, b0, b1 = b0, b1, a0, a1
        return (a1 - a0) + (b1 - max(b0, a1) if b1 > a1 else 0.0)
    return _union_length([(s if s > start else start, e) for s, e in map(_VALUE, events)])


_VALUE = attrgetter("_value")  # processed events' values (simpy's Event.value, less a call)


def _union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the (start, end) intervals (empty ones ignored)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach and end > start:
            total += end - (start if start > reach else reach)
            reach = end
    return total
