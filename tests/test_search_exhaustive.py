"""Search against brute force: every layout of eight small models simulated, the bounds checked
on each, and the search's top K (branch and bound, memory screen) equal to the exhaustive top K.

The models cover what made the old screens unsound: block recompute (a chunk rebuilds only its
first N layers), uniform groups, 16-bit gradient reduction with overlap, interleaving with few
micro-batches, a model large enough that the memory screen rules layouts out, and the newer
dimensions: a MoE model with dense and MoE layers (EP, dispatcher and grouped GEMM varied),
context parallelism varied over 1 and 2 and two of its communication types, two Megatron-FSDP
strategies, and activation offload (3 of 4 layers' saved tensors on the host)."""

import pytest

from simsp.explore.evaluation.cache import ResultCache
from simsp.explore.configs.grid import base_values
from simsp.explore.evaluation.evaluate import evaluate
from simsp.explore.evaluation.executor import Executor
from simsp.explore.configs.fields import by_key
from simsp.explore.search.layouts import enumerate_layouts, search_base
from simsp.explore.search.bounds import (memory_lower_bound, memory_verdict, scenario_of,
                                         time_lower_bound)
from simsp.explore.search.branch_and_bound import search
from simsp.units import GiB

SMALL = {"mode": "meta", "num_layers": 8, "hidden_size": 256, "num_attention_heads": 8,
         "seq_length": 128, "vocab_size": 512}
TWO = {**SMALL, "num_layers": 2}
MOE = {**TWO, "num_experts": 4, "moe_router_topk": 2, "add_bias_linear": False,
       "moe_layer_freq": 2}  # layer 0 MoE, layer 1 dense
FEW = {"recompute_granularity": ["none", "full"]}  # restrictions that keep the tests short
NONE = {"recompute_granularity": ["none"]}
# The split-backward schedules' bounds have their own property test (test_search_schedules.py);
# the recompute-soundness models below keep to 1F1B and interleaving to stay short.
MEGATRON = {"schedule": ["1f1b", "interleaved"]}
MODELS = {  # name: (model fields, held [parallel] fields, GPUs, global batch, memory reserve GiB,
    #                restricted layout fields)
    "block recompute": (SMALL, {"recompute_method": "block", "recompute_num_layers": 1}, 4, 4, 4),
    "fp16 gradients, overlapped": (
        {**SMALL, "num_layers": 4},
        {"accumulate_allreduce_grads_in_fp32": False, "overlap_grad_reduce": True}, 4, 8, 4,
        MEGATRON),
    "uniform groups of 2": (SMALL, {"recompute_num_layers": 2}, 4, 8, 0, MEGATRON),
    "memory-bound 8 x 8192": ({"mode": "meta", "num_layers": 8, "hidden_size": 8192,
                               "num_attention_heads": 64, "seq_length": 256,
                               "vocab_size": 1024}, {}, 4, 4, 4, MEGATRON),
    "MoE, dense and MoE layers": (MOE, {}, 4, 4, 0, {**FEW, "micro_batch_size": [1]}),
    "context parallel 1 or 2, p2p or a2a": (
        {**TWO, "seq_length": 512, "attention_backend": "flash"},
        {"context_parallel_size": (1, 2), "cp_comm_type": ("p2p", "a2a")}, 4, 4, 0, NONE),
    "Megatron-FSDP, two strategies": (
        TWO, {"use_megatron_fsdp": True,
              "data_parallel_sharding_strategy": ("optim", "optim_grads_params")}, 4, 4, 0, NONE),
    "activation offload": ({**SMALL, "num_layers": 4},
                           {"cpu_offloading": True, "cpu_offloading_num_layers": 3}, 4, 4, 0,
                           {**NONE, "pipeline_model_parallel_size": [1]}),
}
TOP = 3


def base_of(model: dict) -> dict:
    values = base_values(None)
    table = by_key()
    for key, value in model.items():
        values[table[key].path] = value
    return search_base(values)


def fits(row: dict, reserve_gib: float) -> bool:
    """The test's own reading of "fits": simulated, no OOM, peak within capacity − reserve."""
    return row["status"] == "ok" and row["peak_bytes_max"] <= row["capacity_bytes"] - reserve_gib * GiB


@pytest.fixture(scope="module", params=sorted(MODELS))
def exhaustive(request, tmp_path_factory):
    """(name, base, every layout with its simulated row, a cache holding those rows)."""
    model, fixed, gpus, batch, reserve, *allowed = MODELS[request.param]
    base = base_of(model)
    layouts = enumerate_layouts(base, gpus, batch, fixed, allowed=(allowed or [None])[0])
    cache = ResultCache(tmp_path_factory.mktemp("cache"))
    rows = []
    for config in layouts.configs:
        row = evaluate(config.values)
        cache.put(config.digest(), row)
        rows.append((config, row))
    return request.param, base, rows, cache


def test_bounds_hold_for_every_layout(exhaustive):
    name, _, rows, _ = exhaustive
    reserve = MODELS[name][4]
    for config, row in rows:
        sc = scenario_of(config)
        assert row["status"] in ("ok", "oom"), (config.name, row.get("error"))
        assert time_lower_bound(sc) <= row["iteration_time_s"], config.name
        assert memory_lower_bound(sc) <= row["peak_bytes_stage0"], config.name
        if memory_verdict(sc, reserve * GiB):
            assert not fits(row, reserve), config.name


@pytest.mark.parametrize("objective", ["time", "mfu"])
def test_search_top_k_equals_the_exhaustive_top_k(exhaustive, objective):
    name, base, rows, cache = exhaustive
    _, fixed, gpus, batch, reserve, *allowed = MODELS[name]
    key = (lambda row: row["iteration_time_s"]) if objective == "time" else (lambda row: -row["mfu"])
    truth = sorted((key(row), config.name) for config, row in rows if fits(row, reserve))[:TOP]
    with Executor(workers=0) as executor:
        found = search(base, gpus, batch, executor, cache, top=TOP, objective=objective,
                       reserve=reserve * GiB, fixed=fixed, allowed=(allowed or [None])[0])
    best = sorted((key(row), row["variant"]) for row in found.rows if row["fits"])[:TOP]
    assert len(truth) == TOP and best == truth
    assert found.violations == []
    assert found.pruned_bound + found.pruned_memory > 0  # the screens did work
    assert len(found.rows) + found.pruned_bound + found.pruned_memory == len(rows)
