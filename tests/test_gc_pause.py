"""The collector pause around a simulation (gc_pause.py)."""

import gc

import pytest

from simsp.gc_pause import gc_paused


def test_the_collector_is_off_inside_and_back_on_after_even_on_error():
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with gc_paused():
            assert not gc.isenabled()
            raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_paused_collector_stays_paused():
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_freeze_moves_what_is_alive_out_of_later_collections():
    kept = [[i] for i in range(1000)]  # tracked objects made inside the pause
    try:
        with gc_paused(freeze=True):
            more = [[i] for i in range(1000)]
        assert gc.isenabled() and gc.get_freeze_count() >= len(kept) + len(more)
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0


def test_a_sweep_row_leaves_its_world_to_reference_counting():
    """After a row's evaluation the released world is freed at once: what is left for the
    cyclic collector is simpy's self-bound Resource methods (a few dozen objects), not the
    world (about 1,200 objects for this t2 p2 d2 model without World.release)."""
    from simsp.api import build_configs
    from simsp.explore.evaluation.evaluate import evaluate
    config = build_configs(None, {"mode": "meta", "num_layers": "4", "data_parallel_size": "2",
                                  "pipeline_model_parallel_size": "2",
                                  "tensor_model_parallel_size": "2"})[0]
    gc.collect()
    gc.disable()
    try:
        row = evaluate(config.values)
        left = gc.collect()
    finally:
        gc.enable()
    assert row["status"] == "ok" and left < 100
