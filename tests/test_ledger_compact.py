"""The compact ledger log (a replayed layer step is one record) gives exactly the figures of the
full per-tensor log: peaks, composition at the peak, OOM verdict with its largest live tensors,
the memory timeline, live tensors and totals (docs/MODEL.md#accounting-rules).

Logs are generated from known parameters: blocks shaped like a layer's forward (saves some
tensors, frees its temporaries) and backward (frees what the forward saved and the step's input),
applied at times out of order, between single allocations and frees. The compact ledger is
compared with a ledger fed every expanded change one by one, and both with a naive replay."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simsp.engine.memory import CATEGORIES, INPUT, Ledger, LiveTensor, MemEvent, OpBlock
from simsp.engine.memory.compact_log import BlockRecord
from simsp.report.run.memory_timeline import memory_timeline

SAVED = ("a", "b", "c")


def forward_block(rng) -> OpBlock:
    """Temporaries allocated and freed, SAVED kept, an output kept; offsets with ties."""
    ops, t = [], 0.0
    for name in ("t1", "a", "t2", "b", "c"):
        t += float(rng.integers(0, 3))
        ops.append((t, int(rng.integers(1, 1000)), name,
                    "activations" if name in SAVED else "temporaries", f"op_{name}"))
    for name in ("t2", "t1"):
        t += float(rng.integers(0, 2))
        size = next(o[1] for o in ops if o[2] == name)
        ops.append((t, -size, name, "temporaries", "free"))
    ops.append((t + 1.0, int(rng.integers(1, 1000)), "out", "communication", "op_out"))
    return OpBlock(tuple(ops), CATEGORIES)


def backward_block(fwd: OpBlock, rng, input_bytes: int) -> OpBlock:
    """Frees what `fwd` saved and the step's input (category taken where applied); keeps dx."""
    sizes = {op.key: op.delta_bytes for op in fwd.ops if op.delta_bytes > 0}
    ops, t = [], 0.0
    ops.append((t, int(rng.integers(1, 1000)), "g", "temporaries", "op_g"))
    for name in SAVED:
        t += float(rng.integers(0, 2))
        ops.append((t, -sizes[name], name, "activations", "free"))
    ops.append((t + 0.5, -input_bytes, INPUT, "temporaries", "free input"))
    ops.append((t + 1.0, -ops[0][1], "g", "temporaries", "free"))
    ops.append((t + 2.0, int(rng.integers(1, 1000)), "dx", "temporaries", "op_dx"))
    return OpBlock(tuple(ops), CATEGORIES)


def build(seed: int, steps: int, capacity: int) -> Ledger:
    """A compact ledger: per step an input tensor (single), a forward block, later a backward."""
    rng = np.random.default_rng(seed)
    fwd = forward_block(rng)
    input_bytes = int(rng.integers(1, 500))
    bwd = backward_block(fwd, rng, input_bytes)
    ledger = Ledger(rank=3, capacity_bytes=capacity)
    for i in range(steps):
        t = float(rng.integers(0, 4 * steps))  # applied out of time order, ties included
        category = CATEGORIES[int(rng.integers(3, 6))]  # activations, temporaries or comm
        ledger.alloc(f"x{i}", input_bytes, category, "recv", time_s=t)
        ledger.apply_block(fwd, t + 1.0, f"s{i}.", f"y{i}")
        ledger.alloc(f"y{i}", input_bytes, category, "recv", time_s=t + 2.0)
        ledger.apply_block(bwd, t + 30.0, f"s{i}.", f"y{i}")
        ledger.free(f"x{i}", time_s=t + 40.0)
    return ledger


def expanded(compact: Ledger) -> Ledger:
    """The same log applied change by change (what replaying op by op recorded)."""
    full = Ledger(rank=compact.rank, capacity_bytes=compact.capacity_bytes)
    for e in compact.events:
        if e.delta_bytes > 0:
            full.alloc(e.key, e.delta_bytes, e.category, e.op, time_s=e.time_s)
        else:
            full.free(e.key, e.op, time_s=e.time_s)
    return full


def naive_summary(events: list, capacity: int) -> dict:
    """Reference: replay the changes in time order (stable) one at a time, in plain Python."""
    current, peaks = dict.fromkeys(CATEGORIES, 0), dict.fromkeys(CATEGORIES, 0)
    live, total, peak, peak_time, at_peak, oom = {}, 0, 0, 0.0, dict(current), None
    for e in sorted(events, key=lambda e: e.time_s):
        if e.delta_bytes > 0 and oom is None and total + e.delta_bytes > capacity:
            biggest = sorted(live.values(), key=lambda t: (-t.nbytes, t.key))[:5]
            oom = (e.op, e.key, e.time_s, e.delta_bytes, total, tuple(biggest))
        total += e.delta_bytes
        current[e.category] += e.delta_bytes
        if e.delta_bytes > 0:
            live[e.key] = LiveTensor(e.key, e.category, e.delta_bytes, e.op)
            peaks[e.category] = max(peaks[e.category], current[e.category])
            if total > peak:
                peak, peak_time, at_peak = total, e.time_s, dict(current)
        else:
            live.pop(e.key, None)
    return {"peak": peak, "time": peak_time, "peaks": peaks, "at_peak": at_peak, "oom": oom}


def figures(ledger: Ledger) -> dict:
    s = ledger.summary()
    oom = None if s.oom is None else (s.oom.op, s.oom.key, s.oom.time_s, s.oom.bytes_asked,
                                      s.oom.bytes_in_use, s.oom.largest_live)
    return {"peak": s.peak_total, "time": s.peak_time_s, "peaks": s.peak_by_category,
            "at_peak": s.at_peak, "oom": oom}


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), steps=st.integers(1, 12),
       capacity=st.sampled_from([10 ** 9, 3000, 1500]))
def test_compact_and_expanded_logs_give_identical_figures(seed, steps, capacity):
    compact = build(seed, steps, capacity)
    full = expanded(compact)
    assert len(compact.records) == 5 * steps < len(full.records)
    assert figures(compact) == figures(full) == naive_summary(full.events, capacity)
    assert compact.events == full.events  # names, bytes, times, order
    assert compact.live == full.live and compact.current == full.current
    for points in (2000, 11):
        a, b = memory_timeline(compact, points), memory_timeline(full, points)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), steps=st.integers(1, 12),
       capacity=st.sampled_from([3000, 1500, 900]))
def test_an_unnamed_oom_verdict_has_the_naive_replays_numbers(seed, steps, capacity):
    """A sweep row's verdict (no live tensors named, no log expansion): every other number of
    the naive replay's, and a named summary asked for later is the full one."""
    compact = build(seed, steps, capacity)
    naive = naive_summary(expanded(compact).events, capacity)
    cheap = compact.summary(name_live=False)
    got = None if cheap.oom is None else (cheap.oom.op, cheap.oom.key, cheap.oom.time_s,
                                          cheap.oom.bytes_asked, cheap.oom.bytes_in_use, ())
    assert got == (None if naive["oom"] is None else naive["oom"][:5] + ((),))
    assert (cheap.peak_total, cheap.peak_by_category) == (naive["peak"], naive["peaks"])
    assert figures(compact) == naive


def test_an_oom_inside_a_replayed_block_names_the_block_tensors():
    compact = build(seed=7, steps=6, capacity=1200)
    oom = compact.oom
    assert oom is not None and oom == expanded(compact).oom
    assert oom.bytes_in_use + oom.bytes_asked > 1200 >= oom.bytes_in_use
    assert any(t.key.startswith("s") for t in oom.largest_live)  # expanded names of a block


def test_a_block_is_one_record_that_expands_in_place_with_the_input_category():
    ledger = Ledger(rank=0, capacity_bytes=10 ** 9)
    block = OpBlock(((0.0, 8, "t", "temporaries", "mm"), (0.5, -4, INPUT, "temporaries", "in"),
                     (1.0, -8, "t", "temporaries", "free")), CATEGORIES)
    ledger.alloc("x", 4, "communication", "recv", time_s=0.0)
    ledger.apply_block(block, 2.0, "L0.", "x")
    assert len(ledger.records) == 2 and type(ledger.records[1]) is BlockRecord
    assert ledger.events[1:] == [MemEvent(2.0, "L0.t", "temporaries", 8, "mm"),
                                 MemEvent(2.5, "x", "communication", -4, "in"),
                                 MemEvent(3.0, "L0.t", "temporaries", -8, "free")]
    assert ledger.current["communication"] == 0 and not ledger.live
    assert ledger.peak_total == 12 and ledger.summary().at_peak["temporaries"] == 8


def test_a_block_checks_what_it_frees_and_allocates():
    block = OpBlock(((0.0, 8, "kept", "activations", "op"),), CATEGORIES)
    ledger = Ledger(rank=0, capacity_bytes=100)
    ledger.apply_block(block, 0.0, "L0.", "in")
    with pytest.raises(KeyError, match="allocated twice"):
        ledger.apply_block(block, 1.0, "L0.", "in")
    frees = OpBlock(((0.0, -8, "gone", "activations", "free"),), CATEGORIES)
    with pytest.raises(KeyError):
        ledger.apply_block(frees, 2.0, "L0.", "in")
