"""The spans `--trace full` adds to the default trace, counted before the run for its memory
estimate (simsp/scenario/work.py meta_bytes): one layer of the scenario run forward and
backward on one TP group (layer_sim.py simulate_layer), its rank 0's spans on the detail
tracks (engine/trace.py DETAIL_TRACKS) counted as the run would keep them per layer-step; a
model mixing dense and MoE layers (--moe-layer-freq) has one layer of each kind run, its counts
weighted by the layers of that kind."""

from collections import Counter

from simsp.engine.trace import DETAIL_TRACKS
from simsp.scenario.loading import with_overrides
from simsp.scenario.work import DetailSpans
from simsp.training.driver.layer_sim import simulate_layer

# the most ranks a MoE layer's expert grid may hold to be run whole for the count (each rank's
# own experts' kernels, its dispatch's): DeepSeek-V3's 64 took 2.2 CPU s (6.5 with DeepEP),
# Mixtral's 16 0.02; a larger grid's layer runs on one TP group, its experts all local (7% fewer
# spans a MoE layer-step at DeepSeek-V3: no dispatch kernels)
MAX_GRID_RANKS = 16
# the sequence-parallel gradients' all-reduces (training/data_parallel/finalize.py), once per
# layer and iteration, not per micro-batch: their spans' names hold this
SP_GRAD_MARK = " sp_grad "


def detail_spans(sc, trace: str) -> DetailSpans | None:
    """The detail spans of a layer on one rank (None unless `trace` is "full" in meta mode,
    the mode whose memory is estimated so; numeric mode's arrays dwarf them), the mean over
    the model's layers: every kernel and TP collective of a layer-step, untemplated (the
    forward's again where it is recomputed, as layer_backward runs it); a templated step's
    merged spans, one per detail track of its replayed forward and of its backward
    (model/replay.py _merge_by_track); the sequence-parallel gradients' all-reduces of the
    layer."""
    if trace != "full" or sc.run.mode != "meta":
        return None
    m = sc.model
    kinds = Counter(map(m.is_moe_layer, range(m.num_layers))) if m.num_experts else {None: 1}
    if len(kinds) == 1:
        return _layer_spans(sc)
    per_kind = [(layers, _layer_spans(with_overrides(sc, model={
        "moe_layer_freq": f"([{int(moe)}]*{m.num_layers})"}))) for moe, layers in kinds.items()]
    return DetailSpans(*(sum(layers * spans[i] for layers, spans in per_kind) / m.num_layers
                         for i in range(len(DetailSpans._fields))))


def _layer_spans(sc) -> DetailSpans:
    """The detail spans of the scenario's layer 0 (DetailSpans, per layer-step and layer), a
    MoE layer on its expert grid where it holds at most MAX_GRID_RANKS ranks."""
    p = sc.parallel
    grid = sc.model.num_experts is not None and p.tp * p.cp * p.dp <= MAX_GRID_RANKS
    layer = simulate_layer(sc, keep_experts=grid)
    rank = layer.ranks[0].rank
    spans = [s for s in layer.ranks[0].trace.spans if s.rank == rank and s.track in DETAIL_TRACKS]
    once = [s for s in spans if SP_GRAD_MARK in f" {s.name} "]
    steps = [s for s in spans if s not in once]
    forward = [s for s in steps if s.args.get("phase") == "forward"]
    merged = (len({s.track for s in forward})
              + len({s.track for s in steps if s.args.get("phase") != "forward"}))
    return DetailSpans(len(steps), merged, len(once))
