"""Expert-layer rank groups in Megatron-LM's order (etp fastest, then ep, edp, pp), worked by hand."""

import pytest

from simsp.cluster.expert_grid import ExpertGrid
from simsp.cluster.grid import RankGrid


def test_ep2_with_etp1_on_tp2_dp4():
    g = ExpertGrid(tp=2, pp=1, dp=4, ep=2, etp=1)  # 8 ranks: EDP = 8 / (1·2·1) = 4
    assert g.edp == 4
    assert g.groups("ep") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert g.groups("edp") == [(0, 2, 4, 6), (1, 3, 5, 7)]


def test_ep2_with_etp_equal_tp_and_two_stages():
    g = ExpertGrid(tp=2, pp=2, dp=4, ep=2)  # 16 ranks: ETP = 2, EDP = 16 / (2·2·2) = 2
    assert g.edp == 2
    assert g.groups("etp") == RankGrid(tp=2, pp=2, dp=4).groups("tp")
    assert g.groups("ep")[:4] == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert g.groups("edp")[:4] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert g.groups("pp") == RankGrid(tp=2, pp=2, dp=4).groups("pp")  # Megatron asserts this
    # each dense DP group (ranks 0, 2, 4, 6 of stage 0) is EP x EDP of the expert layers
    assert sorted(g.group("ep", 0) + g.group("ep", 4)) == list(RankGrid(2, 2, 4).dp_group(0))


def test_indivisible_world_is_rejected():
    with pytest.raises(ValueError):
        ExpertGrid(tp=1, pp=1, dp=6, ep=4)
