"""The spans `--trace full` adds to the default trace, counted before the run for its memory
estimate (simsp/scenario/work.py meta_bytes): one layer of the scenario run forward and
backward on one TP group (layer_sim.py simulate_layer), its rank 0's spans on the detail
tracks (engine/trace.py DETAIL_TRACKS) counted as the run would keep them per layer-step."""

from simsp.engine.trace import DETAIL_TRACKS
from simsp.scenario.work import DetailSpans
from simsp.training.driver.layer_sim import simulate_layer

# the sequence-parallel gradients' all-reduces (training/data_parallel/finalize.py), once per
# layer and iteration, not per micro-batch: their spans' names hold this
SP_GRAD_MARK = " sp_grad "


def detail_spans(sc, trace: str) -> DetailSpans | None:
    """The detail spans of one layer on one rank (None unless `trace` is "full" in meta mode,
    the mode whose memory is estimated so; numeric mode's arrays dwarf them): every kernel
    and TP collective of a layer-step, untemplated (the forward's again where it is
    recomputed, as layer_backward runs it); a templated step's merged spans, one per detail
    track of its replayed forward and of its backward (model/replay.py _merge_by_track); the
    sequence-parallel gradients' all-reduces of the layer."""
    if trace != "full" or sc.run.mode != "meta":
        return None
    layer = simulate_layer(sc)
    rank = layer.ranks[0].rank
    spans = [s for s in layer.ranks[0].trace.spans if s.rank == rank and s.track in DETAIL_TRACKS]
    once = [s for s in spans if SP_GRAD_MARK in f" {s.name} "]
    steps = [s for s in spans if s not in once]
    forward = [s for s in steps if s.args.get("phase") == "forward"]
    merged = (len({s.track for s in forward})
              + len({s.track for s in steps if s.args.get("phase") != "forward"}))
    return DetailSpans(len(steps), merged, len(once))
