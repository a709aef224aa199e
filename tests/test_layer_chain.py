"""Chained layer replays (training/pipeline/layer_chain.py, model/replay.py replay_chain): the same
ledger, times and results as replaying the layers one event each."""

import math

from hypothesis import given, settings, strategies as st
import pytest

from simsp.scenario.loading import load_scenario, with_overrides
from simsp.model.replay import delay_to
from simsp.training.pipeline import layer_chain
from simsp.training.driver.iteration import Shortcuts, simulate_iteration

META = Shortcuts(True, True, True)


def _scenario(**parallel):
    """The tiny model in meta mode with 8 layers: 2 layers per stage and chunk at p = 2, v = 2."""
    sc = load_scenario("scenarios/tiny.toml")
    return with_overrides(sc, model={"num_layers": 8}, run={"mode": "meta"},
                          parallel={"num_layers_per_virtual_pipeline_stage": 2, **parallel})


def _simulate(sc, chained: bool, monkeypatch):
    with monkeypatch.context() as patch:
        if not chained:
            patch.setattr(layer_chain, "_chained", lambda *args: False)
        return simulate_iteration(sc, META)


@pytest.mark.parametrize("parallel, chains", [
    ({}, True),
    ({"recompute_granularity": "full"}, False),  # checkpointed segments: never chained
    ({"overlap_grad_reduce": True, "distributed_optimizer": True,
      "overlap_param_gather": True}, True),  # but not around all-gathers and bucket launches
    ({"num_layers_per_virtual_pipeline_stage": None}, True),  # one chunk of four layers (1F1B)
])
def test_chained_replay_equals_one_event_per_layer(parallel, chains, monkeypatch):
    sc = _scenario(**parallel)
    chained, single = (_simulate(sc, flag, monkeypatch) for flag in (True, False))
    assert chained.results.end_s == single.results.end_s  # bit for bit
    assert chained.results.steps == single.results.steps
    for rank, r in single.inputs.world.ranks.items():
        twin = chained.inputs.world.ranks[rank]
        assert twin.ledger.events == r.ledger.events
        assert twin.flops == r.flops and twin.comm_bytes == r.comm_bytes
        assert twin.busy_s == pytest.approx(r.busy_s, rel=1e-12)
    events = [next(run.inputs.world.env._eid) for run in (chained, single)]
    assert events[0] < events[1] if chains else events[0] == events[1]


@settings(max_examples=300, deadline=None)
@given(st.floats(0.0, 1e4, allow_nan=False), st.lists(st.floats(1e-9, 1.0), min_size=1,
                                                       max_size=6))
def test_one_delay_lands_where_a_chain_of_timeouts_would(now, durations):
    target = now
    for duration in durations:
        target = target + duration  # what the clock does, timeout after timeout
    delay = delay_to(now, target)
    if delay is None:  # rounding skips target: every delay lands below or above it
        candidates = [math.nextafter(target - now, direction) for direction in (0, math.inf)]
        assert all(now + d != target for d in [target - now, *candidates])
        return
    assert now + delay == target and delay >= 0.0
    assert abs(delay - sum(durations)) <= 2 * len(durations) * math.ulp(target)


def test_a_target_that_rounding_skips_has_no_single_delay():
    assert delay_to(0.78, ((0.78 + 1.0) + 0.78) + 1.0) is None
    assert delay_to(1.0, 3.0) == 2.0
