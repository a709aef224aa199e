"""Search's time bound for DualPipe and DualPipeV where their F&B pairs overlap
(simsp/explore/search/pair_bound.py): a pair at the compute of its F, B and W, worked by hand on
DualPipe p 2; the layer's compute measured as its kernels' seconds; the bound at most the
simulated iteration on small TP and EP layouts (and close to it on one); none under per-layer
CUDA graphs."""

import pytest

from simsp.explore.configs.fields import by_key
from simsp.explore.evaluation.evaluate import simulate_metrics
from simsp.explore.search.bounds import pairs_overlap, split_schedule_time, time_lower_bound
from simsp.explore.search.pair_bound import overlapped_pairs_time
from simsp.scenario.loading import load_scenario
from simsp.training.driver.layer_sim import simulate_layer
from tests.test_search_schedules import layout

MOE = {"num_experts": 4, "moe_router_topk": 2, "expert_model_parallel_size": 2,
       "data_parallel_size": 2, "add_bias_linear": False, "global_batch_size": 16}


@pytest.mark.parametrize("steps, compute", [((1.0, 1.0, 1.0), (1.0, 1.0, 1.0)),
                                            ((2.0, 3.0, 1.0), (0.5, 1.5, 1.0)),
                                            ((1.0, 1.0, 1.0), (0.25, 0.25, 0.5))])
def test_dualpipe_on_two_ranks_worked_by_hand(steps, compute):
    """DualPipe p 2, m 4: rank 0 runs F0.0 F2.1 F1.0 BW2.1 (F3.1&BW0.0) BW3.1 B1.0 W1.0 and
    rank 1 its mirror; each op's input is there when its rank gets to it (the pair's BW0.0 ends
    on rank 1 at 3F + B + W, when rank 0 is free), so neither idles: 3F + 3(B + W) + the pair,
    the pair F_c + B_c + W_c."""
    f, b, w = steps
    pair = sum(compute)
    assert overlapped_pairs_time("dualpipe", 2, 4, steps, compute) == pytest.approx(
        3 * f + 3 * (b + w) + pair, abs=1e-12)


@pytest.mark.parametrize("name, p, m", [("dualpipe", 4, 8), ("dualpipev", 2, 4),
                                        ("dualpipev", 4, 8)])
def test_pairs_at_their_full_steps_give_the_bound_without_overlap(name, p, m):
    """With the pair's compute at the full F, B, W the bound is the one without overlap
    (DualPipe Table 2's 3m + PP − 2, DualPipeV's 6m + 2(n − 1) at unit times); less compute in the
    pairs never gives more."""
    unit = (1.0, 1.0, 1.0)
    closed = 3 * m + p - 2 if name == "dualpipe" else 6 * m + 2 * (p - 1)
    assert overlapped_pairs_time(name, p, m, unit, unit) == pytest.approx(closed, abs=1e-12)
    assert split_schedule_time(name, p, m, 2, unit) == pytest.approx(closed, abs=1e-12)
    assert overlapped_pairs_time(name, p, m, unit, (0.5, 0.5, 0.5)) < closed


def test_layer_compute_is_its_kernels_seconds():
    """compute_steps_s against the rank's kernel log (t 2): F the forward's kernels, B + W the
    backward's, each below the step's clock time (its TP collectives left out); at t 1, no
    collective, the clock's F, B, W themselves."""
    values = layout("dualpipe", 2, 4, 2, False, "none", 1, 8)
    result = simulate_layer(load_scenario(None, values), log_kernels=True, split_backward=True)
    f, b, w = result.compute_steps_s
    log = result.ranks[0].kernel_log  # (name, phase, kind, flops, bytes, seconds)
    assert f == pytest.approx(sum(k[5] for k in log if k[1] == "forward"), rel=1e-12)
    assert b + w == pytest.approx(sum(k[5] for k in log if k[1] != "forward"), rel=1e-12)
    assert f < result.forward_time_s and b < result.input_grad_time_s
    alone = simulate_layer(load_scenario(None, layout("dualpipe", 2, 4, 1, False, "none", 1, 8)),
                           split_backward=True)
    assert alone.compute_steps_s == pytest.approx(
        (alone.forward_time_s, alone.input_grad_time_s, alone.weight_grad_time_s), rel=1e-12)


def _values(schedule: str, pp: int, tp: int, sp: bool, recompute: str, extra: dict) -> dict:
    """A tiny meta GPT (h 128, 2p layers, m 8) with `extra` fields."""
    values = layout(schedule, pp, 2 * pp, tp, sp, recompute, 1, 8)
    table = by_key()
    for key, value in extra.items():
        values[table[key].path] = value
    return values


GRID = [("dualpipe", 2, 2, True, "full", {}),  # t 2 alone: test_search_schedules.py's too
        ("dualpipe", 2, 1, False, "none", {**MOE, "moe_token_dispatcher_type": "alltoall"}),
        ("dualpipev", 2, 2, True, "none", {**MOE, "moe_token_dispatcher_type": "alltoall"}),
        ("dualpipev", 2, 1, False, "full", MOE),
        ("dualpipe", 2, 2, True, "none", {"tp_comm_overlap": True, "sm_contention": True}),
        ("dualpipe", 2, 2, True, "none", {"attention_backend": "flash",
                                          "context_parallel_size": 2})]


@pytest.mark.parametrize("schedule, pp, tp, sp, recompute, extra", GRID)
def test_bound_at_most_the_simulated_iteration(schedule, pp, tp, sp, recompute, extra):
    """TP 2 (SP, full recompute, TP communication overlap under SM contention, CP 2's ring)
    and EP 2 over d 2 (all-to-all and all-gather dispatch): the pairs overlap, and the bound is
    positive and at most the simulated iteration (0.47 to 0.85 of it here)."""
    values = _values(schedule, pp, tp, sp, recompute, extra)
    sc = load_scenario(None, values)
    assert pairs_overlap(sc)
    bound = time_lower_bound(sc)
    assert 0 < bound <= simulate_metrics(values)["iteration_time_s"]


def test_bound_close_on_a_compute_bound_layout():
    """DualPipe p 4, t 1, EP 2 all-to-all (little to hide): the bound is within 10% of the
    simulated iteration (0.907 of it)."""
    values = _values("dualpipe", 4, 1, False, "none",
                     {**MOE, "moe_token_dispatcher_type": "alltoall"})
    iteration = simulate_metrics(values)["iteration_time_s"]
    assert 0.9 * iteration < time_lower_bound(load_scenario(None, values)) <= iteration


def test_no_bound_under_per_layer_cuda_graphs():
    """Per-layer CUDA graphs: the pair's halves share the rank's capture depth, so a kernel may
    run shorter than alone: no bound (0). A whole-iteration graph charges every kernel the
    graphed launch, alone as in the run: a bound, below the simulated iteration."""
    for impl in ("local", "transformer_engine"):
        sc = load_scenario(None, _values("dualpipe", 2, 2, False, "none",
                                         {"cuda_graph_impl": impl}))
        assert pairs_overlap(sc) and time_lower_bound(sc) == 0.0
    values = _values("dualpipe", 2, 2, False, "none", {"cuda_graph_impl": "full_iteration"})
    bound = time_lower_bound(load_scenario(None, values))
    assert 0 < bound <= simulate_metrics(values)["iteration_time_s"]
