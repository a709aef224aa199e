"""Pipeline schedules as data: shapes pinned by hand, properties checked over small (p, m, v)."""
from fractions import Fraction

import pytest
from hypothesis import given, settings, strategies as st

from simsp.errors import SimulationError, UserError
from simsp.training.pipeline.schedules import (
    Step, bubble_fraction, build_schedule, check_schedule, execution_order, gpipe,
    interleaved_one_f_one_b, max_in_flight, one_f_one_b, simulate_uniform)

FAST = settings(max_examples=100, deadline=None)
stages = st.integers(1, 8)
micro_batches = st.integers(1, 24)
chunks = st.integers(1, 4)


@st.composite
def interleaved_sizes(draw):
    """(p, m, v) with m a multiple of p and m <= 24."""
    p = draw(stages)
    return p, p * draw(st.integers(1, 24 // p)), draw(chunks)


def text(steps):
    """A stage's steps as 'F0 F1 B0 ...' with '.c' for chunk c > 0."""
    return " ".join(map(str, steps))


def leading_forwards(steps):
    """How many forwards a stage runs before its first backward."""
    return next(i for i, s in enumerate(steps) if s.kind == "B")


# --- hand-worked schedules, pinned exactly --------------------------------------------------

def test_one_f_one_b_p2_m4_pinned():
    schedule = one_f_one_b(2, 4)
    assert text(schedule[0]) == "F0 F1 B0 F2 B1 F3 B2 B3"
    assert text(schedule[1]) == "F0 B0 F1 B1 F2 B2 F3 B3"


def test_one_f_one_b_more_stages_than_micro_batches_pinned():
    assert [text(s) for s in one_f_one_b(3, 1)] == ["F0 B0"] * 3
    assert text(one_f_one_b(4, 2)[0]) == "F0 F1 B0 B1"


def test_gpipe_p2_m3_pinned():
    assert [text(s) for s in gpipe(2, 3)] == ["F0 F1 F2 B0 B1 B2"] * 2


def test_interleaved_p2_m4_v2_pinned():
    # stage 0 warm-up 2*(2-0-1) + (2-1)*2 = 4, stage 1 warm-up 2 (Megatron schedules.py)
    schedule = interleaved_one_f_one_b(2, 4, 2)
    assert text(schedule[0]) == "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3"
    assert text(schedule[1]) == "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3"


def test_virtual_stage_is_round_robin():
    assert Step("F", 0, 0).virtual_stage(1, 4) == 1
    assert Step("B", 3, 2).virtual_stage(1, 4) == 9


def test_execution_order_picks_lowest_ready_stage():
    order = execution_order(one_f_one_b(2, 2), 2)
    assert [(r, str(s)) for r, s in order] == [
        (0, "F0"), (0, "F1"), (1, "F0"), (1, "B0"), (0, "B0"), (1, "F1"), (1, "B1"), (0, "B1")]


def test_uniform_timeline_pinned_with_p2p():
    timeline = simulate_uniform(one_f_one_b(2, 1), 2, forward_time=1.0, backward_time=2.0,
                                p2p_time=0.5)
    spans = [[(str(s.step), s.start, s.end) for s in stage] for stage in timeline.spans]
    assert spans == [[("F0", 0.0, 1.0), ("B0", 5.0, 7.0)], [("F0", 1.5, 2.5), ("B0", 2.5, 4.5)]]
    assert timeline.iteration_time == 7.0


# --- properties over small (p, m, v) ----------------------------------------------------------

def all_schedules(p, m, v):
    """Every named schedule for these sizes (GPipe and 1F1B ignore v), with its v."""
    yield build_schedule("gpipe", p, m), 1
    yield build_schedule("1f1b", p, m), 1
    if m % p == 0:
        yield build_schedule("interleaved", p, m, v), v


@FAST
@given(stages, micro_batches, chunks)
def test_every_schedule_passes_check(p, m, v):
    for schedule, vv in all_schedules(p, m, v):
        check_schedule(schedule, p, m, vv)


@FAST
@given(interleaved_sizes())
def test_execution_order_obeys_dependencies_and_stage_order(sizes):
    p, m, v = sizes
    schedule = interleaved_one_f_one_b(p, m, v)
    order = execution_order(schedule, p, v)
    assert [[s for r, s in order if r == stage] for stage in range(p)] == schedule
    position = {(s.kind, s.micro_batch, s.virtual_stage(r, p)): i for i, (r, s) in enumerate(order)}
    last = p * v - 1
    for (kind, mb, k), i in position.items():
        need = (kind, mb, k - 1) if kind == "F" else ("B", mb, k + 1) if k < last else ("F", mb, k)
        if need[2] >= 0:
            assert position[need] < i


@FAST
@given(stages, micro_batches)
def test_one_f_one_b_warmup_then_alternate_then_cooldown(p, m):
    for r, steps in enumerate(one_f_one_b(p, m)):
        warmup = min(p - r - 1, m)  # Megatron schedules.py
        assert leading_forwards(steps) == min(warmup + 1, m)
        steady = steps[warmup:warmup + 2 * (m - warmup)]
        assert [s.kind for s in steady] == ["F", "B"] * (m - warmup)
        assert all(s.kind == "B" for s in steps[2 * m - warmup:])


@FAST
@given(interleaved_sizes())
def test_interleaved_warmup_and_numbering(sizes):
    p, m, v = sizes
    forward = [Step("F", (k // (p * v)) * p + k % p, (k // p) % v) for k in range(m * v)]
    backward = [Step("B", s.micro_batch, v - 1 - s.chunk) for s in forward]
    for r, steps in enumerate(interleaved_one_f_one_b(p, m, v)):
        warmup = min(2 * (p - r - 1) + (v - 1) * p, m * v)  # Megatron schedules.py, N21 §2.2.2
        assert leading_forwards(steps) == min(warmup + 1, m * v)
        assert [s for s in steps if s.kind == "F"] == forward
        assert [s for s in steps if s.kind == "B"] == backward


@FAST
@given(stages, micro_batches)
def test_bubble_fraction_gpipe_and_1f1b_exact(p, m):
    for name in ("gpipe", "1f1b"):
        timeline = simulate_uniform(build_schedule(name, p, m), p)
        ideal = m * (1 + 2)
        bubble = (Fraction(timeline.iteration_time) - ideal) / ideal
        assert bubble == Fraction(p - 1, m)  # N21 §2.2.1
        assert bubble_fraction(timeline) == (p - 1) / m


@FAST
@given(interleaved_sizes())
def test_bubble_fraction_interleaved_exact(sizes):
    p, m, v = sizes
    timeline = simulate_uniform(interleaved_one_f_one_b(p, m, v), p, v)
    ideal = m * v * (1 + 2)
    bubble = (Fraction(timeline.iteration_time) - ideal) / ideal
    assert bubble == Fraction(p - 1, v * m)  # N21 §2.2.2
    assert bubble_fraction(timeline) == (p - 1) / (v * m)


@FAST
@given(stages, micro_batches)
def test_in_flight_gpipe_and_1f1b(p, m):
    assert max_in_flight(gpipe(p, m)) == [m] * p
    peaks = max_in_flight(one_f_one_b(p, m))
    assert peaks == [min(p - r, m) for r in range(p)]
    assert peaks[0] == min(p, m)


@FAST
@given(interleaved_sizes())
def test_in_flight_interleaved(sizes):
    p, m, v = sizes
    warmups = [min(2 * (p - r - 1) + (v - 1) * p, m * v) for r in range(p)]
    expected = [min(w + 1, m * v) for w in warmups]
    assert max_in_flight(interleaved_one_f_one_b(p, m, v)) == expected


# --- broken schedules are rejected before anything runs ---------------------------------------

def test_backward_before_forward_rejected():
    schedule = one_f_one_b(2, 2)
    schedule[1][0], schedule[1][1] = schedule[1][1], schedule[1][0]
    expected = r"stage 1 step 0 \(B0\): backward before its forward"
    with pytest.raises(SimulationError, match=expected):
        check_schedule(schedule, 2, 2)


def test_deadlocking_order_rejected():
    # stage 0 waits for B0 from stage 1, which waits for F1 from stage 0
    schedule = [[Step("F", 0), Step("B", 0), Step("F", 1), Step("B", 1)],
                [Step("F", 0), Step("F", 1), Step("B", 0), Step("B", 1)]]
    expected = r"deadlock.*stage 0 at step 1 \(B0\).*stage 1 at step 1"
    with pytest.raises(SimulationError, match=expected):
        check_schedule(schedule, 2, 2)


def test_interleaved_chunk_order_deadlock_rejected():
    schedule = interleaved_one_f_one_b(2, 2, 2)
    # stage 1 runs F0 of chunk 1 (virtual stage 3) before chunk 0 (virtual stage 1) that feeds it
    schedule[1][0], schedule[1][2] = schedule[1][2], schedule[1][0]
    with pytest.raises(SimulationError, match=r"deadlock.*stage 1 at step 0 \(F0\.1\)"):
        check_schedule(schedule, 2, 2, 2)


@pytest.mark.parametrize("edit, message", [
    (lambda s: s[0].pop(), "stage 0: missing steps B1"),
    (lambda s: s[1].append(Step("B", 1)), r"stage 1 step 4 \(B1\): appears twice"),
    (lambda s: s[0].insert(0, Step("F", 5)), r"stage 0 step 0 \(F5\): outside"),
    (lambda s: s[0].insert(0, Step("X", 0)), "kind must be"),
    (lambda s: s.pop(), "expected p=2"),
])
def test_incomplete_schedules_rejected(edit, message):
    schedule = one_f_one_b(2, 2)
    edit(schedule)
    with pytest.raises(SimulationError, match=message):
        check_schedule(schedule, 2, 2)


def test_build_schedule_rejects_bad_arguments():
    with pytest.raises(UserError, match="schedule"):
        build_schedule("zero-bubble", 2, 4)
    with pytest.raises(UserError, match="multiple of p=4"):
        build_schedule("interleaved", 4, 6, 2)
    with pytest.raises(UserError, match="interleaved"):
        build_schedule("1f1b", 2, 4, 2)
    with pytest.raises(UserError, match="m:"):
        build_schedule("gpipe", 2, 0)
