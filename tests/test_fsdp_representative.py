"""The representative under FSDP with sequence parallelism: each DP rank all-reduces over TP the
SP-partial slice of its gradient shard (training/data_parallel/fsdp_reductions.py _sync_sp_shards), so DP
replicas whose slices differ end at different times; TP rank 0 of one replica per kind runs
(shortcuts/representative.py fsdp_replicas), equal to the full simulation."""

from dataclasses import replace

import pytest

from simsp.cluster.grid import RankGrid
from simsp.metrics.collect import collect
from simsp.shortcuts.check import Shortcuts
from simsp.shortcuts.representative import sp_slices_per_dp_rank
from simsp.training.driver.iteration import simulate_iteration
from tests.test_work_counts import FSDP_T8, scenario


def t8_p2(d: int, layers: int):
    """FSDP_T8 (t8 SP p2 ZeRO-3 on DGX H100, h 1024) with d replicas and `layers` layers."""
    flags = list(FSDP_T8)
    for flag, value in (("--world-size", 16 * d), ("--global-batch-size", 2 * d),
                        ("--num-layers", layers)):
        flags[flags.index(flag) + 1] = str(value)
    return scenario(flags)


def test_sp_slices_per_dp_rank_hand_worked():
    """A layer unit of stage 0 at t 8 (TP-local, flat order): ln1 gamma, beta 2 x 1,024 (SP),
    qkv 393,216 + 384, proj 131,072, proj bias 1,024 (SP), ln2 2 x 1,024 (SP), fc1 524,288 +
    512, fc2 524,288, fc2 bias 1,024 (SP): 1,579,904 elements, a shard of 394,976 at d 4.
    Rank 0 holds ln1 (2,048), rank 1 [394,976, 789,952) the proj bias and ln2 (3,072), rank 2
    none, rank 3 the fc2 bias (1,024); the root (position table, 524,288, SP) a quarter each."""
    stage0 = sp_slices_per_dp_rank(t8_p2(4, 4), RankGrid(8, 2, 4))[0]
    layer = (2048, 3072, 0, 1024)
    assert stage0 == [(n, n, 0, 131072) for n in layer]


@pytest.mark.parametrize("d, layers, replicas", [(4, 4, (0, 1, 2, 3)), (6, 2, (0, 1, 2, 5)),
                                                   (3, 2, (0, 1, 2))])
def test_one_replica_per_kind_equals_the_full_simulation(d, layers, replicas):
    """d 4: four kinds, every replica runs. d 6 (layer units of 1,579,904 padded by 4, the
    root too; shard 263,318): ranks 0 (ln1), 1 (none), 2 (proj bias, ln2), 5 (fc2 bias and
    the root's padding) are the kinds, 3 and 4 images of 1. d 3 (padded by 1): ln1, proj bias
    and ln2, fc2 bias, three kinds. Iteration time and per-stage exposure equal the full
    simulation's; replica 0 alone ends earlier than the slowest replica (the gap this closes)
    and the verdict names the kinds."""
    sc = t8_p2(d, layers)
    fast = Shortcuts.for_scale(sc)
    assert fast.replicas == replicas
    assert f"{len(replicas)} kinds" in fast.why()["representative"]
    mine = collect(simulate_iteration(sc, fast, trace="none"), fast)
    full = collect(simulate_iteration(sc, Shortcuts(), trace="none"), Shortcuts())
    t_full = full["iteration_time_s"]
    assert mine["iteration_time_s"] == pytest.approx(t_full, rel=1e-9)
    for got, want in zip(mine["exposed_s_per_stage"], full["exposed_s_per_stage"]):
        assert got.keys() == want.keys()
        assert [got[k] for k in got] == pytest.approx([want[k] for k in got],
                                                      abs=1e-9 * t_full)
    one = replace(fast, replicas=(0,))
    alone = collect(simulate_iteration(sc, one, trace="none"), one)["iteration_time_s"]
    assert alone < t_full * (1 - 1e-4)


def test_replicas_alike_without_sequence_parallelism():
    """Without SP no shard slice is all-reduced over TP: replica 0 stands for every one."""
    flags = [f for f in FSDP_T8 if f != "--sequence-parallel"] + ["--no-sequence-parallel"]
    fast = Shortcuts.for_scale(scenario(flags))
    assert fast.representative and fast.replicas == (0,)
