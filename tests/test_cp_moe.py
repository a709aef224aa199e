"""Context parallelism with MoE layers (docs/context-parallel.md, docs/moe.md): the dense and
expert grids against Megatron-LM's RankGenerator (re-derived here from
megatron/core/parallel_state.py generate_masked_orthogonal_rank_groups), every gradient of tiny
MoE + CP layouts against the single-device reference, and meta mode's fast path."""

import math

import pytest

from simsp.cluster.grid import RankGrid
from simsp.model.blocks.moe.router import aux_group
from simsp.model.blocks.moe.placement import expert_grid
from simsp.training.driver.compare import compare_with_reference
from simsp.training.driver.iteration import simulate_iteration
from tests.test_moe_expert_parallel import TP_SP, scenario


def megatron_groups(sizes: dict, order: str, axes: str) -> set:
    """RankGenerator(...).get_ranks(axes): the ranks varying along `axes` ("tp-cp", "ep", ...)
    with the other axes fixed, the first axis of `order` fastest."""
    names = order.split("-")
    shape = [sizes[n] for n in names]
    stride = [math.prod(shape[:i]) for i in range(len(shape))]
    inner = [n for n in names if n in axes.split("-")]
    outer = [n for n in names if n not in inner]

    def ranks_of(fixed: dict) -> tuple:
        out = []
        for k in range(math.prod(sizes[n] for n in inner)):
            digits = dict(fixed)
            for n in inner:
                k, digits[n] = divmod(k, sizes[n])
            out.append(sum(digits[n] * stride[names.index(n)] for n in names))
        return tuple(out)

    groups = set()
    for k in range(math.prod(sizes[n] for n in outer)):
        fixed = {}
        for n in outer:
            k, fixed[n] = divmod(k, sizes[n])
        groups.add(ranks_of(fixed))
    return groups


ORDER = "tp-cp-ep-dp-pp"


@pytest.mark.parametrize("t, cp, d, p, ep, etp", [(2, 2, 2, 2, 4, 1), (2, 4, 1, 1, 2, 2),
                                                  (1, 2, 4, 1, 4, 1)])
def test_dense_and_expert_grids_are_megatrons(t, cp, d, p, ep, etp):
    """The dense grid (tp, cp, dp, pp; ep 1) and the expert grid (etp, ep, edp, pp; cp 1,
    edp = t·cp·d/(etp·ep)) of parallel_state.initialize_model_parallel, group by group."""
    sc = scenario(tensor_model_parallel_size=t, sequence_parallel=t > 1, context_parallel_size=cp,
                  data_parallel_size=d, pipeline_model_parallel_size=p,
                  expert_model_parallel_size=ep, expert_tensor_parallel_size=etp,
                  attention_backend="flash", seq_length=16, num_layers=2 * p,
                  global_batch_size=2 * d, nodes=4, num_experts=8)
    dense = {"tp": t, "cp": cp, "ep": 1, "dp": d, "pp": p}
    grid = RankGrid(t, p, d, cp)
    for ours, theirs in (("tp", "tp"), ("cp", "cp"), ("dp_cp", "cp-dp"), ("pp", "pp")):
        assert set(grid.groups(ours)) == megatron_groups(dense, ORDER, theirs), ours
    experts = {"tp": etp, "cp": 1, "ep": ep, "dp": t * cp * d // (etp * ep), "pp": p}
    egrid = expert_grid(sc)
    for ours, theirs in (("etp", "tp"), ("ep", "ep"), ("edp", "dp"), ("pp", "pp")):
        assert set(egrid.groups(ours)) == megatron_groups(experts, ORDER, theirs), ours

    class Rank:  # what aux_group reads of a rank
        def __init__(self, rank):
            self.tp = type("Tp", (), {"index": rank % t, "size": t,
                                      "members": grid.tp_group(rank)})()
            self.cp = type("Cp", (), {"members": grid.cp_group(rank)})()
    tp_cp = megatron_groups(dense, ORDER, "tp-cp")
    assert all(aux_group(Rank(rank)) in tp_cp for rank in range(grid.world_size))


LAYOUTS = {  # overrides of test_moe_expert_parallel's tiny MoE (4 experts, aux loss 0.01)
    "cp4 ep4 top1 dropping": dict(context_parallel_size=4, seq_length=16,
                                  expert_model_parallel_size=4, data_parallel_size=1,
                                  global_batch_size=4, moe_router_topk=1,
                                  moe_expert_capacity_factor=0.5),
    "cp4 2x2 a2a+p2p ep4": dict(context_parallel_size=4, cp_comm_type="a2a+p2p",
                                hierarchical_context_parallel_sizes="2 2",
                                num_attention_heads=4, seq_length=16,
                                expert_model_parallel_size=4, data_parallel_size=1,
                                global_batch_size=4),
    "cp2 t2 sp ep2 allgather dispatcher": dict(TP_SP, context_parallel_size=2,
                                               moe_token_dispatcher_type="allgather",
                                               data_parallel_size=1, global_batch_size=4),
    "cp2 t2 sp etp1 ep2 pp2 dp2 shared swiglu dropout": dict(
        TP_SP, context_parallel_size=2, pipeline_model_parallel_size=2,
        expert_tensor_parallel_size=1, moe_shared_expert_intermediate_size=12, swiglu=True,
        hidden_dropout=0.1, nodes=2),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_gradient_equals_the_single_device_reference(name):
    """Each (tp, cp) rank routes, drops and balances its own tokens (the reference routes the
    same row sets: training/driver/compare.py moe_token_rows); the aux loss's tokens per expert are
    summed over the tp_cp group, as Megatron's router does."""
    sc = scenario(attention_backend="flash", **LAYOUTS[name])
    errors = compare_with_reference(simulate_iteration(sc))
    assert max(errors.values()) < 1e-12, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    assert "layers.0.mlp.router.weight" in errors and "layers.0.mlp.experts.fc1.weight" in errors


def test_fast_path_equals_full_simulation_with_moe_and_cp():
    """t 2, cp 2, d 2 on two nodes of 4 GPUs, EP 4 over each stage's (tp, cp) ranks: the
    closed-form shortcut (the aux all-reduce's tp_cp groups listed: shortcuts/cp_traffic.py)
    equals --no-shortcuts to 1%."""
    from simsp.scenario.loading import with_overrides
    from simsp.training.driver.iteration import Shortcuts
    from tests.test_cp_shortcuts import cp_scenario
    from tests.test_shortcut_layouts import assert_same, fast_and_full
    sc = with_overrides(cp_scenario(4, 2, 2, 1, 2, "p2p", True),
                        model={"num_experts": 4, "moe_router_topk": 2,
                               "moe_aux_loss_coeff": 0.01, "add_bias_linear": False},
                        parallel={"expert_model_parallel_size": 4,
                                  "expert_tensor_parallel_size": 1,
                                  "moe_token_dispatcher_type": "alltoall"})
    assert Shortcuts.for_scale(sc).closed_form
    fast, full = fast_and_full(sc)
    assert_same(fast, full)
