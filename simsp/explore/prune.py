"""Closed-form screens for `simsp search`, each a lower bound, so a pruned layout provably loses:

- memory: weights + gradients + optimizer state of stage 0 (18 B per parameter, the 12 B of
  optimizer state split over d with the distributed optimizer; docs/MODEL.md#activation-memory)
  plus K22's
  first-stage activation formula (simsp.analytic). Pruned when above capacity by the margin.
- time: a pipeline can finish no sooner than the last stage's layer work plus the first
  micro-batch's forward and the last one's backward crossing the other p − 1 stages:
  T ≥ (L/p)·(f + b)·(m + (p − 1)/v) (N21 §2.2), f and b one layer's forward and backward time on
  its TP group, simulated alone by simsp.training.layer_sim (TP communication included; no pipeline,
  DP, embedding or head work, so never more than the layer costs in the full iteration).
"""

from functools import lru_cache

from simsp import analytic
from simsp.config import Scenario, load_scenario, with_overrides
from simsp.hardware import GPUS
from simsp.training.layer_sim import simulate_layer

WEIGHT, GRADIENT, OPTIMIZER = 2, 4, 12  # bytes per parameter: fp16, fp32 grad, fp32 master+m+v


def first_stage_parameters(sc: Scenario) -> float:
    """Parameters one rank of stage 0 holds at least: its L/p layers' 12h² /t and the word
    embedding's v·h/t (biases, norms and positions left out: a lower bound)."""
    m, p = sc.model, sc.parallel
    h = m.hidden_size
    per_layer = (4 * h * h + 2 * h * m.ffn) / p.tp
    return m.num_layers / p.pp * per_layer + m.vocab_size * h / p.tp


def static_bytes(sc: Scenario) -> float:
    """Weights, gradients and optimizer state of one stage-0 rank
    (docs/MODEL.md#activation-memory)."""
    p = sc.parallel
    shard = p.dp if p.distributed_optimizer else 1
    return first_stage_parameters(sc) * (WEIGHT + GRADIENT + OPTIMIZER / shard)


def memory_estimate(sc: Scenario) -> float:
    """Stage 0's peak from closed forms: static bytes + K22 first-stage activations."""
    return static_bytes(sc) + analytic.first_stage_activation_bytes(sc)


def memory_verdict(sc: Scenario, margin: float) -> str | None:
    """Why the layout provably does not fit, or None."""
    capacity = GPUS[sc.cluster.gpu].memory_bytes
    estimate = memory_estimate(sc)
    if estimate > capacity * (1 + margin):
        return f"memory: stage 0 needs >= {estimate / 2**30:.1f} GiB (closed form) of {capacity / 2**30:.0f}"
    return None


@lru_cache(maxsize=4096)
def _layer_seconds(sc: Scenario) -> float:
    """Memoised forward + backward seconds of one layer alone."""
    result = simulate_layer(sc)
    return result.forward_time_s + result.backward_time_s


def layer_seconds(sc: Scenario) -> float:
    """One layer's forward + backward on its TP group (depends on t, SP, recompute, b, model)."""
    key = with_overrides(sc, parallel={"pipeline_model_parallel_size": 1, "data_parallel_size": 1,
                                       "global_batch_size": None, "schedule": None,
                                       "num_layers_per_virtual_pipeline_stage": None,
                                       "distributed_optimizer": False}, run={"name": "layer"})
    return _layer_seconds(key)


def time_lower_bound(sc: Scenario) -> float:
    """T ≥ (L/p)·(f + b)·(m + (p − 1)/v) (module docstring)."""
    m, p = sc.model, sc.parallel
    chunks = 1
    if p.schedule_name == "interleaved":
        chunks = m.num_layers // p.pp // p.num_layers_per_virtual_pipeline_stage
    return m.num_layers / p.pp * layer_seconds(sc) * (p.num_micro_batches + (p.pp - 1) / chunks)


def scenario_of(config) -> Scenario:
    """The validated scenario of a Config."""
    return load_scenario(None, config.overrides())
