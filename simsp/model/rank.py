"""One emulated rank as the model code sees it: allocate/free/save tensors, run timed kernels.

The model code is a simpy process per rank and is the device's compute stream: its kernels run
one at a time in program order. Every op allocates its outputs in the rank's ledger, computes
(numeric mode), and takes the cost model's time. Collectives that may overlap compute are
launched on the device's communication stream (engine/streams.py), in issue order.
"""

from dataclasses import dataclass, field

import numpy as np

from simsp.hardware.costmodel import kernel_time
from simsp.engine.memory import AlreadyLive, Ledger
from simsp.model.blocks.attention.core import ContextParallelAttention
from simsp.model.fp8 import FP8_SAVED_INPUTS, save_quantized
from simsp.model.tensor import Tensor
from simsp.scenario.precision import DEFAULT as DEFAULT_PRECISION

PHASES = ("forward", "backward", "recompute")


@dataclass
class TPGroup:
    """This rank's tensor-parallel group: members in ring order, its index, SP on or off."""

    members: tuple[int, ...]
    index: int
    sequence_parallel: bool
    comm: object = None  # simsp.engine.communicator.Communicator, None when t == 1
    overlap: dict | None = None  # TE GEMM name -> scenario/tp_overlap.py UbGemm, when on

    @property
    def size(self) -> int:
        return len(self.members)


@dataclass
class Rank:
    """Everything one rank's program touches: its ledger, its clock, its counters."""

    rank: int
    env: object  # simpy.Environment
    ledger: Ledger
    tp: TPGroup
    mode: str = "numeric"
    dtype: np.dtype = np.float64
    seed: int = 0
    trace: object = None
    scope: str = ""
    phase: str = "forward"
    flops: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0))
    comm_bytes: dict = field(default_factory=dict)  # (phase, kind) -> bytes sent by this rank
    busy_s: dict = field(default_factory=dict)  # kernel kind -> seconds on the compute stream
    exposed_s: dict = field(default_factory=dict)  # track -> seconds blocked on communication
    # (TE method, "comm" | "exposed") -> seconds of TP communication it overlapped / left exposed
    tp_overlap_s: dict = field(default_factory=dict)
    comm_stream: object = None  # simsp.engine.streams.Stream for asynchronous collectives
    moe_aux_loss: float = 0.0  # Σ aux_scale · aux loss of its MoE layers' forwards (numeric)
    moe: object = None  # blocks/moe/placement.py ExpertRank of a MoE model, else None
    moe_load: dict = field(default_factory=dict)  # forward MoE rows: expert_rows, dropped_pairs...
    compute_cal: object = None  # the GPU's ComputeCalibration; None: costmodel's active one
    precision: object = DEFAULT_PRECISION  # simsp.scenario.precision.Precision: state dtypes, FP8
    fp8: object = None  # simsp.scenario.precision.Fp8 when the linear layers run in FP8
    cp: ContextParallelAttention | None = None  # the rank's CP attention (context parallelism)
    attention: object = None  # hardware/attention_kernels.py AttentionRates of its fused core
    wgrad: object = None  # base/wgrad_store.py WeightGradStore during a split backward's B
    sm_share: object = None  # engine/sm_share.py SmShare where SM contention is modelled
    ep_streams: object = None  # blocks/moe/comm_stream.py PairedStreams (combined 1F1B), or None
    graphs: object = None  # model/cuda_graphs.py CudaGraphs under --cuda-graph-impl, else None
    kernel_log: list | None = None  # (name, phase, kind, flops, bytes, seconds) per kernel, if set
    numeric: bool = field(init=False)  # mode == "numeric" (read per op: an attribute)
    # (kind, flops, bytes, gemm shape) -> kernel_time's seconds: a rank runs the same kernels
    # every layer and micro-batch, and the cost model is a pure function of them and the
    # calibration, which stays the same through a simulation
    _kernel_s: dict = field(init=False, default_factory=dict)

    def __post_init__(self):
        self.numeric = self.mode == "numeric"

    def key(self, name: str) -> str:
        return f"{self.scope}{name}"

    def sequence_rows(self, rows: int):
        """Global sequence positions of the `rows` rows this rank holds (its SP slice of its CP
        share): the first position (an int) without context parallelism, else the positions
        (rows,) of its CP attention's chunks (not contiguous)."""
        start = self.tp.index * rows if self.tp.sequence_parallel else 0
        if self.cp is None:
            return start
        return self.cp.positions[start:start + rows]  # (rows,)

    def alloc(self, shape, itemsize: int, name: str, category: str = "temporaries",
              data: np.ndarray | None = None) -> Tensor:
        """A new tensor in this rank's ledger (data only in numeric mode)."""
        if self.numeric:
            tensor = Tensor(shape, itemsize, data)
        else:  # shape only: no data to check against it
            tensor = Tensor.meta(tuple(map(int, shape)), itemsize, None)
        key, nbytes, now = self.scope + name, tensor.nbytes, self.env.now
        try:
            self.ledger.alloc(key, nbytes, category, name, now)
        except AlreadyLive:  # the name is taken in this scope: the next free "#n"
            key = self._unique_key(key)
            self.ledger.alloc(key, nbytes, category, name, now)
        tensor.key = key
        return tensor

    def _unique_key(self, key: str) -> str:
        if not self.ledger.holds(key):
            return key
        n = 1
        while self.ledger.holds(f"{key}#{n}"):
            n += 1
        return f"{key}#{n}"

    def free(self, *tensors: Tensor) -> None:
        """Release tensors from the ledger (None entries are skipped)."""
        for tensor in tensors:
            if tensor is not None and tensor.key is not None:
                self.ledger.free(tensor.key, f"free {tensor.key}", self.env.now)
                tensor.key = None

    def save(self, tensor: Tensor, name: str) -> Tensor:
        """Keep a tensor for backward: it moves to the activations category under `name`
        (a linear input in FP8 under FP8 training: simsp/model/fp8.py)."""
        if self.fp8 is not None and name in FP8_SAVED_INPUTS:
            return save_quantized(self, tensor, name)
        target = self.key(name)
        if tensor.key != target:
            target = self._unique_key(target)
        tensor.key = self.ledger.retag(tensor.key, "activations", target)
        return tensor

    def compute(self, name: str, kind: str, flops: int = 0, nbytes: int = 0,
                gemm: tuple[int, int, int] | None = None):
        """Hold the compute stream for one kernel's modelled time; count its GEMM FLOPs."""
        if kind == "gemm":
            self.flops[self.phase] += flops
        duration = self._kernel_s.get((kind, flops, nbytes, gemm))
        if duration is None:
            duration = self._kernel_s[kind, flops, nbytes, gemm] = kernel_time(
                kind, flops, nbytes, gemm, self.compute_cal)
        if self.graphs is not None:
            duration = self.graphs.kernel(duration)
        self._log(name, kind, flops, nbytes, duration)
        self.busy_s[kind] = self.busy_s.get(kind, 0.0) + duration
        yield from self._occupy(name, kind, duration)

    def hold(self, name: str, kind: str, flops: int, duration: float):
        """Hold the compute stream for a kernel timed by the caller (FP8 GEMMs)."""
        if kind == "gemm":
            self.flops[self.phase] += flops
        if self.graphs is not None:
            duration = self.graphs.kernel(duration)
        self._log(name, kind, flops, 0, duration)
        self.busy_s[kind] = self.busy_s.get(kind, 0.0) + duration
        yield from self._occupy(name, kind, duration)

    def _occupy(self, name: str, kind: str, duration: float):
        """Hold the compute stream for `duration` seconds at full rate, longer while
        communication kernels hold SMs where SM contention is modelled (engine/sm_share.py);
        one compute span (its `slowed_s`: the seconds contention added)."""
        start = self.env.now
        if self.sm_share is None:
            yield self.env.timeout(duration)
        else:
            yield from self.sm_share.run(self.rank, duration)
        if self.trace is not None and "compute" not in self.trace.skip:  # else no args to build
            args = {"phase": self.phase, "kind": kind}
            slowed = self.env.now - start - duration
            if self.sm_share is not None and slowed > 0:
                args["slowed_s"] = slowed
            self.trace.add_span(self.rank, "compute", name, start, self.env.now, args)

    def _log(self, name: str, kind: str, flops: int, nbytes: int, seconds: float) -> None:
        """One kernel into kernel_log, when a caller asked for it (`simsp layer --ops`)."""
        if self.kernel_log is not None:
            self.kernel_log.append((name, self.phase, kind, flops, nbytes, seconds))

    def count_exposed(self, track: str, seconds: float) -> None:
        """Time the program waited on communication that no compute hid."""
        if seconds > 0:
            self.exposed_s[track] = self.exposed_s.get(track, 0.0) + seconds

    def count_comm(self, kind: str, nbytes: int) -> None:
        key = (self.phase, kind)
        self.comm_bytes[key] = self.comm_bytes.get(key, 0) + nbytes
