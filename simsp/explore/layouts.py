"""Every Megatron-LM layout of a model on N GPUs: t, p, d = N/(t·p), micro-batch size, the
schedule (1F1B, or interleaved with each possible number of model chunks), SP, recompute and the
distributed optimizer. Layouts the config checks reject are counted, not returned."""

import math

from simsp.config import load_scenario
from simsp.errors import UserError
from simsp.explore.configs import Config


def divisors(n: int) -> list[int]:
    """Positive divisors of n, ascending (pairs k, n/k up to sqrt(n): O(sqrt n) steps)."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in reversed(small) if k * k != n]


def _schedules(layers_per_stage: int, p: int, micro_batches: int) -> list[int | None]:
    """None for 1F1B, else num_layers_per_virtual_pipeline_stage for 2 or more chunks."""
    options = [None]
    if p > 1 and micro_batches % p == 0:
        options += [k for k in divisors(layers_per_stage) if layers_per_stage // k >= 2]
    return options


def _parallel_options(t: int, p: int, d: int, b: int, virtual: int | None) -> list[dict]:
    """SP x recompute x distributed optimizer for one (t, p, d, b, schedule)."""
    options = []
    for sp in ((False, True) if t > 1 else (False,)):
        for recompute in ("none", "selective", "full"):
            for dist_opt in ((False, True) if d > 1 else (False,)):
                options.append({"tensor_model_parallel_size": t, "pipeline_model_parallel_size": p,
                                "data_parallel_size": d, "micro_batch_size": b,
                                "num_layers_per_virtual_pipeline_stage": virtual,
                                "schedule": None, "sequence_parallel": sp,
                                "recompute_granularity": recompute,
                                "distributed_optimizer": dist_opt})
    return options


def layout_label(parallel: dict, layers: int) -> str:
    """Short name: `t8 p8 d1 b1 v3 sp selective dopt`."""
    t, p = parallel["tensor_model_parallel_size"], parallel["pipeline_model_parallel_size"]
    parts = [f"t{t}", f"p{p}", f"d{parallel['data_parallel_size']}",
             f"b{parallel['micro_batch_size']}"]
    if parallel["num_layers_per_virtual_pipeline_stage"]:
        parts.append(f"v{layers // p // parallel['num_layers_per_virtual_pipeline_stage']}")
    parts.append("sp" if parallel["sequence_parallel"] else "nosp")
    parts.append(parallel["recompute_granularity"])
    if parallel["distributed_optimizer"]:
        parts.append("dopt")
    return " ".join(parts)


def raw_layouts(gpus: int, batch: int, layers: int, max_tp: int) -> list[dict]:
    """Every (t, p, d, b, schedule, SP, recompute, dist-opt) with t·p·d = gpus, before checks."""
    found = []
    for t in divisors(min(gpus, max_tp)):
        for p in (p for p in divisors(gpus // t) if gpus % (t * p) == 0 and layers % p == 0):
            d = gpus // (t * p)
            if gpus % t or batch % d:
                continue
            for b in divisors(batch // d):
                for virtual in _schedules(layers // p, p, batch // (b * d)):
                    found += _parallel_options(t, p, d, b, virtual)
    return found


def enumerate_layouts(base: dict, gpus: int, batch: int) -> tuple[list[Config], int]:
    """(valid layouts as Configs, how many the config checks rejected) for `gpus` GPUs."""
    layers, per_node = base[("model", "num_layers")], base[("cluster", "gpus_per_node")]
    configs, invalid = [], 0
    for parallel in raw_layouts(gpus, batch, layers, max_tp=per_node):
        values = dict(base)
        values.update({("parallel", k): v for k, v in parallel.items()})
        values[("parallel", "global_batch_size")] = batch
        values[("cluster", "nodes")] = math.ceil(gpus / per_node)
        try:
            load_scenario(None, values)
        except UserError:
            invalid += 1
            continue
        configs.append(Config(layout_label(parallel, layers), tuple(values.items())))
    return configs, invalid
