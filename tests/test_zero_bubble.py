"""The zero-bubble schedules (Qi et al., arXiv:2401.10241): a hand-worked ZB-H1, ZB-V against
torch.distributed.pipelining's own generator, and the paper's bubbles and activation peaks."""
import pytest
from hypothesis import given, settings, strategies as st

from simsp.errors import SimulationError, UserError
from simsp.training.pipeline.schedule_step import Step
from simsp.training.pipeline.schedules import (
    build_schedule, check_schedule, max_in_flight, one_f_one_b, pipeline_bubble, placement_of,
    simulate_uniform)
from simsp.training.pipeline.zero_bubble import zb_h1, zb_h2, zbv

FAST = settings(max_examples=60, deadline=None)
TIMES = [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0), (1.0, 1.0, 0.5), (1.5, 1.2, 0.7)]


def text(steps):
    """A stage's steps as 'F0 B0 W0 ...' with '.c' for chunk c > 0."""
    return " ".join(map(str, steps))


def bubble(name, p, m, times):
    """The largest stage idle time (first to last step) with (T_F, T_B, T_W) = times."""
    f, b, w = times
    v = 2 if name == "zbv" else 1
    timeline = simulate_uniform(build_schedule(name, p, m, v), p, v, forward_time=f,
                                backward_time=b, weight_time=w, placement=placement_of(name))
    return pipeline_bubble(timeline)


def test_zb_h1_p2_m3_worked_by_hand():
    # 1F1B's F/B order; stage 0 runs each W right after its B, stage 1 one B later (its W of
    # micro-batch i after B of i + 1), so stage 1 keeps at most one W waiting
    schedule = zb_h1(2, 3)
    assert text(schedule[0]) == "F0 F1 B0 W0 F2 B1 W1 B2 W2"
    assert text(schedule[1]) == "F0 B0 F1 B1 W0 F2 B2 W1 W2"


def most_weights_waiting(schedule) -> list[int]:
    """Per stage, the most Ws whose B has run and which have not run yet."""
    peaks = []
    for steps in schedule:
        waiting = peak = 0
        for step in steps:
            waiting += {"B": 1, "W": -1}.get(step.kind, 0)
            peak = max(peak, waiting)
        peaks.append(peak)
    return peaks


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (8, 16)])
def test_weights_wait_a_fixed_number_of_backwards(p, m):
    """Stage r's W of micro-batch i runs after its B of i + r (ZB-H1) or i + 2r (ZB-H2): at
    most r + 1 (2r + 1) Ws pending right after a B, however long the iteration."""
    assert most_weights_waiting(zb_h1(p, m)) == [r + 1 for r in range(p)]
    assert most_weights_waiting(zb_h2(p, m)) == [2 * r + 1 for r in range(p)]


@pytest.mark.parametrize("times", TIMES)
@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 12), (8, 16)])
def test_bubbles_are_the_papers(p, m, times):
    """§2: 1F1B (p-1)(T_F+T_B+T_W), ZB-H1 (p-1)(T_F+T_B-T_W), ZB-H2 (p-1)(T_F+T_B-2T_W)
    (m >= 2p - 1 for ZB-H2's warm-up), each the largest idle time of a stage between its own
    first and last step."""
    f, b, w = times
    one_f_one_b_timeline = simulate_uniform(one_f_one_b(p, m), p, forward_time=f,
                                            backward_time=b + w)
    assert pipeline_bubble(one_f_one_b_timeline) == pytest.approx((p - 1) * (f + b + w),
                                                                  abs=1e-12)
    assert bubble("zb-h1", p, m, times) == pytest.approx((p - 1) * (f + b - w), abs=1e-12)
    if m >= 2 * p - 1:
        assert bubble("zb-h2", p, m, times) == pytest.approx((p - 1) * (f + b - 2 * w),
                                                             abs=1e-12)


@pytest.mark.parametrize("p, m", [(2, 3), (4, 7), (4, 8), (8, 16)])
def test_zbv_has_no_bubble_when_the_passes_are_equal(p, m):
    """§6: ZB-V with T_F = T_B = T_W per chunk and m >= 2p - 1 leaves no stage idle."""
    assert bubble("zbv", p, m, (1.0, 1.0, 1.0)) == 0.0


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (8, 16)])
def test_activation_peaks_are_the_papers(p, m):
    """Micro-batches between F and B per stage: ZB-H1 keeps 1F1B's p - r, ZB-H2 2(p - r) - 1
    (2p - 1 on the first stage), ZB-V 2p chunks of half a stage on every stage (p stages'
    worth, 1F1B's first-stage peak)."""
    assert max_in_flight(zb_h1(p, m)) == [p - r for r in range(p)]
    assert max_in_flight(zb_h1(p, m)) == max_in_flight(one_f_one_b(p, m))
    assert max_in_flight(zb_h2(p, m)) == [2 * (p - r) - 1 for r in range(p)]
    assert max_in_flight(zbv(p, m)) == [2 * p] * p


@pytest.mark.parametrize("p, m", [(1, 2), (2, 3), (3, 10), (4, 3), (4, 8), (5, 4)])
def test_zbv_is_torchs_order(p, m):
    """The same steps, in the same order, as torch's ScheduleZBVZeroBubble per rank."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    generator = object.__new__(schedules.ScheduleZBVZeroBubble)
    generator.pp_group_size, generator.num_stages, generator._n_microbatches = p, 2 * p, m
    kind = {"FORWARD": "F", "BACKWARD_INPUT": "B", "BACKWARD_WEIGHT": "W"}
    expected = [[Step(kind[a.computation_type.name], a.microbatch_index,
                      0 if a.stage_index == rank else 1)
                 for a in generator._calculate_single_rank_operations(rank) if a is not None]
                for rank in range(p)]
    assert zbv(p, m) == expected


@FAST
@given(st.integers(1, 8), st.integers(1, 24))
def test_every_zero_bubble_schedule_is_complete_and_deadlock_free(p, m):
    for name in ("zb-h1", "zb-h2", "zbv"):
        v = 2 if name == "zbv" else 1
        schedule = build_schedule(name, p, m, v)
        check_schedule(schedule, p, m, v, placement_of(name))
        assert all(len(steps) == 3 * m * v for steps in schedule)


def test_a_weight_step_before_its_backward_is_refused():
    schedule = zb_h1(2, 2)
    first_w = schedule[0].index(Step("W", 0))
    schedule[0].insert(0, schedule[0].pop(first_w))
    with pytest.raises(SimulationError, match=r"weight gradient before its backward"):
        check_schedule(schedule, 2, 2)


def test_a_missing_weight_step_is_refused():
    schedule = zb_h1(2, 2)
    schedule[1].remove(Step("W", 1))
    with pytest.raises(SimulationError, match=r"stage 1: missing steps W1"):
        check_schedule(schedule, 2, 2)


@pytest.mark.parametrize("name, v, field", [("zbv", 1, "v"), ("zbv", 3, "v"), ("zb-h1", 2, "v"),
                                            ("zb-h2", 2, "v"), ("zb-h1", 0, "v")])
def test_bad_chunk_counts_name_the_field(name, v, field):
    with pytest.raises(UserError) as error:
        build_schedule(name, 4, 8, v)
    assert error.value.field == field
