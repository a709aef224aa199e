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

import simpy

from simsp.model.tensor import Tensor


@dataclass
class Delivery:
    """What a completed transfer hands both sides: payload and when its data moved."""

    payload: object
    start_s: float
    end_s: float


class Mailbox:
    """Posted sends and receives keyed by (kind, micro_batch, virtual_stage, tp, dp)."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self._sends: dict[tuple, tuple] = {}  # key -> (network, src, dst, nbytes, payload, event)
        self._recvs: dict[tuple, simpy.Event] = {}
        self.arrivals: dict[tuple, dict] = {}  # pipeline-group collective -> {rank: arrival_s}

    def post_send(self, key: tuple, network, src: int, dst: int, nbytes: int, payload):
        """Post a send; its event succeeds with a Delivery once the data has crossed."""
        event = self.env.event()
        self._sends[key] = (network, src, dst, nbytes, payload, event)
        self._start_if_matched(key)
        return event

    def post_recv(self, key: tuple) -> simpy.Event:
        """Post a receive; its event succeeds with the sender's Delivery."""
        event = self._recvs[key] = self.env.event()
        self._start_if_matched(key)
        return event

    def _start_if_matched(self, key: tuple) -> None:
        if key not in self._sends or key not in self._recvs:
            return
        network, src, dst, nbytes, payload, sent = self._sends.pop(key)
        received = self._recvs.pop(key)
        start = self.env.now
        done = network.transfer(src, dst, nbytes, label=f"p2p {key[:3]}")

        def complete(_event):
            delivery = Delivery(payload, start, self.env.now)
            sent.succeed(delivery)
            received.succeed(delivery)

        done.callbacks.append(complete)


@dataclass
class SendOp:
    """Send `nbytes` of `tensor` (its `payload` in numeric mode) to `dst`; free it once sent."""

    key: tuple
    dst: int
    tensor: Tensor
    nbytes: int
    payload: object


@dataclass
class RecvOp:
    """Receive `key` into `buffer`, a tensor of this rank's ledger allocated when posted."""

    key: tuple
    buffer: Tensor


@dataclass
class Handle:
    """A posted call: its events and, per receive, the buffer it fills."""

    name: str
    posted_s: float
    events: list = field(default_factory=list)
    recvs: list = field(default_factory=list)  # (RecvOp, event)


def post(r, mailbox: Mailbox, network, name: str, sends: list, recvs: list) -> Handle:
    """Post every send and receive of one call at once (batch_isend_irecv)."""
    handle = Handle(name, r.env.now)
    for op in sends:
        event = mailbox.post_send(op.key, network, r.rank, op.dst, op.nbytes, op.payload)
        event.callbacks.append(lambda _e, t=op.tensor: r.free(t))  # deallocate once sent
        handle.events.append(event)
    for op in recvs:
        event = mailbox.post_recv(op.key)
        handle.events.append(event)
        handle.recvs.append((op, event))
    return handle


def wait(r, handle: Handle) -> dict:
    """Block until the call completed; count transfer vs wait; return {key: received tensor}."""
    start = r.env.now
    if handle.events:
        yield simpy.AllOf(r.env, handle.events)
    moving = _union_length([(max(e.value.start_s, start), e.value.end_s) for e in handle.events])
    r.count_exposed("pp_transfer", moving)
    r.count_exposed("pp_wait", r.env.now - start - moving)
    if r.trace is not None and handle.events:
        r.trace.add_span(r.rank, "pp_comm", handle.name, handle.posted_s, r.env.now,
                         {"blocked_s": r.env.now - start, "transfer_s": moving})
    received = {}
    for op, event in handle.recvs:
        if r.numeric:
            op.buffer.data = event.value.payload.reshape(op.buffer.shape)
        received[op.key] = op.buffer
    return received


def _union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the (start, end) intervals (empty ones ignored)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total
