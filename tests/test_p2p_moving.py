"""The time a p2p call's data was moving (training/pipeline/p2p.py): the two-transfer closed form against
the general interval union, and both against a hand count."""

from hypothesis import example, given, strategies as st
import simpy

from simsp.training.pipeline.p2p import _moving_s, _union_length

times = st.sampled_from([0.0, 0.1, 0.2, 0.3, 0.1 + 0.2, 1.0, 1.5, 2.0]) | st.floats(0.0, 4.0)


def _events(*intervals):
    """Processed simpy events whose values are the transfers' (start_s, end_s)."""
    env = simpy.Environment()
    events = [env.event().succeed(interval) for interval in intervals]
    env.run()
    return events


def _general(events, start):
    return _union_length([(max(e.value[0], start), e.value[1]) for e in events])


@given(times, times, times, times, times)
@example(0.1, 1.1, 0.1, 0.2, 0.0)  # same start: the shorter first, as sorting puts it
@example(0.1, 0.2, 0.1, 1.1, 0.0)
def test_two_transfers_give_the_general_union_bit_for_bit(a0, a1, b0, b1, start):
    events = _events((a0, a1), (b0, b1))
    assert repr(_moving_s(events, start)) == repr(_general(events, start))


@given(st.lists(st.tuples(times, times), min_size=1, max_size=5), times)
def test_other_counts_use_the_general_union(intervals, start):
    events = _events(*intervals)
    assert _moving_s(events, start) == _general(events, start)


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), max_size=6))
def test_the_union_counts_every_covered_unit_once(pairs):
    covered = {t for start, end in pairs for t in range(start, end)}
    assert _union_length([(float(start), float(end)) for start, end in pairs]) == len(covered)


def test_hand_counted_unions():
    assert _moving_s(_events((0.0, 2.0), (1.0, 3.0)), 0.0) == 3.0  # overlapping: 0..3
    assert _moving_s(_events((0.0, 1.0), (2.0, 3.0)), 0.0) == 2.0  # apart
    assert _moving_s(_events((0.0, 3.0), (1.0, 2.0)), 0.0) == 3.0  # nested
    assert _moving_s(_events((0.0, 2.0), (1.0, 3.0)), 1.5) == 1.5  # clipped to the wait
    assert _moving_s(_events((0.0, 1.0), (0.5, 0.5)), 0.0) == 1.0  # an empty transfer
