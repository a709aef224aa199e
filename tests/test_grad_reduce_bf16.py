"""--grad-reduce-in-bf16 against Megatron-LM (megatron/training/arguments.py: the flag sets
accumulate_allreduce_grads_in_fp32 False; training.py passes it as DDP's grad_reduce_in_fp32;
distributed_data_parallel.py: `grad_dtype = torch.float if grad_reduce_in_fp32 else
param.dtype`): the gradient buffer, i.e. every main gradient, is BF16, so it holds 2 bytes per
parameter and every collective on it moves half the fp32 bytes: the DP reduce-scatter and
finalize_model_grads' TP all-reduce of the gradients SP leaves partial (finalize_model_grads.py
reduces `param.main_grad`); the parameter all-gather (BF16 either way) does not change."""

import pytest

from simsp.errors import UserError
from simsp.scenario.config import Parallel
from simsp.scenario.loading import load_scenario
from simsp.scenario.precision import grad_reduce_bytes, main_grad_bytes
from simsp.shortcuts.check import Shortcuts
from simsp.training.driver.iteration import simulate_iteration


@pytest.mark.parametrize("fields,main,reduce", [
    ({}, 4, 4),  # bf16 training: Megatron forces accumulate_allreduce_grads_in_fp32 on
    ({"accumulate_allreduce_grads_in_fp32": False}, 4, 2),  # simsp's reduce-only switch
    ({"grad_reduce_in_bf16": True}, 2, 2)])
def test_buffer_and_reduction_bytes(fields, main, reduce):
    """Bytes per element of the main gradient and of its DP reduction."""
    p = Parallel(**fields)
    assert (main_grad_bytes(p), grad_reduce_bytes(p)) == (main, reduce)


def meta_run(bf16: bool):
    """llama-tiny (TP 2 + SP, PP 2, DP 2) in meta mode, distributed optimizer, overlapped."""
    sc = load_scenario("scenarios/llama-tiny.toml", {
        ("run", "mode"): "meta", ("parallel", "distributed_optimizer"): True,
        ("parallel", "overlap_grad_reduce"): True,
        ("parallel", "grad_reduce_in_bf16"): bf16})
    return simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none")


def test_main_gradients_are_bf16_and_their_reduce_scatter_half():
    """Per simulated rank: every main gradient is 2 bytes per element (4 by default); the DP
    reduce-scatter and the SP-partial gradients' all-reduce send exactly half the default's
    bytes, every other collective the same."""
    default, bf16 = meta_run(False), meta_run(True)
    for rank, state in default.states.items():
        mine = bf16.states[rank]
        assert state.grads.keys() == mine.grads.keys()
        for name, grad in state.grads.items():
            assert (grad.itemsize, mine.grads[name].itemsize) == (4, 2), name
        before = default.inputs.world.ranks[rank].comm_bytes
        after = bf16.inputs.world.ranks[rank].comm_bytes
        assert before.keys() == after.keys()
        reduced = [key for key in before if key[1] in ("reduce_scatter_dp",
                                                        "all_reduce_sp_grads")]
        assert len(reduced) == 2
        for key, nbytes in before.items():
            assert after[key] == (nbytes // 2 if key in reduced else nbytes), key


def test_refused_with_fsdp():
    """Modelled for Megatron's DDP buffers only."""
    with pytest.raises(UserError) as caught:
        load_scenario("scenarios/llama-tiny.toml", {("parallel", "use_torch_fsdp2"): True,
                                                    ("parallel", "grad_reduce_in_bf16"): True})
    assert caught.value.field == "parallel.grad_reduce_in_bf16"
    assert "not modelled with FSDP" in str(caught.value)
