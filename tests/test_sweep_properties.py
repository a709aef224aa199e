"""Laws of the sweep machinery that hold for all inputs (hypothesis, small and fast)."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simsp.api import build_configs
from simsp.report.sweep.plots import pareto_front

points = st.lists(st.tuples(st.integers(1, 20), st.integers(1, 20)), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(points)
def test_pareto_front_is_exactly_the_undominated_points(pairs):
    times = np.array([t for t, _ in pairs], dtype=float)  # (n,)
    peaks = np.array([m for _, m in pairs], dtype=float)  # (n,)
    front = set(pareto_front(times, peaks).tolist())

    def dominated(i):
        return any(times[j] <= times[i] and peaks[j] <= peaks[i] and
                   (times[j], peaks[j]) != (times[i], peaks[i]) for j in range(len(pairs)))

    undominated = {i for i in range(len(pairs)) if not dominated(i)}
    # duplicates of an undominated point: exactly one of them is on the front
    assert {(times[i], peaks[i]) for i in front} == {(times[i], peaks[i]) for i in undominated}
    assert len(front) == len({(times[i], peaks[i]) for i in undominated})


axis = st.lists(st.integers(1, 9), min_size=1, max_size=3, unique=True)


@settings(max_examples=25, deadline=None)
@given(axis, axis, st.lists(st.sampled_from(["none", "selective", "full"]), min_size=1,
                            max_size=3, unique=True))
def test_grid_size_is_the_product_and_every_combination_appears_once(tps, mbs, recomputes):
    lists = {"tensor_model_parallel_size": tps, "micro_batch_size": mbs,
             "recompute_granularity": recomputes}
    configs = build_configs(None, lists)
    assert len(configs) == math.prod(len(v) for v in lists.values())
    combos = {(c.overrides()[("parallel", "tensor_model_parallel_size")],
               c.overrides()[("parallel", "micro_batch_size")],
               c.overrides()[("parallel", "recompute_granularity")]) for c in configs}
    assert combos == {(t, b, r) for t in tps for b in mbs for r in recomputes}
    assert len({c.digest() for c in configs}) == len(configs)
