"""Each rank's memory (peaks, composition, out-of-memory verdict) and the layout's memory verdict
with the non-tensor memory and, on request, the caching allocator's replay."""

from simsp.engine.allocator.ledger_stream import replay_ledger
from simsp.hardware.constants import GPUS
from simsp.memory_verdict import chosen_reserve, memory_verdict
from simsp.metrics.timing import stage_ranks
from simsp.training.non_tensor_memory import non_tensor_items


def oom_report(oom) -> dict | None:
    """An out-of-memory verdict as JSON: who asked for what, and the largest live tensors."""
    if oom is None:
        return None
    return {"rank": oom.rank, "op": oom.op, "tensor": oom.key, "time_s": oom.time_s,
            "bytes_asked": oom.bytes_asked, "bytes_in_use": oom.bytes_in_use,
            "capacity_bytes": oom.capacity_bytes,
            "largest_live": [{"name": t.key, "category": t.category, "bytes": t.nbytes}
                             for t in oom.largest_live]}


def _shadowed(run) -> frozenset:
    """The CP ranks that ran as their leader's shadows (their ledger its)."""
    shadows = run.inputs.world.shadows
    return frozenset() if shadows is None else shadows.shadowed()


def ledger_of(run, rank: int):
    """The ledger of `rank`, or of the simulated rank identical to it when it was not simulated."""
    inputs, ranks = run.inputs, run.inputs.world.ranks
    if rank in ranks and rank not in inputs.replayed and rank not in _shadowed(run):
        return ranks[rank].ledger  # not a replayed rank, whose ledger is partial
    if rank in _shadowed(run):  # a shadow's rows are its CP leader's
        return ranks[inputs.world.shadows.leader_of[rank]].ledger
    coords = inputs.world.grid.coords(rank)
    source = inputs.rank_of(0, 0, coords.pp, coords.cp)  # an identical representative
    if source in _shadowed(run):  # its replica 0's rank a shadow: that one's leader's
        source = inputs.world.shadows.leader_of[source]
    if inputs.sc.model.num_experts is not None:
        from simsp.model.blocks.moe.placement import represented_by  # MoE only
        if represented_by(inputs.sc, rank) in ranks:
            source = represented_by(inputs.sc, rank)  # its place in a simulated expert group
    return ranks[source].ledger


def rank_memory(run, rank: int, name_live: bool = True) -> dict:
    """One rank's memory: peak, peaks by category, composition at the peak, OOM verdict
    (`name_live=False`: the verdict's largest live tensors left out, its bytes the same)."""
    inputs = run.inputs
    c = inputs.world.grid.coords(rank)
    simulated = (rank in inputs.world.ranks and rank not in inputs.replayed
                 and rank not in _shadowed(run))  # its own row
    ledger = ledger_of(run, rank)
    summary = ledger.summary(name_live)
    peaks = summary.peak_by_category
    return {"rank": rank, "tp": c.tp, "pp": c.pp, "dp": c.dp,
            "peak_bytes": summary.peak_total,
            "activation_peak_bytes": peaks["activations"],
            "weights_bytes": peaks["weights"], "gradients_bytes": peaks["gradients"],
            "optimizer_bytes": peaks["optimizer"],
            "oom": summary.oom is not None, "oom_detail": oom_report(summary.oom),
            "simulated": simulated,
            "at_peak_bytes": summary.at_peak, "peak_by_category_bytes": peaks,
            "final_bytes": ledger.final_bytes(),
            **({"cp": c.cp} if inputs.sc.parallel.cp > 1 else {})}


def memory_report(run, metrics: dict, override_bytes: float | None,
                  allocator: bool = False) -> dict:
    """The memory verdict of the layout (simsp/memory_verdict.py, as search, sweep and whatif
    give it), judged with `override_bytes` (--memory-reserve) or else the itemised non-tensor
    memory (`non_tensor`, each item's bytes and source: docs/non_tensor_memory.md) and, with
    `allocator` (run --caching-allocator), per stage's rank its ledger replayed through
    PyTorch's caching allocator: reserved and allocated peaks and the fragmentation at the
    allocated peak (docs/allocator.md), the largest of which is then the fragmentation item."""
    capacity = GPUS[run.inputs.sc.cluster.gpu].memory_bytes
    peak = max(r["peak_bytes"] for r in metrics["ranks"])
    stages = [_allocator_stage(run, stage, rank)
              for stage, rank in enumerate(stage_ranks(run))] if allocator else []
    modelled = max((s["fragmentation_at_peak_bytes"] for s in stages), default=None)
    items = non_tensor_items(run.inputs.sc, modelled)
    reserve = chosen_reserve(override_bytes, sum(item.bytes for item in items))
    verdict = memory_verdict(capacity, peak, metrics["oom"], reserve)
    for stage in stages:
        stage["headroom_bytes"] = capacity - reserve - stage["peak_bytes"]
    return {"capacity_bytes": capacity, "memory_reserve_bytes": reserve,
            "peak_bytes_max": peak, "headroom_bytes": verdict.headroom_bytes,
            "fits": verdict.fits,
            "non_tensor": {item.name: {"bytes": item.bytes, "source": item.source}
                           for item in items},
            "stages": stages}


def _allocator_stage(run, stage: int, rank: int) -> dict:
    """One stage's rank through the caching allocator (its headroom: memory_report)."""
    ledger = ledger_of(run, rank)
    timeline = replay_ledger(ledger).timeline
    peak = ledger.summary().peak_total
    oom = timeline.oom
    return {"stage": stage, "rank": rank, "capacity_bytes": ledger.capacity_bytes,
            "peak_bytes": peak, "allocated_peak_bytes": timeline.allocated_peak,
            "reserved_peak_bytes": timeline.reserved_peak,
            "fragmentation_at_peak_bytes": timeline.fragmentation_at_peak,
            "headroom_bytes": None,
            "allocator_oom": None if oom is None else {
                "bytes_asked": oom.nbytes, "reserved_bytes": oom.reserved,
                "allocated_bytes": oom.allocated}}
