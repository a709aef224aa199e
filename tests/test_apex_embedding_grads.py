"""The embeddings' gradients under Apex's distributed Adam as NeMo runs it (--bucket-cap-mb):
fp32 main gradients for the word and position embeddings (NeMo with_fp32_embedding_grads,
megatron_gpt_model.py configure_optimizers; scenario/precision.py APEX_FP32_GRAD_PARAMS), and
the word table's gradient added into the main gradient by Apex's hook even when the output layer
is tied (apex distributed_fused_adam.py _grad_copy: grad_out.add_(grad_in); no
grad_added_to_main_grad under NeMo, so the output layer leaves no placeholder)."""

import json
from types import SimpleNamespace

import pytest

from simsp.scenario.loading import load_scenario
from simsp.scenario.precision import precision_of
from simsp.training.pipeline.steps import _word_grad_fold
from tests.inprocess import cli

APEX = {("run", "mode"): "meta", ("parallel", "distributed_optimizer"): True,
        ("parallel", "grad_reduce_in_bf16"): True, ("parallel", "bucket_cap_mb"): 1.0}


def _gradient_bytes(*flags):
    """Each rank's gradient bytes in the ledger: tiny.toml (GPT, tied, t 2, p 2, d 2) with BF16
    main gradients and the distributed optimizer."""
    rc, out, err = cli(["run", "scenarios/tiny.toml", "--mode", "meta", "--distributed-optimizer",
                        "--grad-reduce-in-bf16", "--json", *flags])
    assert rc == 0, err
    return [rank["peak_by_category_bytes"]["gradients"] for rank in json.loads(out)["ranks"]]


def test_embedding_gradients_are_fp32_by_hand():
    # vocabulary 128 padded to a multiple of 128 x t = 256 (Megatron's padding), 128 rows of h 64
    # per TP rank: 8192 elements; learned positions 32 x 64 = 2048, not TP-sharded. Under Apex
    # both go from 2 to 4 bytes on the first stage (ranks 0-3); the last stage (4-7) holds the
    # tied output layer's copy of the word table, fp32 too (NeMo marks it on the last stage)
    megatron, apex = _gradient_bytes(), _gradient_bytes("--bucket-cap-mb", "1")
    assert [a - m for a, m in zip(apex, megatron)] == [2 * (8192 + 2048)] * 4 + [2 * 8192] * 4


def test_only_the_embeddings_and_only_under_apex():
    apex = precision_of(load_scenario("scenarios/tiny.toml", APEX))
    assert apex.grad_bytes("embedding.word") == apex.grad_bytes("embedding.position") == 4
    assert apex.grad_bytes("output.weight") == 2  # an untied output layer is not an embedding
    megatron = precision_of(load_scenario("scenarios/tiny.toml",
                                          {k: v for k, v in APEX.items() if k[1] != "bucket_cap_mb"}))
    assert megatron.grad_bytes("embedding.word") == 2


@pytest.mark.parametrize("apex, expected", [(True, (False, True)), (False, (True, False))])
def test_tied_table_is_added_into_the_main_gradient_under_apex(apex, expected):
    # (after_other, fold) on the stage holding both the lookup and the tied output layer:
    # Megatron's DDP sums the table with the output layer's placeholder and adds nothing
    # (grad_added_to_main_grad); Apex's hook adds the table, and nothing was summed before it
    overrides = {**APEX, ("parallel", "pipeline_model_parallel_size"): 1}
    if not apex:
        del overrides[("parallel", "bucket_cap_mb")]
    sc = load_scenario("scenarios/tiny.toml", overrides)
    plan = SimpleNamespace(is_last=lambda chunk: True)
    assert _word_grad_fold(sc, plan, 0) == expected
