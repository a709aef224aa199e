"""FP8 delayed scaling's amax reduction (training/fp8_amax.py, docs/hardware.md#fp8-amax-reduction):
its group and bytes by hand, its spans on the timeline against the communicator's estimate of one
all-reduce of that size, none under the current-scaling recipe, and the same iteration with and
without meta mode's shortcuts."""

import pytest

from simsp.cluster.grid import RankGrid
from simsp.cluster.topology import build_topology, nodes_hosting
from simsp.engine.collectives.ring_plan import ALL_REDUCE
from simsp.engine.collectives.ring_timing import collective_time
from simsp.metrics.timing import exposure
from simsp.scenario.loading import load_scenario
from simsp.shortcuts.check import Shortcuts
from simsp.shortcuts.traffic import amax_owners
from simsp.training.driver.iteration import simulate_iteration
from simsp.training.fp8_amax import TRACK, amax_bytes, amax_group

TINY = "scenarios/llama-tiny.toml"  # TP 2 + SP, PP 2 (1 layer, then 2), DP 2, 2 micro-batches


def tiny(recipe: str = "delayed"):
    """llama-tiny in meta mode on H100s with FP8 (hybrid) under `recipe`."""
    overrides = {("run", "mode"): "meta", ("cluster", "gpu"): "h100-sxm-80gb",
                 ("parallel", "fp8_format"): "hybrid", ("parallel", "fp8_recipe"): recipe}
    return load_scenario(TINY, overrides)


def test_group_is_the_stages_tp_cp_dp_ranks():
    """t 2, c 2, d 2, p 2: Megatron's rank = tp + 2 cp + 4 dp + 8 pp, so stage 1's group is
    ranks 8..15 whatever the rank's tp, cp, dp (parallel_state's tensor-and-data group with CP)."""
    grid = RankGrid(tp=2, pp=2, dp=2, cp=2)
    for rank in (8, 11, 15):
        assert amax_group(grid, rank) == (8, 9, 10, 11, 12, 13, 14, 15)
    assert amax_group(grid, 5) == (0, 1, 2, 3, 4, 5, 6, 7)


def test_bytes_by_hand():
    """A Llama layer's four TE linears (QKV, projection, fc1, fc2): forward 4 x 3 quantizers x
    4 B = 48 B, backward 4 x 2 x 4 B = 32 B per layer."""
    assert amax_bytes(4, forward=True) == 48
    assert amax_bytes(8, forward=False) == 64


@pytest.fixture(scope="module")
def delayed_run():
    return simulate_iteration(tiny("delayed"), Shortcuts.for_scale(tiny("delayed")))


def test_timeline_spans_by_hand(delayed_run):
    """Per rank, per micro-batch one forward and one backward reduction: stage 0 (1 layer) 48 B
    and 32 B, stage 1 (2 layers) 96 B and 64 B, over the stage's 4 ranks; each span lasts the
    communicator's estimate of that all-reduce alone (fp32 elements), and the rank's exposed
    fp8_amax time is their sum."""
    world = delayed_run.inputs.world
    graph, calibration = world.comm.network.graph, world.comm.network.calibration
    for rank, layers, group in ((0, 1, (0, 1, 2, 3)), (4, 2, (4, 5, 6, 7))):
        spans = world.trace.spans_of(rank, TRACK)
        expected = [48 * layers, 32 * layers] * 2  # 1F1B order of this stage, bytes
        if rank == 0:  # stage 0 warms up with both forwards first
            expected = [48, 48, 32, 32]
        assert [s.args["bytes"] for s in spans] == expected
        for span in spans:
            alone = collective_time(ALL_REDUCE, graph, list(group), span.args["bytes"],
                                    calibration, 4)
            assert span.end_s - span.start_s == pytest.approx(alone, rel=1e-9, abs=1e-15)
        exposed = world.ranks[rank].exposed_s[TRACK]
        assert exposed == pytest.approx(sum(s.end_s - s.start_s for s in spans), rel=1e-9)


def test_exposure_still_partitions_the_iteration(delayed_run):
    """The amax waits are one more exposure part: every stage's parts add up to the iteration."""
    total = max(delayed_run.results.end_s.values())
    for row in exposure(delayed_run):
        assert row[TRACK] > 0
        assert sum(row.values()) == pytest.approx(total, rel=1e-9)


def test_no_reduction_under_current_scaling():
    """Tensorwise (current) scaling holds no amax buffer: no span, nothing exposed."""
    run = simulate_iteration(tiny("tensorwise"), Shortcuts.for_scale(tiny("tensorwise")))
    world = run.inputs.world
    assert all(not world.trace.spans_of(r, TRACK) and TRACK not in world.ranks[r].exposed_s
               for r in world.ranks)


def test_same_iteration_without_shortcuts(delayed_run):
    """--no-shortcuts: every rank simulated, every group step by step; same iteration time."""
    full = simulate_iteration(tiny("delayed"))
    assert max(full.results.end_s.values()) == pytest.approx(
        max(delayed_run.results.end_s.values()), rel=1e-12)


def test_shortcuts_list_the_group_only_where_nccl_runs_a_ring():
    """llama-tiny's groups (4 ranks, one node) run their 96 B and 64 B all-reduces as LL rings,
    which load the NVLink ports: listed; 16 ranks over 2 nodes run them as trees, which load no
    link (engine/timed_collectives.py): not listed."""
    sc = tiny()
    grid = RankGrid(sc.parallel.tp, sc.parallel.pp, sc.parallel.dp, sc.parallel.cp)
    graph = build_topology(sc.cluster, nodes_hosting(range(grid.world_size), 8))
    assert amax_owners(sc, grid, graph) == [("amax", (0, 1, 2, 3)), ("amax", (4, 5, 6, 7))]
    wide = load_scenario(TINY, {("run", "mode"): "meta", ("cluster", "gpu"): "h100-sxm-80gb",
                                ("cluster", "nodes"): 4, ("parallel", "data_parallel_size"): 8,
                                ("parallel", "global_batch_size"): 16,
                                ("parallel", "fp8_format"): "hybrid"})
    grid = RankGrid(2, 2, 8)
    graph = build_topology(wide.cluster, nodes_hosting(range(grid.world_size), 8))
    assert amax_owners(wide, grid, graph) == []
