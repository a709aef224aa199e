"""Tensor/sequence-parallel region boundaries, as Megatron-LM's mappings.py, over ring collectives.

K22 §4.2.2 names them: f (forward identity, backward all-reduce), f̄ (forward all-reduce, backward
identity), g (forward all-gather, backward reduce-scatter), ḡ (forward reduce-scatter, backward
all-gather). Entering a TP block is f (no SP) or g (SP); leaving it is f̄ or ḡ.
Gathers and scatters act on the sequence axis (axis 0 of an (s, b, h) tensor), so a flat
s-major buffer splits into whole sequence chunks.
"""

import math

from simsp.model.tensor import Tensor


def _bytes_sent(kind: str, n: int, full_bytes: int) -> int:
    """Bytes one rank sends in a ring collective of `full_bytes` (docs/MODEL.md#collectives)."""
    steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    return steps * full_bytes // n


def tensor_collective(r, kind: str, x: Tensor, full_shape: tuple, out_shape: tuple, tag: str,
                      label: str | None = None, group: tuple | None = None, track: str = "tp_comm",
                      blocking: bool = True, sms: int | None = None):
    """Run one ring collective over `group` (default: this rank's TP group); returns the output.

    Bytes sent are counted under `label` (default: the collective's kind); a blocking call's
    whole duration is exposed communication (an async one's is counted by `finish`); `sms`:
    the SMs its kernel holds (a userbuffers kernel's; default NCCL's channels)."""
    group = group or r.tp.members
    n = len(group)
    full_bytes = x.itemsize * math.prod(full_shape)
    r.count_comm(label or kind, _bytes_sent(kind, n, full_bytes))
    buffer = None if x.data is None else x.data.reshape(-1)  # (numel,)
    call = _timed(r, getattr(r.tp.comm, kind)(group, r.rank, buffer, full_bytes, tag,
                                              elem_bytes=x.itemsize, sms=sms),
                  (track, blocking), f"{kind} {tag}", full_bytes)
    if blocking and r.ep_streams is not None and group is r.tp.members:
        # a DualPipe F&B pair: on the communication stream beside the other micro-batch
        result = yield from r.ep_streams.on_comm(r, call, track, tp=True)
    else:
        result = yield from call
    if kind == "all_reduce":
        if r.numeric:
            x.data = result.reshape(x.shape)
        return x
    out = r.alloc(out_shape, x.itemsize, tag, category="communication")
    if r.numeric:
        out.data = result.reshape(out_shape)
    return out


def _timed(r, call, track: tuple, name: str, nbytes: int):
    """`call` (a collective) with its span on the trace's track (`track`: (name, blocking)) and,
    if blocking, its duration counted exposed there (an async call's is counted by `finish`)."""
    (track, blocking), start = track, r.env.now
    result = yield from call
    if blocking:
        r.count_exposed(track, r.env.now - start)
    if r.trace is not None and track not in r.trace.skip:  # else no args to build
        r.trace.add_span(r.rank, track, name, start, r.env.now,
                         {"phase": r.phase, "bytes": nbytes})
    return result


def all_reduce(r, x: Tensor, tag: str, label: str | None = None, blocking: bool = True):
    """Sum x over the TP group in place (ring: reduce-scatter then all-gather)."""
    if r.tp.size == 1:
        return x
    return (yield from tensor_collective(r, "all_reduce", x, x.shape, x.shape, tag, label,
                                         blocking=blocking))


def all_gather_seq(r, x: Tensor, tag: str, label: str | None = None, blocking: bool = True,
                   sms: int | None = None):
    """(s/t, ...) shards -> the full (s, ...) tensor, as a new tensor."""
    if r.tp.size == 1:
        return x
    full = (x.shape[0] * r.tp.size,) + x.shape[1:]
    return (yield from tensor_collective(r, "all_gather", x, full, full, tag, label,
                                         blocking=blocking, sms=sms))


def reduce_scatter_seq(r, x: Tensor, tag: str, blocking: bool = True, sms: int | None = None):
    """(s, ...) partial sums -> this rank's (s/t, ...) chunk of the sum, as a new tensor."""
    if r.tp.size == 1:
        return x
    part = (x.shape[0] // r.tp.size,) + x.shape[1:]
    return (yield from tensor_collective(r, "reduce_scatter", x, x.shape, part, tag,
                                         blocking=blocking, sms=sms))


def start(r, generator, name: str = "collective"):
    """Launch a collective on the rank's communication stream; `yield from finish(...)` waits."""
    return r.comm_stream.launch(name, generator)


def finish(r, process, track: str = "tp_comm"):
    """Wait for a collective started with `start`; the wait is exposed communication."""
    start_s = r.env.now
    result = yield process
    r.count_exposed(track, r.env.now - start_s)
    return result


# Megatron's conjugate pairs. Entering: f / g.  Leaving: f̄ / ḡ.
def enter_forward(r, x: Tensor, tag: str):
    """f forward is the identity; g forward all-gathers the sequence (SP)."""
    if r.tp.sequence_parallel:
        return (yield from all_gather_seq(r, x, tag))
    return x


def enter_backward(r, dx: Tensor, tag: str, blocking: bool = True, sms: int | None = None):
    """f backward all-reduces; g backward reduce-scatters the sequence (SP); `sms` as in
    `tensor_collective`."""
    if r.tp.sequence_parallel:
        return (yield from reduce_scatter_seq(r, dx, tag, blocking=blocking, sms=sms))
    return (yield from all_reduce(r, dx, tag, blocking=blocking))


def exit_forward(r, y: Tensor, tag: str):
    """f̄ forward all-reduces; ḡ forward reduce-scatters the sequence (SP)."""
    if r.tp.sequence_parallel:
        return (yield from reduce_scatter_seq(r, y, tag))
    return (yield from all_reduce(r, y, tag))


def exit_backward(r, dy: Tensor, tag: str):
    """f̄ backward is the identity; ḡ backward all-gathers the sequence (SP)."""
    if r.tp.sequence_parallel:
        return (yield from all_gather_seq(r, dy, tag))
    return dy
