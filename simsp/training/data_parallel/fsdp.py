"""Sharded data parallelism in the training loop: Megatron-FSDP's strategies and PyTorch FSDP2.

Each transformer layer is a unit (training/data_parallel/fsdp_units.py). Where parameters are sharded
(optim_grads_params, fsdp2) a unit's bf16 copy is all-gathered over DP before its forward, the
next unit's gather issued with it (prefetch), and freed after the forward (reshard after
forward); before its backward it is gathered again (prefetching the unit before it) and freed
after. Where gradients are sharded (optim_grads, optim_grads_params, fsdp2) the backward
writes a fresh unsharded gradient that is reduce-scattered as soon as the unit's backward ends,
every micro-batch, and accumulated into the rank's shard; otherwise (no_shard, optim) the
gradients accumulate in full and each unit is all-reduced (no_shard) or reduce-scattered
(optim) when its backward ends in the last micro-batch. The optimizer steps on the shard.
Sources: Megatron-LM megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py
(pre-forward/pre-backward all-gather with prefetch, post-backward reduce-scatter), PyTorch
torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py (pre_forward unshard, post_forward
reshard, post_backward foreach_reduce). Gathers and reductions run on their own streams
(all_gather_stream, reduce_scatter_stream) as collectives over the links; the compute waits
on a gather only when it has not arrived, and that wait is the unit's exposed time.
Root units (embedding, final norm, output layer) are gathered at their first use and kept
until the schedule ends; their gradients are reduced once, after it (docs/fsdp.md).
"""

from dataclasses import dataclass, field
import math

import numpy as np
import simpy

from simsp.engine.streams import Stream
from simsp.engine.trace import Trace
from simsp.model import mappings
from simsp.model.mappings import _bytes_sent
from simsp.model.sharding import local_shape, shard
from simsp.model.tensor import FP16, Tensor
from simsp.training.data_parallel.fsdp_units import (GATHERED_BYTES, ROOT, WORD, sharding_of,
                                                     sp_partial_ranges, stage_units)
from simsp.training.data_parallel.grad_buckets import module_params
from simsp.training.data_parallel.optimizer import AdamState, allocate_optimizer
from simsp.training.data_parallel.finalize import (sync_sequence_parallel_grads,
                                                   tied_embedding_reduce)


@dataclass
class UnitStats:
    """One unit's FSDP communication on this rank: seconds on the links and seconds the
    compute waited for it (exposed)."""

    gather_s: float = 0.0
    gather_exposed_s: float = 0.0
    reduce_s: float = 0.0
    reduce_exposed_s: float = 0.0
    gathers: int = 0
    reduces: int = 0

    def as_dict(self) -> dict:
        comm = self.gather_s + self.reduce_s
        exposed = self.gather_exposed_s + self.reduce_exposed_s
        return {"all_gather_s": self.gather_s, "all_gather_exposed_s": self.gather_exposed_s,
                "reduce_s": self.reduce_s, "reduce_exposed_s": self.reduce_exposed_s,
                "all_gathers": self.gathers, "reductions": self.reduces,
                "exposed_fraction": exposed / comm if comm else 0.0}


@dataclass
class _Pending:
    """An issued collective of a unit: its process and the buffer it fills or drains."""

    process: simpy.Process
    buffer: Tensor | None = None
    start_s: float = 0.0
    result: list = field(default_factory=list)


class FsdpUnits:
    """One rank's FSDP units: its shards in the ledger, the gathers and reductions in flight,
    and the hooks the training loop calls (the DDPBuckets interface plus two)."""

    def __init__(self, r, sc, grid, plan, shapes: dict, canonical: dict | None):
        """Rank r's units of its stage's parameters `shapes` (canonical: their full values,
        numeric mode), sharded over its DP group on the rank grid."""
        self.sc, self.plan = sc, plan
        self.group = grid.dp_cp_group(r.rank)  # CP ranks shard with DP (Megatron)
        self.d, self.index = len(self.group), self.group.index(r.rank)
        self.s = sharding_of(sc)
        t = r.tp.size
        self.local = {n: local_shape(n, shape, t) for n, shape in shapes.items()}
        self.units = stage_units({n: math.prod(s) for n, s in self.local.items()}, self.d)
        self.by_name = {u.name: u for u in self.units}
        self.last_micro_batch = sc.parallel.num_micro_batches - 1
        self.gather_stream = Stream(r.env, r.rank, "dp_comm", Trace())
        self.reduce_stream = Stream(r.env, r.rank, "dp_comm", Trace())
        self.gathers: dict = {}  # unit name -> _Pending all-gather (its buffer: the copy)
        self.reduces: list = []  # (unit name, _Pending) in launch order
        self.unsharded: dict = {}  # unit name -> the unsharded gradient being written
        self.stats = {u.name: UnitStats() for u in self.units}
        self.weights, self.grads = {}, {}
        self.shards, self.grad_shards = {}, {}  # unit name -> Tensor (d, or view) of its shard
        self._allocate(r, canonical)
        self.optimizer = self._allocate_optimizer(r)

    # ------------------------------------------------------------------ allocation
    def _flat(self, r, unit, canonical) -> np.ndarray | None:
        """The unit's TP-local parameters flattened and zero-padded, (padded,) (numeric)."""
        if canonical is None:
            return None
        parts = [shard(n, canonical[n], r.tp.index, r.tp.size).astype(r.dtype).reshape(-1)
                 for n in unit.params]  # (numel_k,) each
        return np.concatenate(parts + [np.zeros(unit.padded - unit.numel, r.dtype)])

    def _slice(self, unit) -> slice:
        n = unit.shard(self.d)
        return slice(self.index * n, (self.index + 1) * n)

    def _allocate(self, r, canonical) -> None:
        """Persistent parameters and gradients, full or sharded as the strategy says."""
        s, scope, r.scope = self.s, r.scope, ""
        for unit in self.units:
            flat = self._flat(r, unit, canonical if r.numeric else None)  # (padded,)
            n = unit.shard(self.d)
            piece = None if flat is None else flat[self._slice(unit)].copy()  # (n,)
            for name, offset in zip(unit.params, unit.offsets()):
                shape = self.local[name]
                data = None if flat is None else flat[offset:offset + math.prod(shape)] \
                    .reshape(shape).copy()
                self.weights[name] = Tensor(shape, FP16) if s.shard_params else \
                    r.alloc(shape, FP16, f"weight.{name}", "weights", data)
                zeros = np.zeros(shape, r.dtype) if r.numeric else None
                self.grads[name] = Tensor(shape, s.unsharded_grad_bytes) if s.shard_grads \
                    else r.alloc(shape, s.grad_bytes, f"grad.{name}", "gradients", zeros)
            self.shards[unit.name] = r.alloc((n,), s.param_bytes, f"weight_shard.{unit.name}",
                                             "weights", piece) if s.shard_params \
                else Tensor((n,), FP16, piece)
            zeros = np.zeros(n, r.dtype) if r.numeric else None
            self.grad_shards[unit.name] = r.alloc((n,), s.grad_bytes, f"grad_shard.{unit.name}",
                                                  "gradients", zeros) if s.shard_grads \
                else Tensor((n,), s.grad_bytes, zeros)
        r.scope = scope

    def _allocate_optimizer(self, r) -> AdamState:
        """Adam on the shard: fp32 master and moments per unit shard (FSDP2: the fp32 sharded
        parameter is the master); the full optimizer under no_shard."""
        if not self.s.shard_optim:
            return allocate_optimizer(r, self.weights, 1)
        if self.s.strategy != "fsdp2":
            return allocate_optimizer(r, self.shards, 1)
        tensors = {}
        for name, weight in self.shards.items():
            tensors[("master", name)] = weight
            for state, nbytes in self.s.state_bytes:
                zeros = np.zeros(weight.numel, r.dtype) if r.numeric else None
                tensors[(state, name)] = r.alloc((weight.numel,), nbytes, f"{state}.{name}",
                                                 "optimizer", zeros)
        return AdamState(tensors)

    def optimizer_tensors(self) -> tuple[dict, dict]:
        """(weights, gradients) the Adam step walks: the shards, or everything (no_shard)."""
        if not self.s.shard_optim:
            return self.weights, self.grads
        return self.shards, self.grad_shards

    # ------------------------------------------------------------------ collectives
    def _launch(self, r, stream: Stream, kind: str, unit, buffer, nbytes: int,
                elem_bytes: int) -> _Pending:
        """Issue one collective of `unit` on `stream` over the DP group."""
        r.count_comm(f"{kind}_fsdp", _bytes_sent(kind, self.d, nbytes))
        pending = _Pending(None, start_s=r.env.now)
        pending.process = stream.launch(f"{kind} {unit.name}",
                                        self._collective(r, kind, unit, buffer, nbytes,
                                                         elem_bytes, pending))
        return pending

    def _collective(self, r, kind, unit, buffer, nbytes, elem_bytes, pending):
        start = r.env.now
        result = yield from getattr(r.tp.comm, kind)(self.group, r.rank, buffer, nbytes,
                                                     f"fsdp {unit.name}", elem_bytes=elem_bytes)
        stats = self.stats[unit.name]
        if kind == "all_gather":
            stats.gather_s += r.env.now - start
            stats.gathers += 1
        else:
            stats.reduce_s += r.env.now - start
            stats.reduces += 1
        if r.trace is not None:
            r.trace.add_span(r.rank, "dp_comm", f"{kind} fsdp {unit.name}", start, r.env.now,
                             {"bytes": nbytes})
        pending.result.append(result)
        return result

    # ------------------------------------------------------------------ parameter gathers
    def _issue_gather(self, r, unit) -> None:
        """Allocate the unit's bf16 copy and start its all-gather (once until resharded)."""
        if unit is None or unit.name in self.gathers or not self.s.shard_params:
            return
        scope, r.scope = r.scope, ""
        copy = r.alloc((unit.padded,), GATHERED_BYTES, f"fsdp_gathered.{unit.name}", "weights")
        r.scope = scope
        shard_data = self.shards[unit.name].data
        self.gathers[unit.name] = self._launch(r, self.gather_stream, "all_gather", unit,
                                               shard_data, unit.padded * GATHERED_BYTES,
                                               GATHERED_BYTES)
        self.gathers[unit.name].buffer = copy

    def _wait_gather(self, r, unit):
        """Wait for the unit's copy (the wait is its exposed time) and install it (numeric)."""
        pending = self.gathers[unit.name]
        if pending.buffer.data is not None or (not r.numeric and pending.process.processed):
            return
        start = r.env.now
        yield pending.process
        waited = r.env.now - start
        self.stats[unit.name].gather_exposed_s += waited
        r.count_exposed("dp_comm", waited)
        if r.numeric:
            flat = pending.result[0]  # (padded,)
            pending.buffer.data = flat
            for name, offset in zip(unit.params, unit.offsets()):
                shape = self.local[name]
                self.weights[name].data = flat[offset:offset + math.prod(shape)].reshape(shape)

    def _reshard(self, r, unit) -> None:
        """Free the unit's gathered copy (reshard after forward / after backward)."""
        pending = self.gathers.pop(unit.name, None)
        if pending is None:
            return
        r.free(pending.buffer)
        for name in unit.params:
            self.weights[name].data = None

    def _units_of(self, modules) -> list:
        """The units holding these modules (layer indices, "embedding", "head")."""
        names = []
        for module in modules:
            if isinstance(module, int):
                names.append(f"layers.{module}")
            else:
                for param in module_params(self.plan, module, self.grads):
                    names.append(WORD if param == WORD else ROOT)
        return [self.by_name[n] for n in dict.fromkeys(names) if n in self.by_name]

    def _neighbour(self, unit, step: int):
        """The layer unit `step` layers away in this stage (prefetch), if any."""
        if unit.layer is None:
            return None
        return self.by_name.get(f"layers.{unit.layer + step}")

    def params_needed(self, r, chunk: int, modules):
        """Pre-forward: gather these units (prefetching the next layer), wait for them; root
        units stay gathered until the schedule ends."""
        if not self.s.shard_params:
            return ()
        return self._gather_for(r, self._units_of(modules), +1)

    def _gather_for(self, r, units: list, step: int):
        for unit in units:
            self._issue_gather(r, unit)
            self._issue_gather(r, self._neighbour(unit, step))
        for unit in units:
            yield from self._wait_gather(r, unit)

    def after_forward(self, r, layers) -> None:
        """Post-forward: reshard the layers' units."""
        if self.s.shard_params:
            for unit in self._units_of(layers):
                self._reshard(r, unit)

    def before_backward(self, r, chunk: int, layers):
        """Pre-backward: gather the units again (prefetching the layer before), and give each
        a fresh unsharded gradient under sharded gradients."""
        units = self._units_of(layers)
        if self.s.shard_grads:
            for unit in units:
                self._fresh_grad(r, unit)
        if self.s.shard_params:
            yield from self._gather_for(r, units, -1)

    def _fresh_grad(self, r, unit) -> None:
        """The unsharded gradient a unit's backward writes into (zeros in numeric mode)."""
        if unit.name in self.unsharded:
            return
        scope, r.scope = r.scope, ""
        self.unsharded[unit.name] = r.alloc((unit.padded,), self.s.unsharded_grad_bytes,
                                            f"fsdp_unsharded_grad.{unit.name}", "gradients")
        r.scope = scope
        for name in unit.params:
            self.grads[name].data = np.zeros(self.local[name], r.dtype) if r.numeric else None

    # ------------------------------------------------------------------ gradient reduction
    def quiet(self, mb: int) -> bool:
        """Layers may be replayed back to back only when no hook acts between them."""
        return not (self.s.shard_params or self.s.shard_grads or mb == self.last_micro_batch)

    def start_param_gather(self, r) -> None:
        """Nothing is gathered before the first forward asks."""

    def grads_ready(self, r, plan, chunk: int, mb: int, modules) -> tuple:
        """Post-backward: reshard the layers, then reduce their gradients (sharded gradients:
        every micro-batch; else in the last one). Root units reduce once the step's backward
        is through them: after the embedding's, or the head's on a stage without it. Returns
        an empty tuple (the DP buckets' grads_ready is a generator; callers `yield from`)."""
        reducing = self.s.per_step_reduce or mb == self.last_micro_batch
        for unit in self._units_of(modules):
            if unit.layer is None:
                continue
            if self.s.shard_params:
                self._reshard(r, unit)
            if reducing:
                self._reduce(r, unit)
        root_done = "embedding" in modules or ("head" in modules and not plan.holds_embedding)
        if reducing and root_done:
            for unit in self.units:
                if unit.layer is None:
                    self._reduce(r, unit)
        return ()

    def _reduce(self, r, unit) -> None:
        """Launch the unit's gradient reduction: reduce-scatter (all-reduce under no_shard)."""
        kind = "reduce_scatter" if self.s.shard_optim else "all_reduce"
        flat = None
        if r.numeric:
            parts = [self.grads[n].data.reshape(-1) for n in unit.params]  # (numel_k,) each
            flat = np.concatenate(parts + [np.zeros(unit.padded - unit.numel, r.dtype)])
        buffer = self.unsharded.pop(unit.name, None)
        extra = None
        if buffer is not None and self.s.reduce_input_bytes:
            scope, r.scope = r.scope, ""
            extra = r.alloc((unit.padded,), self.s.reduce_input_bytes,
                            f"fsdp_reduce_input.{unit.name}", "communication")
            r.scope = scope
            r.free(buffer)
            buffer = None
        pending = self._launch(r, self.reduce_stream, kind, unit, flat,
                               unit.padded * self.s.reduce_bytes, self.s.reduce_bytes)
        pending.process.callbacks.append(
            lambda event: self._reduced(r, unit, event.value, buffer, extra))
        self.reduces.append((unit.name, pending))
        if self.s.shard_grads:
            for name in unit.params:
                self.grads[name].data = None

    def _reduced(self, r, unit, result, *buffers) -> None:
        """A reduction finished: accumulate the shard, free the unsharded buffers."""
        r.free(*buffers)
        if result is None:
            return
        if self.s.strategy == "no_shard":
            for name, offset in zip(unit.params, unit.offsets()):
                shape = self.local[name]
                self.grads[name].data = result[offset:offset + math.prod(shape)].reshape(shape)
            return
        target = self.grad_shards[unit.name]
        target.data = target.data + result
        if not self.s.shard_grads:  # optim: the reduced shard in its slot of the full buffer
            self._write_back(unit, target.data)

    def _write_back(self, unit, piece: np.ndarray) -> None:
        """Put a reduced shard (n,) into the full gradients (ZeRO-1's buffer slot)."""
        flat = np.concatenate([self.grads[n].data.reshape(-1) for n in unit.params]
                              + [np.zeros(unit.padded - unit.numel)])  # (padded,)
        flat[self._slice(unit)] = piece
        for name, offset in zip(unit.params, unit.offsets()):
            shape = self.local[name]
            self.grads[name].data = flat[offset:offset + math.prod(shape)].reshape(shape)

    def finish(self, r):
        """Reduce the root units, then wait for every reduction; each wait is its unit's
        exposed reduction time."""
        for name, pending in self.reduces:
            start = r.env.now
            yield pending.process
            self.stats[name].reduce_exposed_s += r.env.now - start
            r.count_exposed("dp_comm", r.env.now - start)
        self.reduces.clear()

    def finalize(self, r, world, plan):
        """Megatron's finalize_model_grads under FSDP: reshard the root, wait for every
        reduction, then the SP sums over TP and the tied embedding's sum between the first and
        last stages, on the full gradients or on the shards (a sum over DP commutes with both;
        the word embedding is a unit of its own, laid out alike on both stages)."""
        self.end_of_schedule(r)
        yield from self.finish(r)
        if not self.s.shard_grads:
            yield from sync_sequence_parallel_grads(r, self.grads)
            yield from tied_embedding_reduce(r, world, plan, self.grads)
            if r.numeric and self.s.shard_optim:  # optim: Adam reads its slot of the buffer
                for unit in self.units:
                    self.grad_shards[unit.name].data = self.reduced_shard(unit)
            return
        yield from self._sync_sp_shards(r)
        if WORD in self.grad_shards:
            yield from tied_embedding_reduce(r, world, plan, {WORD: self.grad_shards[WORD]})

    def _sync_sp_shards(self, r):
        """All-reduce over TP the slices of each layer shard that hold SP-partial gradients
        (every TP rank's unit has the same layout, so the slices line up)."""
        if not r.tp.sequence_parallel:
            return
        for unit in self.units:
            picks = self._sp_indices(unit)  # (k,)
            if not len(picks):
                continue
            target = self.grad_shards[unit.name]
            part = Tensor((len(picks),), self.s.grad_bytes,
                          None if target.data is None else target.data[picks])
            yield from mappings.all_reduce(r, part, f"sp_grad fsdp {unit.name}",
                                           label="all_reduce_sp_grads")
            if target.data is not None:
                target.data = target.data.copy()
                target.data[picks] = part.data

    def _sp_indices(self, unit) -> np.ndarray:
        """Positions in this rank's shard of the unit's SP-partial parameters, (k,)."""
        window = self._slice(unit)
        picks = [np.arange(lo, hi) - window.start
                 for lo, hi in sp_partial_ranges(unit, window.start, window.stop)]
        return np.concatenate(picks) if picks else np.zeros(0, dtype=int)

    # ------------------------------------------------------------------ after the step
    def gather_params(self, r):
        """optim, optim_grads: all-gather every unit's updated bf16 parameters after the step
        (sharded parameters are gathered by the next forward instead)."""
        if self.d == 1 or not self.s.shard_optim or self.s.shard_params:
            return
        start = r.env.now
        for unit in self.units:
            flat = yield self._launch(r, self.gather_stream, "all_gather", unit,
                                      self.shards[unit.name].data,
                                      unit.padded * GATHERED_BYTES, GATHERED_BYTES).process
            if flat is not None:  # the updated parameters in place (numeric), (padded,)
                for name, offset in zip(unit.params, unit.offsets()):
                    shape = self.local[name]
                    self.weights[name].data = flat[offset:offset + math.prod(shape)] \
                        .reshape(shape).copy()
        r.count_exposed("dp_comm", r.env.now - start)

    def end_of_schedule(self, r) -> None:
        """Reshard the root units once the schedule is done."""
        for unit in self.units:
            if unit.layer is None:
                self._reshard(r, unit)

    def unit_report(self) -> dict:
        """Per unit: FSDP communication seconds and the share the compute waited for."""
        return {name: stats.as_dict() for name, stats in self.stats.items()}

    def reduced_shard(self, unit) -> np.ndarray:
        """This rank's slice of the unit's reduced gradient, (n,) (numeric mode)."""
        if self.s.shard_grads:
            return self.grad_shards[unit.name].data
        flat = np.concatenate([self.grads[n].data.reshape(-1) for n in unit.params]
                              + [np.zeros(unit.padded - unit.numel)])  # (padded,)
        return flat[self._slice(unit)]


def full_grads(per_dp: list) -> dict:
    """TP-local gradients of one stage rebuilt from the reduced shards of every DP rank of a
    group, `per_dp` its FsdpUnits in DP-group order (numeric mode)."""
    grads, first = {}, per_dp[0]
    for unit in first.units:
        flat = np.concatenate([f.reduced_shard(unit) for f in per_dp])  # (padded,)
        for name, offset in zip(unit.params, unit.offsets()):
            shape = first.local[name]
            grads[name] = flat[offset:offset + math.prod(shape)].reshape(shape)
    return grads
