"""FSDP's gradient reductions: each unit's reduce-scatter (all-reduce under no_shard) when its
backward ends, accumulated into the rank's shard, then Megatron's finalize on the full gradients or
the shards; the full gradients rebuilt from every DP rank's shards (numeric mode)."""

import math

import numpy as np

from simsp.model import mappings
from simsp.model.tensor import Tensor
from simsp.training.data_parallel.finalize import (sync_sequence_parallel_grads,
                                                   tied_embedding_reduce)
from simsp.training.data_parallel.fsdp_comm import UnitCollectives
from simsp.training.data_parallel.fsdp_units import WORD, sp_partial_ranges


class GradReductions(UnitCollectives):
    """The post-backward hook, the reductions it launches and the finalize that waits for them."""

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
