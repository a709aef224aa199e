"""Why an iteration ran out of memory, and which switches bring it under capacity.

The explanation is measured, never guessed: the bytes by category come from the failing rank's
ledger at the moment of the first allocation that did not fit, and each candidate switch (turn on
SP, selective or full recompute, the distributed optimizer, a smaller micro-batch, more pipeline
stages) is a real simulate_iteration of the modified scenario in meta mode, whose worst stage
peak is compared with the capacity.
"""

from operator import itemgetter

import numpy as np

from simsp.scenario.config import Scenario
from simsp.scenario.loading import with_overrides
from simsp.engine.memory import CATEGORIES
from simsp.errors import UserError
from simsp.metrics import iteration_time, stage_ranks
from simsp.training.driver.iteration import Shortcuts, simulate_iteration


def category_states(events: list) -> np.ndarray:
    """Bytes per category after each ledger event, events in time order (stable, ties in
    recording order, as engine/memory/summary.py's summarize reads them): (n, 6) int64."""
    ordered = sorted(events, key=itemgetter(0))
    code = {c: i for i, c in enumerate(CATEGORIES)}
    deltas = np.zeros((len(ordered), len(CATEGORIES)), dtype=np.int64)  # (n, 6)
    deltas[np.arange(len(ordered)), [code[e.category] for e in ordered]] = [
        e.delta_bytes for e in ordered]
    return np.cumsum(deltas, axis=0)


def bytes_at_failure(ledger) -> dict | None:
    """{category: bytes in use} just before the first allocation that did not fit, largest
    first; None if every allocation fits."""
    state = category_states(ledger.events)  # (n, 6)
    over = np.flatnonzero(state.sum(axis=1) > ledger.capacity_bytes)
    if len(over) == 0:
        return None
    before = state[over[0] - 1] if over[0] > 0 else np.zeros(len(CATEGORIES), np.int64)  # (6,)
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
    if layers % (2 * p.pp):
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
    return out + _stage_switch(sc)


def try_switch(sc: Scenario, change: dict) -> dict:
    """Simulate the scenario with `change` (meta mode): worst stage peak, fits?, iteration time."""
    try:
        variant = with_overrides(sc, **change, run={"mode": "meta"})
    except UserError as err:
        return {"valid": False, "reason": str(err)}
    run = simulate_iteration(variant, Shortcuts.for_scale(variant))
    peaks = [run.inputs.world.ranks[rank].ledger.summary().peak_total for rank in stage_ranks(run)]
    worst = int(np.argmax(peaks))
    capacity = run.inputs.world.ranks[stage_ranks(run)[worst]].ledger.capacity_bytes
    return {"valid": True, "peak_bytes": int(peaks[worst]), "worst_stage": worst,
            "capacity_bytes": capacity, "fits": peaks[worst] <= capacity,
            "iteration_time_s": iteration_time(run)}


def explain_oom(run) -> dict | None:
    """The out-of-memory explanation of `run` (None when every stage fits), JSON-ready."""
    stages = failing_stages(run)
    if not stages:
        return None
    switches = []
    for name, flags, change in candidate_switches(run.inputs.sc):
        switches.append({"switch": name, "flags": flags, **try_switch(run.inputs.sc, change)})
    return {"stages": stages, "switches": switches}
