"""GPUs as an axis of a sweep: d derived from the world size as Megatron derives it
(d = world / (t·cp·p), megatron/core/parallel_state.py initialize_model_parallel), the nodes
from the world size, and one sentence saying what that did to d and the batch.

A world size comes from `--world-size` (a comma list), a sweep-file variant's `world_size`, or
`nodes` set without d or a world size: Megatron's world is every launched GPU, so more nodes
means a larger d, never idle GPUs. When t, p or cp change and none of d, the nodes or a world
size is given, the GPUs are kept (the scenario's t·cp·p·d) and d derived from them; a row
whose t·cp·p does not divide them keeps d instead, and its note says so and how many GPUs
it then has."""

import math

WORLD_SIZE = ("parallel", "world_size")  # a sweep variant's key; never a scenario field
D, NODES = ("parallel", "data_parallel_size"), ("cluster", "nodes")
T, P = ("parallel", "tensor_model_parallel_size"), ("parallel", "pipeline_model_parallel_size")
CP = ("parallel", "context_parallel_size")
GPN, B, MB = ("cluster", "gpus_per_node"), ("parallel", "global_batch_size"), \
    ("parallel", "micro_batch_size")


def world_of(values: dict) -> int | None:
    """A configuration's GPUs, t·cp·p·d (None when one of them is not a positive integer)."""
    sizes = [values[T], values.get(CP) or 1, values[P], values[D]]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes):
        return None
    return sizes[0] * sizes[1] * sizes[2] * sizes[3]


def _world_from(merged: dict, world: int | None, given: set,
                kept: int | None) -> tuple[int | None, bool]:
    """(the world size to derive d from, or None to keep the configuration's own d; whether
    it is the scenario's GPUs `kept` because t, p or cp changed)."""
    if world is not None:
        return world, False
    if merged.get(WORLD_SIZE) is not None:
        return merged[WORLD_SIZE], False
    if D in given:
        return None, False
    if NODES in given:
        return merged[NODES] * merged[GPN], False
    if given & {T, P, CP} and kept is not None:
        return kept, True
    return None, False


def _batch_text(merged: dict, base: dict, d: int, given: set) -> str:
    """What the global batch did: kept (with micro-batches per pipeline) or b·d."""
    b = merged[MB]
    if merged[B] is None:
        return f"global batch not set: b·d = {b * d} samples"
    before = merged[B] / (b * base[D])  # the same batch on the configuration's own d
    kept = "as given" if B in given or merged[B] != base[B] else "kept"
    after = merged[B] / (b * d)
    return (f"global batch {merged[B]} {kept} ({before:g} → {after:g} micro-batches per "
            "pipeline)")


def derive_world(merged: dict, base: dict, world: int | None, given: set,
                 kept: int | None = None):
    """(values with d and nodes derived, an `error:` text or None, a note saying what changed);
    `kept`: the scenario's GPUs, kept when t, p or cp are given without d, nodes or a world."""
    merged = dict(merged)
    chosen, keeping = _world_from(merged, world, given, kept)
    merged.pop(WORLD_SIZE, None)
    if chosen is None:
        return merged, None, ""
    t, p, cp = merged[T], merged[P], merged.get(CP) or 1
    if not all(isinstance(v, int) and v > 0 for v in (t, p, cp, chosen)):
        return merged, f"error: --world-size: must be a positive integer, got {chosen}", ""
    model = t * cp * p  # GPUs of one data-parallel replica
    names, factors = ("tensor*context*pipeline", f"{t}*{cp}*{p}") if cp > 1 else \
        ("tensor*pipeline", f"{t}*{p}")
    if chosen % model and keeping:  # d cannot be derived: kept, and the row says so
        return merged, None, (f"{_changed(given)}: {names} = {factors} = {model} does not "
                              f"divide the scenario's {chosen} GPUs: d kept at {merged[D]} "
                              f"({model * merged[D]} GPUs)")
    if chosen % model:
        return merged, (f"error: --world-size: {chosen} is not divisible by {names} = "
                        f"{factors} = {model}"), ""
    d = chosen // model
    merged[D] = d
    if NODES not in given and not keeping:
        merged[NODES] = math.ceil(chosen / merged[GPN])
    axes = "t·cp·p" if cp > 1 else "t·p"
    if keeping and d == base[D]:
        return merged, None, ""
    note = (f"{chosen} GPUs on {merged[NODES]} node(s): d = {chosen}/({axes} = {model}) = {d} "
            f"(was {base[D]}); {_batch_text(merged, base, d, given)}")
    return merged, None, note


def _changed(given: set) -> str:
    """The layout fields whose change kept the GPUs, as flags (--tensor-model-parallel-size)."""
    flags = {T: "--tensor-model-parallel-size", P: "--pipeline-model-parallel-size",
             CP: "--context-parallel-size"}
    return ", ".join(flag for path, flag in flags.items() if path in given)
