"""--store-param-remainders (Apex DistributedFusedAdam as NeMo sets it): the fp32 master weight
kept as its 16 low bits, an int16 beside the BF16 weight (NVIDIA/apex apex/contrib/optimizers/
distributed_fused_adam.py `param_remainders_shard`), and the step reading and writing weight and
remainder (apex/contrib/csrc/optimizers/multi_tensor_distopt_adam_kernel.cu,
DistAdamWithParamRemaindersFunctor: loads p_in, p_rem, m, v, g; stores p_rem, m, v, p_out)."""

import json
import tomllib
from types import SimpleNamespace

import pytest

from simsp.scenario.precision import Precision
from simsp.training.data_parallel.optimizer import _adam_bytes_per_param
from simsp.validation.runner import BUNDLED, data_path
from tests.inprocess import cli


@pytest.mark.parametrize("grad_bytes, remainders, expected", [
    # the remainder kernel by hand: read BF16 weight 2 + remainder 2 + m 4 + v 4 + gradient;
    # write remainder 2 + m 4 + v 4 + weight 2: 24 + gradient
    (2, True, 26), (4, True, 28),
    # without: read fp32 master 4 + m 4 + v 4 + gradient; write master, m, v 12 and weight 2
    (2, False, 28), (4, False, 30)])
def test_step_bytes_by_hand(grad_bytes, remainders, expected):
    master = 2 if remainders else 4
    precision = Precision(grad_bytes, (("master", master), ("adam_m", 4), ("adam_v", 4)), None,
                          remainders)
    assert _adam_bytes_per_param(SimpleNamespace(precision=precision)) == expected


def _optimizer_bytes(*flags):
    """Each rank's optimizer bytes in the ledger: llama-tiny (t 2, p 2, d 2), distributed."""
    rc, out, err = cli(["run", "scenarios/llama-tiny.toml", "--mode", "meta",
                        "--distributed-optimizer", "--bucket-cap-mb", "1", "--json", *flags])
    assert rc == 0, err
    return [rank["optimizer_bytes"] for rank in json.loads(out)["ranks"]]


def test_optimizer_state_is_ten_bytes_a_parameter():
    # master 2 + m 4 + v 4 against 4 + 4 + 4, every state tensor of the same shard
    plain, kept = _optimizer_bytes(), _optimizer_bytes("--store-param-remainders")
    assert plain and all(p > 0 for p in plain)
    assert [k * 12 for k in kept] == [p * 10 for p in plain]


@pytest.mark.parametrize("flags, reason", [
    ([], "needs bucket_cap_mb (Apex DistributedFusedAdam) or use_precision_aware_optimizer"),
    (["--distributed-optimizer", "--bucket-cap-mb", "1", "--use-precision-aware-optimizer",
      "--main-params-dtype", "fp16"], "keeps the remainders of fp32 master weights, not fp16")])
def test_bad_combinations_are_one_error_line(flags, reason):
    rc, out, err = cli(["run", "scenarios/llama-tiny.toml", "--mode", "meta",
                        "--store-param-remainders", *flags])
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1
    assert lines[0].startswith(f"error: parallel.store_param_remainders: {reason}")


def test_every_nemo_row_keeps_remainders():
    # NeMo megatron_base_model.py setup_optimization (r2.0.0rc1): an fp32 optimizer (optim.dtype
    # unset) over BF16 weights (trainer.precision bf16 with megatron_amp_O2 on every row's
    # config) gets store_params False, store_param_remainders True
    with open(data_path(BUNDLED), "rb") as f:
        scenarios = tomllib.load(f)["scenarios"]
    nemo = [name for name in scenarios if name.startswith("nemo-")]
    assert len(nemo) == 9
    assert all(scenarios[name]["parallel"].get("store_param_remainders") for name in nemo)
