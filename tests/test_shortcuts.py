"""Each scale shortcut gives the same answer as the full simulation on a small case whose DP
groups and pipeline pairs cross nodes (docs/shortcuts.md)."""

import pytest

from simsp.cluster.grid import RankGrid
from simsp.scenario.loading import load_scenario
from simsp.training.driver.iteration import Shortcuts, simulate_iteration

FULL = Shortcuts()
REPRESENTATIVE = Shortcuts(representative=True)
CLOSED_FORM = Shortcuts(closed_form=True)
NO_TEMPLATES = Shortcuts(representative=True, closed_form=True)
SCALE = Shortcuts(representative=True, closed_form=True, templates=True)


def small_meta(**parallel):
    """t 2 with SP, p 2, d 2 on four 2-GPU nodes (a TP group fills a node, so every DP group
    and every pipeline transfer crosses InfiniBand), meta mode."""
    overrides = {("model", "num_layers"): 4, ("model", "hidden_size"): 256,
                 ("model", "num_attention_heads"): 8, ("model", "seq_length"): 128,
                 ("run", "mode"): "meta", ("cluster", "nodes"): 4,
                 ("cluster", "gpus_per_node"): 2,
                 ("parallel", "tensor_model_parallel_size"): 2,
                 ("parallel", "sequence_parallel"): True,
                 ("parallel", "pipeline_model_parallel_size"): 2,
                 ("parallel", "data_parallel_size"): 2,
                 ("parallel", "recompute_granularity"): "selective",
                 ("parallel", "global_batch_size"): 8}
    overrides.update({("parallel", k): v for k, v in parallel.items()})
    return load_scenario(None, overrides)


def test_small_case_crosses_nodes():
    """What small_meta's docstring says: every DP group and pipeline pair spans two nodes."""
    sc = small_meta()
    grid = RankGrid(sc.parallel.tp, sc.parallel.pp, sc.parallel.dp)
    for axis in ("dp", "pp"):
        assert all(len({rank // 2 for rank in g}) == 2 for g in grid.groups(axis))


def stage_summaries(run):
    """Peak and per-category peaks of each pipeline stage's tp=0, dp=0 rank."""
    out = []
    for pp in range(run.inputs.sc.parallel.pp):
        summary = run.inputs.world.ranks[run.inputs.rank_of(0, 0, pp)].ledger.summary()
        out.append((summary.peak_total, summary.peak_by_category, summary.at_peak))
    return out


def _events(events):
    """Ledger events in time order, times rounded to the picosecond."""
    rows = [(round(e.time_s, 12), e.key, e.category, e.delta_bytes) for e in events]
    return sorted(rows)


def iteration_time(run):
    return max(run.results.end_s.values())


RUNTIME_VARIANTS = [
    {"sequence_parallel": False},  # scatter/gather p2p
    {"overlap_grad_reduce": True, "ddp_bucket_size": 100_000},
    {"distributed_optimizer": True, "overlap_grad_reduce": True, "overlap_param_gather": True,
     "ddp_bucket_size": 100_000},
    {"num_layers_per_virtual_pipeline_stage": 1, "overlap_p2p_communication": True}]


@pytest.mark.parametrize("parallel", [{}, {"num_layers_per_virtual_pipeline_stage": 1}]
                         + RUNTIME_VARIANTS)
def test_representative_ranks_match_every_rank(parallel):
    """Simulating one rank per TP group and DP replica changes neither time nor memory."""
    sc = small_meta(**parallel)
    full, rep = simulate_iteration(sc, FULL), simulate_iteration(sc, REPRESENTATIVE)
    assert len(rep.inputs.world.ranks) == sc.parallel.pp < len(full.inputs.world.ranks)
    assert iteration_time(rep) == pytest.approx(iteration_time(full), rel=1e-12)
    assert stage_summaries(rep) == stage_summaries(full)
    # every simulated rank of the full run has the ledger of its stage's representative
    for rank, r in full.inputs.world.ranks.items():
        pp = full.inputs.world.grid.coords(rank).pp
        twin = rep.inputs.world.ranks[rep.inputs.rank_of(0, 0, pp)].ledger.summary()
        assert r.ledger.summary().peak_total == twin.peak_total


def test_closed_form_collectives_match_stepwise_rings():
    """Timing each collective as a whole stays within 1% of moving every ring step."""
    sc = small_meta()
    stepwise, closed = simulate_iteration(sc, FULL), simulate_iteration(sc, CLOSED_FORM)
    assert iteration_time(closed) == pytest.approx(iteration_time(stepwise), rel=0.01)
    assert stage_summaries(closed) == stage_summaries(stepwise)


@pytest.mark.parametrize("parallel", [{}, {"recompute_granularity": "full"},
                                      {"num_layers_per_virtual_pipeline_stage": 1},
                                      {"sequence_parallel": False, "schedule": "gpipe"}]
                         + RUNTIME_VARIANTS)
def test_layer_templates_match_executing_every_op(parallel):
    """Replaying a recorded layer step is exact (to float rounding of summed durations): same
    time, same ledger events, same counters."""
    sc = small_meta(**parallel)
    executed, replayed = simulate_iteration(sc, NO_TEMPLATES), simulate_iteration(sc, SCALE)
    assert iteration_time(replayed) == pytest.approx(iteration_time(executed), rel=1e-12)
    for rank, r in executed.inputs.world.ranks.items():
        twin = replayed.inputs.world.ranks[rank]
        assert _events(twin.ledger.events) == _events(r.ledger.events)
        assert stage_summaries(replayed) == stage_summaries(executed)
        assert twin.flops == r.flops and twin.comm_bytes == r.comm_bytes
        assert twin.exposed_s == pytest.approx(r.exposed_s)


def test_numeric_mode_refuses_the_representative_shortcut():
    sc = load_scenario(None, {("parallel", "tensor_model_parallel_size"): 2})
    with pytest.raises(ValueError):
        simulate_iteration(sc, REPRESENTATIVE)
    numeric = Shortcuts.for_scale(sc)
    assert numeric.flags() == FULL.flags() and not numeric.methods
    assert all(why.startswith("not used: numeric") for why in numeric.why().values())


@pytest.mark.parametrize("parallel", RUNTIME_VARIANTS[1:3])
def test_only_the_model_state_outlives_the_iteration(parallel):
    """DP buckets, reduce-scatter and the parameter all-gather free what they allocate."""
    run = simulate_iteration(small_meta(**parallel), FULL)
    for r in run.inputs.world.ranks.values():
        assert {c for c, b in r.ledger.current.items() if b} == {"weights", "gradients",
                                                                "optimizer"}
