"""A model chunk's layers within one schedule step, segment after segment (training/pipeline/plan.py).

When every layer of the chunk is a plain (not checkpointed) layer whose step is a replayed
template, and nothing can happen between two of them on this rank (no parameter all-gather to
wait for, no gradient bucket to launch), they are replayed as one chain: the same ledger
records at the same times and the same results, one simulation event instead of one per layer.
"""

from simsp.training.pipeline import delay_wgrad
from simsp.training.pipeline.plan import recompute_segments
from simsp.training.pipeline.recompute import layer_scope, segment_backward, segment_forward

FORWARD, BACKWARD = ("F", False), ("B", False)  # layer template kinds of plain layers


def chunk_forward(r, inputs, plan, state, chunk: int, x, mb: int, offset: int, stash: dict):
    """x (s_l, b, h) through the chunk's layers; each segment's saved tensors go to stash."""
    segments = _segments(inputs.sc, plan, state, chunk)
    if _chained(inputs.layers, state, segments, FORWARD, mb):
        results = yield from inputs.layers.replay_chain(r, FORWARD, x, _scopes(segments, mb))
        stash["layers"] += [saved for _out, saved in results]
        return results[-1][0]
    for segment in segments:
        yield from state.ddp_buckets.params_needed(r, chunk, segment.layers)
        x, saved = yield from segment_forward(r, inputs, state, segment, x, mb, offset)
        stash["layers"].append(saved)
        if state.fsdp is not None:
            state.fsdp.after_forward(r, segment.layers)
        if state.offload is not None:  # activation offload (training/pipeline/offload.py)
            yield from state.offload.after_forward(r, mb, segment.layers[0], saved)
    return x


def chunk_backward(r, inputs, plan, state, chunk: int, dx, mb: int, offset: int, stash: dict):
    """dx (s_l, b, h) at the chunk's output back to its input, last segment first."""
    segments = _segments(inputs.sc, plan, state, chunk)
    if _chained(inputs.layers, state, segments, BACKWARD, mb):
        results = yield from inputs.layers.replay_chain(r, BACKWARD, dx,
                                                        _scopes(segments[::-1], mb))
        return results[-1]
    for n, (segment, saved) in enumerate(zip(reversed(segments), reversed(stash["layers"]))):
        if state.fsdp is not None:
            yield from state.fsdp.before_backward(r, chunk, segment.layers)
        if state.offload is not None:
            yield from state.offload.before_backward(r, mb, segment.layers[0])
        dx = yield from segment_backward(r, inputs, state, segment, saved, dx, mb, offset)
        r.phase = "backward"
        if state.delayed is not None:  # complete once their weight gradients ran
            yield from delay_wgrad.after_layers(r, state, segment.layers[::-1],
                                                _all_to_all(inputs.sc, segment),
                                                n == len(segments) - 1)
        elif not state.split_backward:  # else the W step says when (training/pipeline/steps.py)
            yield from state.ddp_buckets.grads_ready(r, plan, chunk, mb, segment.layers[::-1])
    return dx


def _all_to_all(sc, segment) -> bool:
    """Whether the segment's backward runs expert all-to-alls (a MoE layer under EP)."""
    return sc.parallel.ep > 1 and any(sc.model.is_moe_layer(i) for i in segment.layers)


def _segments(sc, plan, state, chunk: int) -> tuple:
    """The chunk's recompute segments (training/pipeline/plan.py), kept in the rank's state."""
    segments = state.segments.get(chunk)
    if segments is None:
        segments = state.segments[chunk] = recompute_segments(sc, plan.layers(chunk))
    return segments


def _chained(layers, state, segments: tuple, kind: tuple, mb: int) -> bool:
    """Whether the segments can be replayed as one chain (see the module docstring)."""
    return (len(segments) > 1 and layers.has_template(kind)
            and not any(segment.checkpointed for segment in segments)
            and state.ddp_buckets.quiet(mb) and state.offload is None)


def _scopes(segments, mb: int) -> list[str]:
    """The key scope of each (one-layer) segment's layer."""
    return [layer_scope(mb, segment.layers[0]) for segment in segments]
