"""Forward and backward of one recompute segment (training/pipeline/plan.py `Segment`) on one rank.

A checkpointed segment of N layers keeps only its input; its backward first re-runs the forward
of all N layers (phase "recompute"), keeping their activations, then runs their backwards: the
scheme of Megatron-LM's `tensor_parallel.checkpoint` around `custom(l, l + N)` in
`TransformerBlock._checkpointed_forward`. The last layer of the group recomputes itself inside
`layer_backward` (spec "full"), so a group of one is exactly the per-layer full recompute.
"""

from simsp.cluster.topology import placement
from simsp.hardware.cluster_hardware import fabric_of
from simsp.model.layer import LayerSpec, layer_backward, layer_forward
from simsp.training.data_parallel.grad_scaling import loss_gradient_factor


PLAIN = None  # a layer outside checkpointed segments: its granularity worked out if it runs


def _plain_granularity(sc) -> str:
    """Granularity of layers outside checkpointed segments: none under full recompute."""
    g = sc.parallel.recompute_granularity
    return "none" if g == "full" else g


def layer_scope(mb: int, i: int) -> str:
    """The ledger key scope of layer i in micro-batch mb."""
    return f"mb{mb}.L{i}."


def _enter(r, i: int, mb: int) -> None:
    """Enter layer i's key scope."""
    r.scope = layer_scope(mb, i)


def _layer(sc, state, i: int, offset: int, granularity: str):
    """Layer i's spec, weights and gradients (built only when the layer really runs: a
    replayed template needs none of them). PLAIN: the granularity of plain layers."""
    if granularity is PLAIN:
        granularity = _plain_granularity(sc)
    w, g = state.layer(i)
    modules = sc.parallel.recompute_module_set or LayerSpec.modules
    p = sc.parallel
    aux_scale = p.micro_batch_size / p.global_batch if sc.model.num_experts else 1.0
    return LayerSpec(sc.model, i, granularity, offset, modules, aux_scale,
                     loss_gradient_factor(p)), w, g


def _forward(r, inputs, state, i: int, x, offset: int, granularity: str, kind: tuple,
             keep: bool = True):
    """Layer i forward from x, run or replayed (inputs.layers): a generator returning
    (output, stash)."""
    def body():
        spec, w, _ = _layer(inputs.sc, state, i, offset, granularity)
        return layer_forward(r, spec, w, x, keep=keep)
    return inputs.layers.run(r, _kind(inputs.sc, r, i, kind), x, body)


def _backward(r, inputs, state, i: int, saved: dict, dx, offset: int, granularity: str,
              kind: tuple):
    """Layer i backward from dx, run or replayed (inputs.layers): a generator returning the
    input gradient."""
    def body():
        spec, w, g = _layer(inputs.sc, state, i, offset, granularity)
        return layer_backward(r, spec, w, g, saved, dx)
    return inputs.layers.run(r, _kind(inputs.sc, r, i, kind), dx, body)


def _kind(sc, r, i: int, kind: tuple) -> tuple:
    """A layer template's kind; MoE models tell their MoE and dense layers apart, and MoE
    layers whose all-to-alls cross differently placed links (e.g. an EP group split over two
    scalable units: its cross-unit pairs go through the spine)."""
    m = sc.model
    if m.num_experts is None:
        return kind
    if not m.is_moe_layer(i) or r.moe is None or r.moe.ep == 1:
        return kind + (m.is_moe_layer(i),)
    cluster = sc.cluster
    return kind + (True, placement(r.moe.tp_ep_group, cluster.gpus_per_node, cluster.nodes,
                                     fabric_of(cluster)))


def segment_forward(r, inputs, state, seg, x, mb: int, offset: int):
    """x (s_l, b, h) through the segment's layers -> (output, what backward needs); a
    generator (a plain layer's is the layer's own, one generator level less per event)."""
    if not seg.checkpointed:
        r.scope = layer_scope(mb, seg.layers[0])
        return _forward(r, inputs, state, seg.layers[0], x, offset, PLAIN, ("F", False))
    return _checkpointed_forward(r, inputs, state, seg, x, mb, offset)


def _checkpointed_forward(r, inputs, state, seg, x, mb: int, offset: int):
    """A checkpointed segment keeps only its input; inner layers' inputs are freed."""
    _enter(r, seg.layers[0], mb)
    first = r.save(x, "layer_input")
    for i in seg.layers:
        _enter(r, i, mb)
        out, _ = yield from _forward(r, inputs, state, i, x, offset, "full", ("F", True),
                                     keep=False)
        if x is not first:
            r.free(x)  # an inner layer's input: rebuilt in backward, not kept
        x = out
    return x, {"layer_input": first}


def _recompute(r, inputs, state, layers: tuple, x, mb: int, offset: int):
    """Re-run `layers` forward from x, keeping activations; returns their stashes and output."""
    phase, r.phase = r.phase, "recompute"
    stashes = []
    for i in layers:
        _enter(r, i, mb)
        x, saved = yield from _forward(r, inputs, state, i, x, offset, "none", ("R",))
        stashes.append(saved)
    r.phase = phase
    return stashes, x


def segment_backward(r, inputs, state, seg, saved: dict, dx, mb: int, offset: int):
    """dx (s_l, b, h) at the segment's output -> at its input; frees what the forward kept
    (a generator, as segment_forward)."""
    if not seg.checkpointed:
        r.scope = layer_scope(mb, seg.layers[0])
        return _backward(r, inputs, state, seg.layers[0], saved, dx, offset, PLAIN, ("B", False))
    return _checkpointed_backward(r, inputs, state, seg, saved, dx, mb, offset)


def _checkpointed_backward(r, inputs, state, seg, saved: dict, dx, mb: int, offset: int):
    """Recompute the segment's inner layers, then run every layer's backward, last first."""
    stashes, last_input = yield from _recompute(r, inputs, state, seg.layers[:-1],
                                                saved["layer_input"], mb, offset)
    _enter(r, seg.layers[-1], mb)
    if last_input is not saved["layer_input"]:
        r.save(last_input, "layer_input")  # in the last layer's scope, as a group of one has it
    last = {"layer_input": last_input}
    dx = yield from _backward(r, inputs, state, seg.layers[-1], last, dx, offset, "full",
                              ("B", True))
    for i, stash in zip(reversed(seg.layers[:-1]), reversed(stashes)):
        _enter(r, i, mb)
        dx = yield from _backward(r, inputs, state, i, stash, dx, offset, "none", ("B", False))
    return dx
