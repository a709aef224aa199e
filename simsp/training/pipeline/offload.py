"""Activation offload (Megatron-LM --cpu-offloading, --cpu-offloading-num-layers): the saved
activations of a stage's first N layers copied to host memory during the forward and back
before the backward needs them, over the GPU's host link (PCIe; NVLink-C2C on GB200: the GPU
profile's host_link_GBps).

The scheme of Transformer Engine's CPU offload handler, which Megatron-LM's
megatron/core/transformer/transformer_block.py uses (transformer_engine/pytorch/cpu_offload.py,
AsyncDoubleBufferGroupOffloadHandler, one layer per group): when layer k's forward ends its
saved tensors start copying device-to-host on a copy stream, and the GPU copies are freed when
the copy ends; when layer k+1's forward ends the compute waits for layer k's copy. In backward,
when layer k+1's backward starts the host-to-device copy of layer k is issued (its GPU buffers
allocated then), and layer k's backward waits for it. A wait is exposed time ("offload"). Each
copy takes bytes / host link rate (the datasheet rate: no contention with other GPUs' copies on
a shared PCIe switch is modelled; docs/fsdp.md#activation-offload).
"""

from dataclasses import dataclass, field

from simsp.engine.streams import Stream
from simsp.engine.trace import Trace
from simsp.model.tensor import Tensor
from simsp.hardware.profiles import gpu_profile


@dataclass
class OffloadStats:
    """One rank's offload: bytes moved, copy seconds each way, seconds the compute waited, and
    the host memory it held."""

    offloaded_bytes: int = 0
    d2h_s: float = 0.0
    h2d_s: float = 0.0
    exposed_s: float = 0.0
    host_bytes: int = 0
    host_peak_bytes: int = 0
    host_timeline: list = field(default_factory=list)  # (time s, host bytes) at every change

    def as_dict(self) -> dict:
        return {"offloaded_bytes": self.offloaded_bytes, "d2h_s": self.d2h_s,
                "h2d_s": self.h2d_s, "exposed_s": self.exposed_s,
                "host_peak_bytes": self.host_peak_bytes}


class ActivationOffload:
    """One rank's offloaded layers, their copies in flight and what they hold on the host."""

    def __init__(self, r, sc, plan):
        """Rank r offloads the first --cpu-offloading-num-layers layers of its stage's plan."""
        count = sc.parallel.cpu_offloading_num_layers
        self.layers = frozenset(plan.all_layers()[:count])
        self.rate_Bps = gpu_profile(sc.cluster.gpu).host_link_GBps * 1e9
        self.d2h = Stream(r.env, r.rank, "offload", Trace())
        self.h2d = Stream(r.env, r.rank, "offload", Trace())
        self.moved: dict = {}  # (mb, layer) -> [(Tensor, key, category, nbytes, op)]
        self.copies: dict = {}  # (mb, layer, "d2h" | "h2d") -> simpy.Process
        self.stats = OffloadStats()

    def _host(self, r, delta: int) -> None:
        stats = self.stats
        stats.host_bytes += delta
        stats.host_peak_bytes = max(stats.host_peak_bytes, stats.host_bytes)
        stats.host_timeline.append((r.env.now, stats.host_bytes))

    def after_forward(self, r, mb: int, layer: int, saved: dict):
        """Start offloading this layer's saved tensors; wait for the previous layer's copy."""
        if layer in self.layers:
            self._offload(r, mb, layer, saved)
        previous = self.copies.get((mb, layer - 1, "d2h"))
        if previous is not None:
            yield from self._wait(r, previous)

    def _offload(self, r, mb: int, layer: int, saved: dict) -> None:
        tensors = {id(t): t for t in saved.values()
                   if isinstance(t, Tensor) and t.key is not None}.values()
        entries = [(t, r.ledger.live_set.get(t.key)) for t in tensors]
        moved = [(t, e.key, e.category, e.nbytes, e.op) for t, e in entries
                 if e.category == "activations"]
        nbytes = sum(m[3] for m in moved)
        self.moved[(mb, layer)] = moved
        self.stats.offloaded_bytes += nbytes
        self.copies[(mb, layer, "d2h")] = self.d2h.launch(
            f"offload L{layer}", self._copy_out(r, moved, nbytes))

    def _copy_out(self, r, moved: list, nbytes: int):
        """Device to host; the GPU copies are freed when it ends."""
        start = r.env.now
        yield r.env.timeout(nbytes / self.rate_Bps)
        self.stats.d2h_s += r.env.now - start
        for tensor, key, *_ in moved:
            r.ledger.free(key, f"offload {key}", r.env.now)
            tensor.key = None
        self._host(r, nbytes)

    def before_backward(self, r, mb: int, layer: int):
        """Issue the reload of the layer before this one; wait for this layer's own."""
        if layer - 1 in self.layers:
            self._reload(r, mb, layer - 1)
        if layer in self.layers:
            self._reload(r, mb, layer)
            yield from self._wait(r, self.copies[(mb, layer, "h2d")])

    def _reload(self, r, mb: int, layer: int) -> None:
        """Allocate the layer's GPU buffers again and start the host-to-device copy (once)."""
        if (mb, layer, "h2d") in self.copies:
            return
        moved = self.moved.pop((mb, layer))
        for tensor, key, category, nbytes, op in moved:
            r.ledger.alloc(key, nbytes, category, op, r.env.now)
            tensor.key = key
        nbytes = sum(m[3] for m in moved)
        self.copies[(mb, layer, "h2d")] = self.h2d.launch(f"reload L{layer}",
                                                          self._copy_in(r, nbytes))

    def _copy_in(self, r, nbytes: int):
        start = r.env.now
        yield r.env.timeout(nbytes / self.rate_Bps)
        self.stats.h2d_s += r.env.now - start
        self._host(r, -nbytes)

    def _wait(self, r, copy):
        start = r.env.now
        yield copy
        waited = r.env.now - start
        self.stats.exposed_s += waited
        r.count_exposed("offload", waited)
