"""`simsp layer`: one transformer layer, forward then backward, on the t ranks of one TP group
(with context parallelism on its t·cp ranks: one TP group per CP rank, the ring between them)."""

from dataclasses import dataclass, field

import numpy as np

from simsp.scenario.config import Scenario, one_layer_fields
from simsp.scenario.loading import with_overrides
from simsp.engine.group_timing import STEP_BY_STEP, EveryGroup
from simsp.model.context_split import gather_sequence
from simsp.model.layer import LayerSpec, layer_backward, layer_forward
from simsp.model.base.wgrad_store import WeightGradStore
from simsp.model.blocks.moe.placement import etp_split_axis, is_expert_param
from simsp.model.params import init_params, layer_param_names, param_shapes
from simsp.model.reference import reference_layer, relative_error
from simsp.model.tensor import FP16
from simsp.model.weights import allocate_params, gather_grads
from simsp.training.driver.compare import moe_token_rows
from simsp.training.data_parallel.finalize import sync_sequence_parallel_grads
from simsp.training.driver.world import build_world

LAYER = 0
PREFIX = f"layers.{LAYER}."


@dataclass
class RankRecord:
    """What one rank measured: times, activation bytes between passes, saved tensors, outputs."""

    forward_end_s: float = 0.0
    input_grad_end_s: float = 0.0  # the end of B when the backward is split, else of backward
    backward_end_s: float = 0.0
    busy_s: tuple = (0.0, 0.0, 0.0)  # compute-stream seconds (full rate) by those three ends
    activation_bytes: int = 0
    saved: list = field(default_factory=list)  # [(name, bytes)] in the order kept
    out: np.ndarray | None = None  # (s_l, b, h)
    dx: np.ndarray | None = None  # (s_l, b, h)
    grads: dict = field(default_factory=dict)


@dataclass
class LayerResult:
    scenario: Scenario
    ranks: list  # Rank objects, TP order
    records: list  # RankRecord per rank
    max_rel_err: float | None = None

    @property
    def forward_time_s(self) -> float:
        return max(rec.forward_end_s for rec in self.records)

    @property
    def backward_time_s(self) -> float:
        return max(rec.backward_end_s for rec in self.records) - self.forward_time_s

    @property
    def input_grad_time_s(self) -> float:
        """B of a split backward (the whole backward when not split)."""
        return max(rec.input_grad_end_s for rec in self.records) - self.forward_time_s

    @property
    def weight_grad_time_s(self) -> float:
        """W of a split backward: the deferred weight-gradient GEMMs (0 when not split)."""
        return self.forward_time_s + self.backward_time_s - \
            max(rec.input_grad_end_s for rec in self.records)

    @property
    def compute_steps_s(self) -> tuple[float, float, float]:
        """(F, B, W) of compute alone: each the fewest seconds of compute kernels (their
        full-rate times, Rank.busy_s) any rank ran in that step, communication left out."""
        steps = [(f, b - f, w - b) for f, b, w in (rec.busy_s for rec in self.records)]
        return tuple(min(step[i] for step in steps) for i in range(3))


def one_tp_group(sc: Scenario, keep_experts: bool = False) -> Scenario:
    """The scenario cut down to one layer on one TP group (no pipeline, no data parallelism;
    a MoE layer's experts all on the group, their f split over it: with balanced routing its
    rows are the same). With `keep_experts`, the expert layout and the data-parallel size that
    tiles it are kept as given (the layer on every rank of one expert grid). Experts all on
    the group cross no EP link: the flex dispatcher (DeepEP, which needs TP*EP > 1 and ETP 1)
    is then the alltoall one it falls back to for the same rows (docs/deepep.md)."""
    experts = {} if keep_experts else {
        "expert_model_parallel_size": 1, "expert_tensor_parallel_size": None,
        "data_parallel_size": 1, **_without_deepep(sc.parallel)}
    return with_overrides(sc, model=one_layer_fields(sc.model), parallel={
        **experts, "pipeline_model_parallel_size": 1, "global_batch_size": None,
        "num_layers_per_virtual_pipeline_stage": None, "schedule": None,
        "recompute_method": None, "recompute_num_layers": None,  # one layer: its own group
        "decoder_first_pipeline_num_layers": None, "decoder_last_pipeline_num_layers": None,
        "pipeline_model_parallel_layout": None,
        "account_for_embedding_in_pipeline_split": False,
        "account_for_loss_in_pipeline_split": False, "num_virtual_stages_per_pipeline_rank": None,
        "cpu_offloading": False, "cpu_offloading_num_layers": 0,  # a layer alone keeps its own
        "overlap_param_gather_with_optimizer_step": False,
        "overlap_moe_expert_parallel_comm": False,  # one micro-batch: no pair to overlap
        "delay_wgrad_compute": False})


def _without_deepep(p) -> dict:
    """The flex dispatcher swapped for alltoall (the same rows, no two-hop exchange) when the
    experts leave their EP group; other dispatchers unchanged."""
    if p.moe_token_dispatcher_type != "flex":
        return {}
    return {"moe_token_dispatcher_type": "alltoall", "moe_enable_deepep": False}


def _layer_inputs(sc: Scenario):
    """Canonical one-layer parameters, layer input x and output gradient dout, each (s, b, h)."""
    m, b = sc.model, sc.parallel.micro_batch_size
    rng = np.random.default_rng(sc.run.seed + 1)
    shape = (m.seq_length, b, m.hidden_size)
    params = init_params(m, sc.run.seed, np.dtype(sc.run.numeric_dtype))
    return params, rng.normal(size=shape), rng.normal(size=shape)


def _seq_shard(r, full: np.ndarray | None) -> np.ndarray | None:
    """Rank r's sequence slice under SP (of its CP rank's rows), else the whole (s, b, h) array
    (its CP rank's rows (s/cp, b, h))."""
    if full is not None and r.cp is not None:
        full = full[r.cp.positions]  # (s/cp, b, h)
    if full is None or not r.tp.sequence_parallel:
        return full
    return np.array_split(full, r.tp.size, axis=0)[r.tp.index]


def layer_program(r, spec: LayerSpec, b: int, shapes: dict, params, x_full, dout_full,
                  rec: RankRecord, split_backward: bool = False):
    """One rank: allocate its shards, run forward, measure, run backward (+ SP grad sync);
    `split_backward`: B with the weight-gradient GEMMs deferred, then W runs them
    (model/base/wgrad_store.py, as a zero-bubble schedule's steps do)."""
    w, g = allocate_params(r, shapes, params, strip=PREFIX)
    cp = 1 if r.cp is None else r.cp.size
    s_local = spec.model.seq_length // cp // (r.tp.size if r.tp.sequence_parallel else 1)
    shape = (s_local, b, spec.model.hidden_size)
    x = r.alloc(shape, FP16, "layer_input", data=_seq_shard(r, x_full))
    r.phase = "forward"
    marks = [_busy(r)]
    if spec.recompute == "full":
        r.save(x, "layer_input")
        out, _ = yield from layer_forward(r, spec, w, x, keep=False)
        saved = {"layer_input": x}
    else:
        out, saved = yield from layer_forward(r, spec, w, x)
    rec.forward_end_s = r.env.now
    marks.append(_busy(r))
    rec.activation_bytes = r.ledger.live_bytes("activations")
    live = r.ledger.live  # the ledger's bytes: FP8-saved inputs are smaller than t.nbytes
    rec.saved = [(name, live[t.key].nbytes if t.key in live else t.nbytes)
                 for name, t in saved.items()]
    rec.out = out.data
    r.free(out)
    r.phase = "backward"
    dout = r.alloc(shape, FP16, "d_layer_output", data=_seq_shard(r, dout_full))
    store = r.wgrad = WeightGradStore() if split_backward else None
    dx = yield from layer_backward(r, spec, w, g, saved, dout)
    r.wgrad = None
    rec.input_grad_end_s = r.env.now
    marks.append(_busy(r))
    if store is not None:
        yield from store.run(r)
    rec.backward_end_s = r.env.now  # Megatron reduces SP-partial grads once per iteration
    rec.busy_s = tuple(mark - marks[0] for mark in marks[1:] + [_busy(r)])
    yield from sync_sequence_parallel_grads(r, g, PREFIX)
    rec.dx, rec.grads = dx.data, g
    r.free(dx)


def _busy(r) -> float:
    """Seconds of compute kernels rank r has run so far, each at its full-rate time."""
    return sum(r.busy_s.values())


def simulate_layer(sc: Scenario, method: str = STEP_BY_STEP, keep_experts: bool = False,
                   log_kernels: bool = False, split_backward: bool = False) -> LayerResult:
    """Run one layer on every rank of TP group 0 (numeric or meta) and compare numeric results;
    every collective timed by `method` (engine/group_timing.py; RING_ALONE: as a whole);
    `keep_experts`: on the ranks of the scenario's expert grid instead (one_tp_group);
    log_kernels: rank 0 keeps every kernel in its kernel_log; `split_backward`: B then W
    (layer_program)."""
    sc = one_tp_group(sc, keep_experts)
    world = build_world(sc, timing_of=EveryGroup(method))
    numeric = sc.run.mode == "numeric"
    params, x, dout = _layer_inputs(sc) if numeric else (None, None, None)
    shapes = {n: s for n, s in param_shapes(sc.model).items() if n.startswith(PREFIX)}
    spec = LayerSpec(sc.model, LAYER, sc.parallel.recompute_granularity,
                     modules=sc.parallel.recompute_module_set or LayerSpec.modules)
    b = sc.parallel.micro_batch_size
    ranks = [world.ranks[i] for i in sorted(world.ranks)]
    if log_kernels:
        ranks[0].kernel_log = []
    records = [RankRecord() for _ in ranks]
    for r, rec in zip(ranks, records):
        world.env.process(layer_program(r, spec, b, shapes, params, x, dout, rec,
                                        split_backward))
    world.env.run()
    result = LayerResult(sc, ranks, records)
    if numeric:
        result.max_rel_err = _compare_with_reference(sc, result, params, x, dout)
    return result


def _cp_join(parts: list) -> np.ndarray:
    """The CP ranks' rows (s/cp, b, h), in cp-rank order, back in sequence order (s, b, h)."""
    return parts[0] if len(parts) == 1 else gather_sequence(parts, axis=0)


def _compare_with_reference(sc, result: LayerResult, params, x, dout) -> float:
    """Worst relative error of output, input gradient and every weight gradient vs one device."""
    out_ref, dx_ref, grads_ref = reference_layer(params, x, dout, LAYER, sc.model, sc.run.seed,
                                                 moe_chunks=moe_token_rows(sc))
    t, cp = sc.parallel.tp, sc.parallel.cp
    by_cp = [result.records[k * t:(k + 1) * t] for k in range(cp)]  # rank = tp + t·cp
    sp = sc.parallel.sequence_parallel
    join = (lambda parts: np.concatenate(parts, axis=0)) if sp else (lambda parts: parts[0])
    joined = lambda field: _cp_join([join([getattr(rec, field) for rec in group])
                                     for group in by_cp])  # (s, b, h)
    errors = [relative_error(joined("out"), out_ref), relative_error(joined("dx"), dx_ref)]
    names = [n for n in layer_param_names(LAYER) if n in params]
    grads = {}
    for group in by_cp:  # CP ranks' gradients are summed (reduced over dp_cp in training)
        for name, grad in gather_grads([rec.grads for rec in group], names, strip=PREFIX).items():
            grads[name] = grad if name not in grads else grads[name] + grad
    for n in filter(is_expert_param, names):  # f split over each TP group (ETP = t), CP summed
        parts = [np.concatenate([rec.grads[n.removeprefix(PREFIX)].data for rec in group],
                                axis=etp_split_axis(n)) for group in by_cp]
        grads[n] = sum(parts[1:], parts[0])
    errors += [relative_error(grads[n], grads_ref[n.removeprefix(PREFIX)]) for n in names]
    return max(errors)
