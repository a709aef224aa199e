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
The units' shards and the hooks' entry live here; the gathers in fsdp_gathers.py, the
reductions in fsdp_reductions.py, one collective of a unit in fsdp_comm.py.
"""

import math

import numpy as np

from simsp.engine.streams import Stream
from simsp.engine.trace import Trace
from simsp.model.sharding import local_shape, shard
from simsp.model.tensor import FP16, Tensor
from simsp.training.data_parallel.fsdp_comm import UnitStats
from simsp.training.data_parallel.fsdp_gathers import ParamGathers
from simsp.training.data_parallel.fsdp_reductions import GradReductions
from simsp.training.data_parallel.fsdp_units import ROOT, WORD, sharding_of, stage_units
from simsp.training.data_parallel.bucket_params import module_params
from simsp.training.data_parallel.optimizer import AdamState, allocate_optimizer


class FsdpUnits(ParamGathers, GradReductions):
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
        self.gathers: dict = {}  # unit name -> Pending all-gather (its buffer: the copy)
        self.reduces: list = []  # (unit name, Pending) in launch order
        self.unsharded: dict = {}  # unit name -> the unsharded gradient being written
        self.stats = {u.name: UnitStats() for u in self.units}
        self.weights, self.grads = {}, {}
        self.shards, self.grad_shards = {}, {}  # unit name -> Tensor (d, or view) of its shard
        self._allocate(r, canonical)
        self.optimizer = self._allocate_optimizer(r)

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

    def quiet(self, mb: int) -> bool:
        """Layers may be replayed back to back only when no hook acts between them."""
        return not (self.s.shard_params or self.s.shard_grads or mb == self.last_micro_batch)

    def start_param_gather(self, r) -> None:
        """Nothing is gathered before the first forward asks."""

    def unit_report(self) -> dict:
        """Per unit: FSDP communication seconds and the share the compute waited for."""
        return {name: stats.as_dict() for name, stats in self.stats.items()}
