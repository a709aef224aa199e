"""Rank grid: Megatron-LM order (TP fastest, then DP, then PP), groups and placement."""

import pytest
from hypothesis import given, strategies as st

from simsp.cluster.grid import Coords, RankGrid


def test_megatron_order_on_a_hand_worked_grid():
    grid = RankGrid(tp=2, pp=2, dp=2)  # Megatron: rank = tp + 2*dp + 4*pp
    assert [grid.coords(r) for r in range(8)] == [
        Coords(0, 0, 0), Coords(1, 0, 0), Coords(0, 1, 0), Coords(1, 1, 0),
        Coords(0, 0, 1), Coords(1, 0, 1), Coords(0, 1, 1), Coords(1, 1, 1)]
    assert grid.tp_group(5) == (4, 5)
    assert grid.dp_group(5) == (5, 7)
    assert grid.pp_group(5) == (1, 5)


@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4))
def test_rank_of_inverts_coords(tp, pp, dp):
    grid = RankGrid(tp=tp, pp=pp, dp=dp)
    assert grid.world_size == tp * pp * dp
    for rank in range(grid.world_size):
        assert grid.rank_of(*grid.coords(rank)) == rank


@pytest.mark.parametrize("axis", ["tp", "dp", "pp"])
def test_groups_along_each_axis_partition_the_world(axis):
    grid = RankGrid(tp=2, pp=3, dp=2)
    groups = grid.groups(axis)
    members = sorted(r for g in groups for r in g)
    assert members == list(range(grid.world_size))
    size = getattr(grid, axis)
    assert all(len(g) == size for g in groups) and len(groups) == grid.world_size // size


def test_tp_group_is_consecutive_and_inside_one_node():
    grid = RankGrid(tp=8, pp=4, dp=2)
    for group in grid.groups("tp"):
        assert group == tuple(range(group[0], group[0] + 8))
        assert len({r // 8 for r in group}) == 1


def test_group_members_share_the_other_coordinates():
    grid = RankGrid(tp=2, pp=2, dp=3)
    for rank in range(grid.world_size):
        c = grid.coords(rank)
        assert {grid.coords(r)[1:3] for r in grid.tp_group(rank)} == {(c.dp, c.pp)}
        assert {(grid.coords(r).tp, grid.coords(r).pp) for r in grid.dp_group(rank)} == {
            (c.tp, c.pp)}
        assert [grid.coords(r).pp for r in grid.pp_group(rank)] == [0, 1]


def test_bad_sizes_and_ranks_are_rejected():
    with pytest.raises(ValueError):
        RankGrid(tp=0, pp=1, dp=1)
    grid = RankGrid(tp=2, pp=1, dp=1)
    with pytest.raises(ValueError):
        grid.coords(2)
    with pytest.raises(ValueError):
        grid.rank_of(2, 0, 0)


@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(1, 4))
def test_every_group_is_the_ranks_sharing_the_other_coordinates_in_axis_order(tp, pp, dp, cp):
    """The oracle filters the whole world by coordinates and sorts by the group's axis (CP
    fastest within DP x CP, Megatron-LM's order); the grid builds each group as a stride."""
    grid = RankGrid(tp=tp, pp=pp, dp=dp, cp=cp)
    world = [grid.coords(r) for r in range(grid.world_size)]
    axes = {"tp": ("tp",), "dp": ("dp",), "pp": ("pp",), "cp": ("cp",), "dp_cp": ("dp", "cp")}
    build = {"tp": grid.tp_group, "dp": grid.dp_group, "pp": grid.pp_group,
             "cp": grid.cp_group, "dp_cp": grid.dp_cp_group}
    for rank, c in enumerate(world):
        for name, varying in axes.items():
            kept = [f for f in Coords._fields if f not in varying]
            members = [r for r, o in enumerate(world)
                       if all(getattr(o, f) == getattr(c, f) for f in kept)]
            members.sort(key=lambda r: tuple(getattr(world[r], f) for f in varying))
            assert build[name](rank) == tuple(members), (name, rank)
