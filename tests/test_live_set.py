"""The live-tensor set (engine/memory/live_set.py), which applies a block's changes in bulk, against a
plain {key: LiveTensor} dict that applies them one key at a time."""

from hypothesis import given, settings, strategies as st
import pytest

from simsp.engine.memory.live_set import LiveSet
from simsp.engine.memory.op_block import INPUT, OpBlock, resolve
from simsp.engine.memory.summary import LiveTensor

CATS = ("weights", "gradients", "optimizer", "activations", "temporaries", "communication")
# A forward-like step: frees its input, keeps a, b and its output o.
FORWARD = OpBlock(((0.0, 8, "a", "activations", "f"), (0.0, 4, "t", "temporaries", "f"),
                   (1e-3, -4, "t", "temporaries", "free"), (1e-3, 2, "b", "activations", "g"),
                   (2e-3, 16, "o", "activations", "g"), (2e-3, -16, INPUT, "activations", "x")),
                  CATS)
# The matching backward: frees a and b, leaves its input gradient d.
BACKWARD = OpBlock(((0.0, -8, "a", "activations", "free"), (0.0, -2, "b", "activations", "free"),
                    (1e-3, 16, "d", "activations", "h")), CATS)
# A partial one: frees only a.
PARTIAL = OpBlock(((0.0, -8, "a", "activations", "free"),), CATS)
# Relative keys with a "." cannot be found by splitting a key: kept key by key, never grouped.
DOTTED = OpBlock(((0.0, 4, "a", "activations", "f"), (0.0, 4, "sub.o", "activations", "f")),
                 CATS)
BLOCKS = {"forward": FORWARD, "backward": BACKWARD, "partial": PARTIAL, "dotted": DOTTED}
SCOPES = ("mb0.L0.", "mb0.L1.", "mb1.L0.")


def reference_add_block(ref: dict, block: OpBlock, scope: str, input_key: str) -> None:
    for rel in block.free_set_in_order:
        del ref[scope + rel]
    for rel, category, nbytes, op in block.net_allocs:
        key = resolve(rel, scope, input_key)
        if key in ref:
            raise KeyError(key)
        ref[key] = LiveTensor(key, category, nbytes, op)


def apply(live: LiveSet, block: OpBlock, scope: str, input_key: str) -> None:
    if block.free_set_in_order:
        live.free_block(block, scope)
    if block.net_allocs:
        live.add_block(block, scope, input_key)


def test_forward_then_backward_leaves_only_the_input_gradient():
    live = LiveSet()
    live.add("x", "activations", 16, "in")
    live.pop("x")  # the forward frees its input first (Ledger._free_input)
    apply(live, FORWARD, "mb0.L0.", "x")
    assert set(live.as_dict()) == {"mb0.L0.a", "mb0.L0.b", "mb0.L0.o"}
    assert live.get("mb0.L0.b") == LiveTensor("mb0.L0.b", "activations", 2, "g")
    assert live.pop("mb0.L0.o").nbytes == 16  # the next layer consumes the output
    apply(live, BACKWARD, "mb0.L0.", "dy")
    assert live.as_dict() == {"mb0.L0.d": LiveTensor("mb0.L0.d", "activations", 16, "h")}
    assert len(live) == 1


def test_blocks_with_several_live_tensors_and_plain_keys_are_grouped():
    assert FORWARD.groupable and not BACKWARD.groupable and not DOTTED.groupable
    live = LiveSet()
    apply(live, FORWARD, "mb0.L0.", "x")
    apply(live, FORWARD, "mb0.L1.", "x")
    assert len(live._groups) == 2 and not live._entries
    apply(live, BACKWARD, "mb0.L0.", "dy")  # frees a and b; o is still live
    assert set(live.as_dict()) == {"mb0.L0.o", "mb0.L0.d", "mb0.L1.a", "mb0.L1.b", "mb0.L1.o"}


def test_a_block_key_cannot_be_allocated_again_or_freed_twice():
    live = LiveSet()
    apply(live, FORWARD, "mb0.L0.", "x")
    with pytest.raises(KeyError):
        live.add("mb0.L0.a", "activations", 1, "again")
    live.pop("mb0.L0.a")
    with pytest.raises(KeyError):
        live.pop("mb0.L0.a")
    assert live.holds("mb0.L0.b") and not live.holds("mb0.L0.a") and not live.holds("mb0.L0.")


OPS = st.lists(st.one_of(
    st.tuples(st.just("block"), st.sampled_from(sorted(BLOCKS)), st.sampled_from(SCOPES)),
    st.tuples(st.just("single"), st.sampled_from(("mb0.L0.a", "mb0.L1.o", "w", "mb1.L0.z",
                                                  "mb0.L0.sub.o")),
              st.integers(1, 64)),
    st.tuples(st.just("pop"), st.integers(0, 10 ** 6))), max_size=40)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_bulk_set_equals_the_per_key_dict(ops):
    """Any sequence of block applications, single allocations and frees: the same tensors are
    live, and the same operations fail, as with one dict entry per key."""
    live, ref = LiveSet(), {}
    for op in ops:
        outcome, keys = [], sorted(ref)
        for target, action in ((ref, _ref_action), (live, _live_action)):
            try:
                action(target, op, keys)
                outcome.append("ok")
            except KeyError:
                outcome.append("error")
        assert outcome[0] == outcome[1]
        if outcome[0] == "error":
            return  # a failed step leaves the two in different partial states
        assert live.as_dict() == ref and len(live) == len(ref)
        assert all(live.holds(key) and live.get(key) == ref[key] for key in ref)


def _ref_action(ref: dict, op: tuple, keys: list) -> None:
    if op[0] == "block":
        reference_add_block(ref, BLOCKS[op[1]], op[2], "x")
    elif op[0] == "single":
        if op[1] in ref:
            raise KeyError(op[1])
        ref[op[1]] = LiveTensor(op[1], "temporaries", op[2], "s")
    elif keys:
        del ref[keys[op[1] % len(keys)]]


def _live_action(live: LiveSet, op: tuple, keys: list) -> None:
    if op[0] == "block":
        apply(live, BLOCKS[op[1]], op[2], "x")
    elif op[0] == "single":
        live.add(op[1], "temporaries", op[2], "s")
    elif keys:
        live.pop(keys[op[1] % len(keys)])
