"""Forward and backward of one recompute segment (training/plan.py `Segment`) on one rank.

A checkpointed segment of N layers keeps only its input; its backward first re-runs the forward
of all N layers (phase "recompute"), keeping their activations, then runs their backwards: the
scheme of Megatron-LM's `tensor_parallel.checkpoint` around `custom(l, l + N)` in
`TransformerBlock._checkpointed_forward`. The last layer of the group recomputes itself inside
`layer_backward` (spec "full"), so a group of one is exactly the per-layer full recompute.
"""

from simsp.model.layer import LayerSpec, layer_forward
from simsp.model.layer_backward import layer_backward


def _plain_granularity(sc) -> str:
    """Granularity of layers outside checkpointed segments: none under full recompute."""
    g = sc.parallel.recompute_granularity
    return "none" if g == "full" else g


def _enter(r, run, state, i: int, mb: int, offset: int, granularity: str):
    """Set the scope of layer i and return its spec, weights and gradients."""
    r.scope = f"mb{mb}.L{i}."
    w, g = state.layer(i)
    return LayerSpec(run.sc.model, i, granularity, offset), w, g


def segment_forward(r, run, state, seg, x, mb: int, offset: int):
    """x (s_l, b, h) through the segment's layers -> (output, what backward needs)."""
    if not seg.checkpointed:
        spec, w, _ = _enter(r, run, state, seg.layers[0], mb, offset, _plain_granularity(run.sc))
        return (yield from run.layers.run(r, ("F", False), x,
                                          lambda: layer_forward(r, spec, w, x)))
    _enter(r, run, state, seg.layers[0], mb, offset, "full")
    first = r.save(x, "layer_input")
    for i in seg.layers:
        spec, w, _ = _enter(r, run, state, i, mb, offset, "full")
        out, _ = yield from run.layers.run(r, ("F", True), x,
                                           lambda: layer_forward(r, spec, w, x, keep=False))
        if x is not first:
            r.free(x)  # an inner layer's input: rebuilt in backward, not kept
        x = out
    return x, {"layer_input": first}


def _recompute(r, run, state, layers: tuple, x, mb: int, offset: int):
    """Re-run `layers` forward from x, keeping activations; returns their stashes and output."""
    phase, r.phase = r.phase, "recompute"
    stashes = []
    for i in layers:
        spec, w, _ = _enter(r, run, state, i, mb, offset, "none")
        x, saved = yield from run.layers.run(r, ("R",), x,
                                             lambda: layer_forward(r, spec, w, x, keep=True))
        stashes.append(saved)
    r.phase = phase
    return stashes, x


def segment_backward(r, run, state, seg, saved: dict, dx, mb: int, offset: int):
    """dx (s_l, b, h) at the segment's output -> at its input; frees what the forward kept."""
    if not seg.checkpointed:
        spec, w, g = _enter(r, run, state, seg.layers[0], mb, offset, _plain_granularity(run.sc))
        return (yield from run.layers.run(r, ("B", False), dx,
                                          lambda: layer_backward(r, spec, w, g, saved, dx)))
    stashes, last_input = yield from _recompute(r, run, state, seg.layers[:-1],
                                                saved["layer_input"], mb, offset)
    spec, w, g = _enter(r, run, state, seg.layers[-1], mb, offset, "full")
    if last_input is not saved["layer_input"]:
        r.save(last_input, "layer_input")  # in the last layer's scope, as a group of one has it
    last = {"layer_input": last_input}
    dx = yield from run.layers.run(r, ("B", True), dx,
                                   lambda: layer_backward(r, spec, w, g, last, dx))
    for i, stash in zip(reversed(seg.layers[:-1]), reversed(stashes)):
        spec, w, g = _enter(r, run, state, i, mb, offset, "none")
        dx = yield from run.layers.run(r, ("B", False), dx,
                                       lambda: layer_backward(r, spec, w, g, stash, dx))
    return dx
