"""FSDP's parameter gathers: a unit's bf16 copy all-gathered before its forward and again before
its backward, the neighbouring unit's gather issued with it (prefetch), freed after (reshard);
after the step, the updated parameters gathered where only the optimizer is sharded."""

import math

import numpy as np

from simsp.training.data_parallel.fsdp_comm import UnitCollectives
from simsp.training.data_parallel.fsdp_units import GATHERED_BYTES


class ParamGathers(UnitCollectives):
    """The pre-forward, post-forward and pre-backward hooks and the gathers after the step."""

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

    def _neighbour(self, unit, step: int):
        """The layer unit `step` layers away in this stage (prefetch), if any."""
        if unit.layer is None:
            return None
        return self.by_name.get(f"layers.{unit.layer + step}")

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
