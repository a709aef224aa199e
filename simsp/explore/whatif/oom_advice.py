"""Why an iteration ran out of memory, and which switches bring it under capacity.

The explanation is measured, never guessed: the bytes by category come from the failing rank's
ledger at the moment of the first allocation that did not fit, and each candidate switch (turn on
SP, selective or full recompute, the distributed optimizer, a smaller micro-batch, more pipeline
stages, Megatron-FSDP or FSDP2, activation offload) is a real simulate_iteration of the modified
scenario in meta mode, whose worst stage peak is compared with the capacity. With the caching
allocator (`run --caching-allocator`, docs/allocator.md) a stage whose allocator runs out of
memory fails too, a switch fits only if every stage's replay succeeds, and the allocator setting
`expandable_segments:True` is one more switch: the same ledgers replayed with it.
"""

from operator import itemgetter

import numpy as np

from simsp.scenario.config import Scenario
from simsp.scenario.loading import with_overrides
from simsp.engine.allocator.ledger_stream import replay_ledger
from simsp.engine.memory import CATEGORIES
from simsp.errors import UserError
from simsp.metrics.memory import ledger_of
from simsp.metrics.timing import iteration_time, stage_ranks
from simsp.training.driver.iteration import Shortcuts, simulate_iteration


def category_states(events: list) -> np.ndarray:
    """Bytes per category after each ledger event, events in time order (stable, ties in
    recording order, as engine/memory/summary.py's summarize reads them): (n, 7) int64."""
    ordered = sorted(events, key=itemgetter(0))
    code = {c: i for i, c in enumerate(CATEGORIES)}
    deltas = np.zeros((len(ordered), len(CATEGORIES)), dtype=np.int64)  # (n, 7)
    deltas[np.arange(len(ordered)), [code[e.category] for e in ordered]] = [
        e.delta_bytes for e in ordered]
    return np.cumsum(deltas, axis=0)


def bytes_at_failure(ledger) -> dict | None:
    """{category: bytes in use} just before the first allocation that did not fit, largest
    first; None if every allocation fits."""
    state = category_states(ledger.events)  # (n, 7)
    over = np.flatnonzero(state.sum(axis=1) > ledger.capacity_bytes)
    if len(over) == 0:
        return None
    before = state[over[0] - 1] if over[0] > 0 else np.zeros(len(CATEGORIES), np.int64)  # (7,)
    in_use = {c: int(b) for c, b in zip(CATEGORIES, before.tolist())}
    return dict(sorted(in_use.items(), key=lambda kv: (-kv[1], kv[0])))


def failing_stages(run) -> list[dict]:
    """Each out-of-memory stage: rank, bytes by category at the failure, capacity."""
    out = []
    for stage, rank in enumerate(stage_ranks(run)):
        ledger = run.inputs.world.ranks[rank].ledger
        in_use = bytes_at_failure(ledger) if ledger.oom is not None else None
        if in_use is not None:
            out.append({"stage": stage, "rank": rank, "in_use_by_category_bytes": in_use,
                        "capacity_bytes": ledger.capacity_bytes})
    return out


def _more_stages(sc: Scenario) -> dict | None:
    """Parallel overrides doubling p (and the GPUs, or halving d), or None if the layers don't tile."""
    p, layers = sc.parallel, sc.model.num_layers
    if layers % (2 * p.pp) or p.pipeline_model_parallel_layout is not None:  # a layout names p
        return None
    change = {"pipeline_model_parallel_size": 2 * p.pp}
    virtual = p.num_layers_per_virtual_pipeline_stage
    if virtual:  # keep interleaving with the largest chunk that tiles the new stages
        per_stage = layers // (2 * p.pp)
        change["num_layers_per_virtual_pipeline_stage"] = max(
            v for v in range(1, min(virtual, per_stage) + 1) if per_stage % v == 0)
    if p.dp % 2 == 0:
        change["data_parallel_size"] = p.dp // 2
    return change


def _activation_switches(p) -> list[tuple[str, str, dict]]:
    """SP and recompute (K22 §4-5): the switches that shrink the stored activations."""
    out = []
    sp = not p.sequence_parallel and p.tp > 1
    if sp:
        out.append(("sequence parallelism", "--sequence-parallel",
                    {"parallel": {"sequence_parallel": True}}))
    if p.recompute_granularity == "none":
        out.append(("selective recompute", "--recompute-granularity selective",
                    {"parallel": {"recompute_granularity": "selective"}}))
        if sp:
            out.append(("sequence parallelism + selective recompute (K22)",
                        "--sequence-parallel --recompute-granularity selective",
                        {"parallel": {"sequence_parallel": True,
                                      "recompute_granularity": "selective"}}))
    if p.recompute_granularity != "full":
        out.append(("full recompute", "--recompute-granularity full",
                    {"parallel": {"recompute_granularity": "full"}}))
    if p.recompute_granularity == "selective" and p.recompute_modules is not None:
        every = "core_attn mlp layernorm"
        if set(p.recompute_modules.split()) != set(every.split()):
            out.append(("every recompute module", f"--recompute-modules {every}",
                        {"parallel": {"recompute_modules": every}}))
    return out


def _stage_switch(sc: Scenario) -> list[tuple[str, str, dict]]:
    """Twice the pipeline stages (fewer layers and optimizer state per GPU), if they tile."""
    stages = _more_stages(sc)
    if not stages:
        return []
    gpus = sc.parallel.world_size * (1 if "data_parallel_size" in stages else 2)
    nodes = max(-(-gpus // sc.cluster.gpus_per_node), sc.cluster.nodes)
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in stages.items())
    flags += f" --nodes {nodes}" if nodes != sc.cluster.nodes else ""
    return [(f"{stages['pipeline_model_parallel_size']} pipeline stages", flags,
             {"parallel": stages, "cluster": {"nodes": nodes}})]


def _fsdp_switches(sc: Scenario) -> list[tuple[str, str, dict]]:
    """Megatron-FSDP sharding parameters, gradients and optimizer state (ZeRO-3) and PyTorch
    FSDP2 (docs/fsdp.md), where data parallelism has replicas to shard over, FSDP is off and
    the model is one FSDP takes (scenario/checks/fsdp.py: no MoE, FP8 or MTP)."""
    p, m = sc.parallel, sc.model
    if p.fsdp is not None or p.dp == 1 or m.num_experts is not None \
            or p.fp8_format is not None or m.mtp_num_layers is not None:
        return []
    return [("Megatron-FSDP (ZeRO-3)",
             "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params",
             {"parallel": {"use_megatron_fsdp": True,
                           "data_parallel_sharding_strategy": "optim_grads_params"}}),
            ("PyTorch FSDP2", "--use-torch-fsdp2", {"parallel": {"use_torch_fsdp2": True}})]


def _offload_switch(sc: Scenario) -> list[tuple[str, str, dict]]:
    """Activation offload of every layer but the last (Megatron's limit: fewer than
    num_layers, without pipeline parallelism or recompute; scenario/checks/fsdp.py)."""
    p, layers = sc.parallel, sc.model.num_layers
    if p.cpu_offloading or p.pp > 1 or p.recompute_granularity != "none" or layers < 2:
        return []
    return [(f"activation offload ({layers - 1} layers)",
             f"--cpu-offloading --cpu-offloading-num-layers {layers - 1}",
             {"parallel": {"cpu_offloading": True, "cpu_offloading_num_layers": layers - 1}})]


def candidate_switches(sc: Scenario) -> list[tuple[str, str, dict]]:
    """[(description, Megatron flags, {section: {field: value}})] that could lower the peak."""
    p = sc.parallel
    out = _activation_switches(p)
    if not p.distributed_optimizer and p.dp > 1:
        out.append(("distributed optimizer", "--use-distributed-optimizer",
                    {"parallel": {"distributed_optimizer": True}}))
    if p.micro_batch_size > 1:
        half = p.micro_batch_size // 2
        out.append((f"micro-batch {half}", f"--micro-batch-size {half}",
                    {"parallel": {"micro_batch_size": half}}))
    return out + _stage_switch(sc) + _fsdp_switches(sc) + _offload_switch(sc)


def allocator_timelines(ledgers: list, expandable_segments: bool = False) -> list:
    """Each ledger's replay through the caching allocator: its timeline (docs/allocator.md)."""
    return [replay_ledger(ledger, expandable_segments=expandable_segments).timeline
            for ledger in ledgers]


def try_switch(sc: Scenario, change: dict, allocator: bool = False) -> dict:
    """Simulate the scenario with `change` (meta mode): worst stage peak, fits?, iteration time;
    with `allocator`, fits only if every stage's rank also fits PyTorch's caching allocator."""
    try:
        variant = with_overrides(sc, **change, run={"mode": "meta"})
    except UserError as err:
        return {"valid": False, "reason": str(err)}
    run = simulate_iteration(variant, Shortcuts.for_scale(variant))
    ledgers = [ledger_of(run, rank) for rank in stage_ranks(run)]
    peaks = [ledger.summary().peak_total for ledger in ledgers]
    worst = int(np.argmax(peaks))
    capacity = ledgers[worst].capacity_bytes
    fits = peaks[worst] <= capacity and (
        not allocator or all(t.oom is None for t in allocator_timelines(ledgers)))
    return {"valid": True, "peak_bytes": int(peaks[worst]), "worst_stage": worst,
            "capacity_bytes": capacity, "fits": bool(fits),
            "iteration_time_s": iteration_time(run)}


EXPANDABLE = ("expandable segments", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


def expandable_switch(ledgers: list, iteration_time_s: float) -> dict:
    """The allocator setting expandable_segments:True as a switch: the same stage ranks'
    ledgers replayed with it; its peak is the worst stage's reserved peak (up to a failure)."""
    timelines = allocator_timelines(ledgers, expandable_segments=True)
    reserved = [t.reserved_peak for t in timelines]
    worst = int(np.argmax(reserved))
    fits = all(t.oom is None for t in timelines) and all(led.oom is None for led in ledgers)
    return {"switch": EXPANDABLE[0], "flags": EXPANDABLE[1], "valid": True,
            "peak_bytes": int(reserved[worst]), "worst_stage": worst,
            "capacity_bytes": ledgers[worst].capacity_bytes, "fits": fits,
            "iteration_time_s": iteration_time_s}


def allocator_failures(allocator_stages, ledger_failures: list) -> list[dict]:
    """The stages `run --caching-allocator` found out of memory in the allocator only (the
    memory report's `stages`), after those whose ledger failed."""
    failed = {s["stage"] for s in ledger_failures}
    return [{"stage": s["stage"], "rank": s["rank"], "allocator_oom": s["allocator_oom"],
             "capacity_bytes": s["capacity_bytes"]}
            for s in allocator_stages if s["allocator_oom"] and s["stage"] not in failed]


def explain_oom(run, allocator_stages=()) -> dict | None:
    """The out-of-memory explanation of `run` (None when every stage fits), JSON-ready;
    `allocator_stages`: the memory report's stages through the caching allocator (run
    --caching-allocator), empty without it."""
    stages = failing_stages(run)
    stages += allocator_failures(allocator_stages, stages)
    if not stages:
        return None
    allocator = bool(allocator_stages)
    switches = []
    for name, flags, change in candidate_switches(run.inputs.sc):
        switches.append({"switch": name, "flags": flags,
                         **try_switch(run.inputs.sc, change, allocator)})
    if allocator:
        ledgers = [ledger_of(run, rank) for rank in stage_ranks(run)]
        switches.append(expandable_switch(ledgers, iteration_time(run)))
    return {"stages": stages, "switches": switches}
