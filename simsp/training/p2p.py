"""Point-to-point activation and gradient transfers between pipeline stages over the topology.

A send starts the transfer and returns at once (Megatron's isend); the sender frees its output
when the transfer completes (K22 App. B: output-tensor deallocation). A receive blocks until the
data has arrived, then holds it in a buffer of the receiving rank's ledger.
"""

import simpy

from simsp.model.tensor import Tensor


class Mailbox:
    """Deliveries keyed by (kind, micro_batch, virtual_stage), one simpy event each."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self._slots: dict[tuple, simpy.Event] = {}

    def slot(self, key: tuple) -> simpy.Event:
        if key not in self._slots:
            self._slots[key] = self.env.event()
        return self._slots[key]

    def take(self, key: tuple) -> simpy.Event:
        return self._slots.pop(key) if key in self._slots else self.slot(key)


def send(r, network, mailbox: Mailbox, dst_rank: int, tensor: Tensor, key: tuple, free=True):
    """Start sending `tensor` to `dst_rank`; free it on delivery (if `free`)."""
    start = r.env.now
    done = network.transfer(r.rank, dst_rank, tensor.nbytes, label=f"p2p {key}")
    data = tensor.data

    def deliver(_event):
        mailbox.slot(key).succeed((data, start))
        if free:
            r.free(tensor)
        if r.trace is not None:
            r.trace.add_span(r.rank, "pp_comm", f"send {key[0]} mb{key[1]}", start, r.env.now,
                             {"bytes": tensor.nbytes, "to": dst_rank})

    done.callbacks.append(deliver)


def recv(r, mailbox: Mailbox, key: tuple, shape: tuple, itemsize: int, name: str):
    """Wait for `key`'s delivery and return it as a new tensor in this rank's ledger."""
    start = r.env.now
    data, _sent = yield mailbox.take(key)
    r.count_exposed("pp_wait", r.env.now - start)
    if r.trace is not None and r.env.now > start:
        r.trace.add_span(r.rank, "pp_comm", f"recv {key[0]} mb{key[1]}", start, r.env.now, {})
    return r.alloc(shape, itemsize, name, category="communication", data=data)
