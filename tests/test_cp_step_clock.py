"""A ring step's kernels under one timeout (training/context_parallel/step_clock.py) and the CP
ring's lighter rendezvous end every step at the very float the kernel-by-kernel run does: a run
tracing compute spans takes the kernel-by-kernel path (one timeout per kernel, the oracle), one
without takes the one-timeout path with its memo of charges, and the two agree to the bit in
iteration time, every stage's exposure and every simulated rank's counters (that the fast path
equals --no-shortcuts to 1e-9 on such layouts: tests/test_cp_shortcuts.py)."""

import pytest

from simsp.metrics.collect import collect
from simsp.training.context_parallel.step_clock import one_timeout
from simsp.training.driver import iteration
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
from tests.test_cp_shortcuts import cp_scenario


@pytest.fixture(autouse=True)
def every_cp_rank_runs(monkeypatch):
    """Every simulated CP rank runs its own program, its own counters and ledger compared
    (a CP group as one program: tests/test_cp_shadows.py)."""
    monkeypatch.setattr(iteration, "cp_shadow_why_not", lambda *args: "each rank compared")


def _run(sc, shortcuts, trace):
    run = simulate_iteration(sc, shortcuts, trace=trace)
    return run, collect(run, shortcuts)


def _counters(run) -> dict:
    """Every simulated rank's FLOPs per phase, busy seconds per kernel kind and exposure."""
    return {rank: (r.flops, r.busy_s, r.exposed_s, r.comm_bytes)
            for rank, r in run.inputs.world.ranks.items()}


@pytest.mark.parametrize("gpn, t, cp, p, path", [
    (4, 2, 4, 1, "fast"),  # CP 4 over two nodes (two members each), TP 2 (rank 0 of each runs)
    (2, 1, 3, 2, "full"),  # CP groups of 3 on 2-GPU nodes: stages 0 and 1 share node 1
])
def test_one_timeout_steps_equal_kernel_by_kernel(gpn, t, cp, p, path):
    sc = cp_scenario(gpn, t, cp, p, 1, "p2p", False)
    shortcuts = Shortcuts.for_scale(sc) if path == "fast" else Shortcuts()
    kernelwise, kernelwise_metrics = _run(sc, shortcuts, "full")
    merged, merged_metrics = _run(sc, shortcuts, "none")
    assert not any(one_timeout(r) for r in kernelwise.inputs.world.ranks.values())
    assert all(one_timeout(r) for r in merged.inputs.world.ranks.values())
    assert next(merged.inputs.world.env._eid) < next(kernelwise.inputs.world.env._eid)
    assert merged_metrics["iteration_time_s"] == kernelwise_metrics["iteration_time_s"]
    assert merged_metrics["exposed_s_per_stage"] == kernelwise_metrics["exposed_s_per_stage"]
    assert _counters(merged) == _counters(kernelwise)

