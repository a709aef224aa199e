"""FSDP units and what each sharding strategy keeps per element: pure layout, no simulation.

A unit is one transformer layer's parameters (Megatron-FSDP's fsdp_unit_modules, PyTorch FSDP2's
fully_shard per TransformerBlock) flattened into one buffer padded to a multiple of the DP size
d; DP rank i owns elements [i·n/d, (i+1)·n/d). The parameters outside the layers (the word
embedding, then the rest of the root: position table, final norm, untied output layer) form
root units, gathered once per iteration. Strategies (docs/fsdp.md; Megatron-LM
megatron/core/distributed/fsdp/src/README.md, ZeRO arXiv:1910.02054; PyTorch
torch/distributed/fsdp/_fully_shard/_fsdp_param.py):

| strategy | parameters | main gradients | optimizer | per-unit transients |
|---|---|---|---|---|
| no_shard | 2 B, full | 4 B, full | 12 B, full | - |
| optim (ZeRO-1) | 2 B, full | 4 B, full | 12 B / d | - |
| optim_grads (ZeRO-2) | 2 B, full | 4 B / d | 12 B / d | unsharded 4 B gradient |
| optim_grads_params (ZeRO-3) | 2 B / d | 4 B / d | 12 B / d | gathered 2 B copy, 4 B gradient |
| fsdp2 | 4 B / d (fp32, is the master) | 4 B / d | 8 B / d (m, v) | gathered 2 B copy, 2 B gradient, 4 B reduce-scatter input |
"""

from dataclasses import dataclass

from simsp.model.sharding import needs_sp_grad_sync
from simsp.model.tensor import FP16, FP32
from simsp.scenario.precision import precision_of

WORD, ROOT = "embedding.word", "root"
GATHERED_BYTES = FP16  # every strategy computes with a bf16 copy of the unit (param_dtype)


@dataclass(frozen=True)
class Unit:
    """One flat parameter buffer: canonical names in flat order and their TP-local sizes."""

    name: str  # "layers.3", "embedding.word" or "root"
    params: tuple[str, ...]
    numels: tuple[int, ...]  # TP-local elements of each parameter
    padded: int  # sum of numels rounded up to a multiple of d

    @property
    def layer(self) -> int | None:
        return int(self.name.split(".")[1]) if self.name.startswith("layers.") else None

    @property
    def numel(self) -> int:
        return sum(self.numels)

    def shard(self, d: int) -> int:
        """Elements of one DP rank's shard."""
        return self.padded // d

    def offsets(self) -> tuple[int, ...]:
        """Each parameter's first element in the flat buffer."""
        return tuple(sum(self.numels[:k]) for k in range(len(self.numels)))


def unit_name(param: str) -> str:
    """The unit a canonical parameter belongs to."""
    if param.startswith("layers."):
        return param[:param.index(".", 7)]
    return WORD if param == WORD else ROOT


def stage_units(local_numels: dict, d: int) -> list[Unit]:
    """This rank's units from {canonical name: TP-local elements} (canonical order): layers in
    order, then the word embedding and the root."""
    grouped = {}
    for name, numel in local_numels.items():
        grouped.setdefault(unit_name(name), []).append((name, numel))
    order = sorted(grouped, key=lambda u: (u in (WORD, ROOT), u == ROOT,
                                           int(u.split(".")[1]) if u.startswith("layers.")
                                           else 0))
    units = []
    for name in order:
        params = grouped[name]
        total = sum(n for _, n in params)
        units.append(Unit(name, tuple(p for p, _ in params), tuple(n for _, n in params),
                          -(-total // d) * d))
    return units


@dataclass(frozen=True)
class Sharding:
    """What a strategy keeps, per element of a unit, and what it moves."""

    strategy: str
    shard_params: bool
    shard_grads: bool
    shard_optim: bool
    param_bytes: int  # the persistent parameter (bf16; fp32 under FSDP2)
    grad_bytes: int  # the persistent main gradient
    unsharded_grad_bytes: int  # the gradient a unit's backward produces (sharded strategies)
    reduce_bytes: int  # element size of the gradient reduction
    state_bytes: tuple  # ((optimizer state, bytes), ...)

    @property
    def reduce_input_bytes(self) -> int:
        """A separate reduce-scatter input buffer (FSDP2 casts bf16 gradients to fp32)."""
        return self.reduce_bytes if self.reduce_bytes != self.unsharded_grad_bytes else 0

    @property
    def per_step_reduce(self) -> bool:
        """Gradients reduce-scattered after every micro-batch (no unsharded buffer to
        accumulate in) rather than once, in the last micro-batch."""
        return self.shard_grads


def sharding_of(sc) -> Sharding:
    """The strategy of a scenario (parallel.fsdp) with its element sizes (simsp/scenario/precision.py)."""
    p = sc.parallel
    precision = precision_of(sc)
    if p.fsdp == "fsdp2":  # MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)
        return Sharding("fsdp2", True, True, True, FP32, FP32, FP16, FP32,
                        (("adam_m", FP32), ("adam_v", FP32)))
    level = ("no_shard", "optim", "optim_grads", "optim_grads_params").index(p.fsdp)
    main = precision.main_grad_bytes
    reduce = FP32 if p.accumulate_allreduce_grads_in_fp32 else FP16
    states = tuple((s, precision.state(s)) for s in ("master", "adam_m", "adam_v"))
    return Sharding(p.fsdp, level >= 3, level >= 2, level >= 1, FP16, main, main, reduce,
                    states)


def fsdp_bytes_per_element(s: Sharding, d: int) -> float:
    """Persistent bytes per parameter of a unit with no padding: parameters, main gradients and
    optimizer state, each over d where the strategy shards it (docs/fsdp.md)."""
    states = sum(b for _, b in s.state_bytes)
    return (s.param_bytes / (d if s.shard_params else 1)
            + s.grad_bytes / (d if s.shard_grads else 1)
            + states / (d if s.shard_optim else 1))


def sp_partial_ranges(unit, start: int, stop: int) -> list[tuple[int, int]]:
    """The [lo, hi) runs of `unit`'s flat window [start, stop) that hold SP-partial parameters
    (norms, row-parallel biases: model/sharding.py needs_sp_grad_sync), in order; empty runs
    left out."""
    runs = [(max(o, start), min(o + n, stop))
            for name, o, n in zip(unit.params, unit.offsets(), unit.numels)
            if needs_sp_grad_sync(name)]
    return [(lo, hi) for lo, hi in runs if hi > lo]
