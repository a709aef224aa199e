"""The MoE layers' load after an iteration: rows each rank's experts computed (the slowest
expert rank has the most), tokens dropped at capacity, padding, tokens dispatched per rank
(docs/moe.md). Counted in forward on the simulated ranks (simsp/model/blocks/moe/layer.py)."""

DISPATCH_LABELS = ("all_to_all_dispatch", "all_gather_etp", "all_gather_moe")  # token bytes out


def moe_metrics(inputs) -> dict:
    """{"moe": {...}} for a MoE model, {} for a dense one, from the simulated ranks of the
    run's world (`inputs`: training/driver/run.py RunInputs)."""
    if inputs.sc.model.num_experts is None:
        return {}
    ranks = inputs.world.ranks
    # a counter that never moved is absent (replayed layer steps add only what changed)
    loads = {rank: r.moe_load for rank, r in sorted(ranks.items()) if r.moe_load}
    if not loads:
        return {"moe": {}}
    represented = inputs.sc.parallel.world_size / len(ranks)  # meta: ranks per simulated
    rows = {rank: load.get("expert_rows", 0) for rank, load in loads.items()}
    slowest = max(rows, key=lambda rank: (rows[rank], -rank))
    mean = sum(rows.values()) / len(rows)
    routed = round(represented * sum(load.get("routed_pairs", 0) for load in loads.values()))
    dropped = round(represented * sum(load.get("dropped_pairs", 0) for load in loads.values()))
    sent = {rank: sum(n for (phase, label), n in ranks[rank].comm_bytes.items()
                      if phase == "forward" and label in DISPATCH_LABELS)
            for rank in loads}
    return {"moe": {
        "expert_rows_per_rank": {str(rank): n for rank, n in rows.items()},
        "slowest_expert_rank": slowest,
        "slowest_expert_rows": rows[slowest],
        "mean_expert_rows": mean,
        "expert_load_imbalance": rows[slowest] / mean if mean else 1.0,
        "routed_pairs": routed,
        "dropped_pairs": dropped,
        "dropped_fraction": dropped / routed if routed else 0.0,
        "padding_rows": round(represented * sum(load.get("padding_rows", 0) for load in loads.values())),
        "dispatched_bytes_per_rank": {str(rank): n for rank, n in sent.items()},
    }}
