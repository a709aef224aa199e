"""Context parallelism on the grid (Megatron order tp, cp, dp, pp) and the 2cp-chunk split."""

import numpy as np
import pytest

from simsp.cluster.grid import Coords, RankGrid
from simsp.model.blocks.attention.rope import rope_angles, rope_forward, rope_tables
from simsp.model.context_split import chunk_ids, gather_sequence, local_positions, split_sequence


def test_cp_axis_sits_between_tp_and_dp_by_hand():
    grid = RankGrid(tp=2, pp=2, dp=2, cp=2)  # rank = tp + 2*cp + 4*dp + 8*pp
    assert grid.world_size == 16
    assert grid.coords(6) == Coords(tp=0, dp=1, pp=0, cp=1)
    assert grid.rank_of(1, 1, 1, 1) == 15
    assert grid.tp_group(6) == (6, 7)
    assert grid.cp_group(6) == (4, 6)
    assert grid.dp_group(6) == (2, 6)
    assert grid.pp_group(6) == (6, 14)
    assert grid.dp_cp_group(6) == (0, 2, 4, 6)  # CP fastest, then DP, same tp and pp
    assert grid.groups("cp")[:2] == [(0, 2), (1, 3)]


def test_cp_one_keeps_the_three_axis_numbering():
    plain, with_cp = RankGrid(tp=2, pp=3, dp=2), RankGrid(tp=2, pp=3, dp=2, cp=1)
    for rank in range(plain.world_size):
        assert with_cp.coords(rank) == plain.coords(rank)
        assert with_cp.dp_cp_group(rank) == plain.dp_group(rank)


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_cp_and_dp_cp_groups_partition_the_world(cp):
    grid = RankGrid(tp=2, pp=2, dp=2, cp=cp)
    for axis in ("cp", "dp_cp"):
        members = sorted(r for g in grid.groups(axis) for r in g)
        assert members == list(range(grid.world_size))
    for rank in range(grid.world_size):
        assert grid.rank_of(*grid.coords(rank)) == rank


def test_load_balanced_chunks_by_hand():
    assert [chunk_ids(4, r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert local_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert local_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert local_positions(8, 2, 1, load_balanced=False).tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_balanced_split_gives_every_rank_the_same_causal_work(cp):
    s = 4 * cp
    keys_seen = [int((local_positions(s, cp, r) + 1).sum()) for r in range(cp)]
    assert len(set(keys_seen)) == 1  # visible (query, key) pairs per rank
    plain = [int((local_positions(s, cp, r, False) + 1).sum()) for r in range(cp)]
    assert len(set(plain)) == cp


@pytest.mark.parametrize("balanced", [True, False])
def test_split_then_gather_is_the_identity(balanced):
    x = np.arange(2 * 16 * 3).reshape(2, 16, 3)  # (b, s, h)
    parts = [split_sequence(x, 4, r, balanced, axis=1) for r in range(4)]
    assert np.array_equal(gather_sequence(parts, balanced, axis=1), x)


def test_rope_per_chunk_equals_rope_of_the_whole_sequence():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 16, 8))  # (b, heads, s, d)
    cos, sin = rope_angles(16, 8, 10000.0)
    whole = rope_forward(x, cos, sin)
    for r in range(4):
        pos = local_positions(16, 4, r)
        cos_r, sin_r = rope_tables(pos, 8, 10000.0)
        mine = rope_forward(x[:, :, pos], cos_r, sin_r)
        assert np.array_equal(mine, whole[:, :, pos])


@pytest.mark.parametrize("cp", [2, 3, 4, 8])
def test_every_ring_step_does_the_same_work_on_every_rank_when_balanced(cp):
    from simsp.model.context_split import balanced_step_pairs, visible_pairs
    s = 8 * cp
    for step in range(cp):
        for rank in range(cp):
            assert visible_pairs(s, cp, rank, step) == balanced_step_pairs(s, cp, step)
    total = sum(visible_pairs(s, cp, r, i) for r in range(cp) for i in range(cp))
    assert total == s * (s + 1) // 2  # the whole causal triangle, each pair once
    plain = [sum(visible_pairs(s, cp, r, i, False) for i in range(cp)) for r in range(cp)]
    assert plain == sorted(plain) and plain[0] < plain[-1]  # unbalanced: later ranks work more
