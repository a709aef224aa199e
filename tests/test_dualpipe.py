"""DualPipe, DualPipeV, 1F1B and ZB-H1 as op lists, timed by the unit-time list scheduler, against
the published closed forms: DeepSeek-V3 report (arXiv:2412.19437) Table 2 and deepseek-ai/DualPipe
README; the ZB paper (arXiv:2401.10241) §3.1. Every expected value is written by hand."""
import pytest

from simsp.errors import SimulationError, UserError
from simsp.training.pipeline.dualpipe import dualpipe, dualpipev
from simsp.training.pipeline.op_schedules import one_f_one_b_ops, zb_h1_ops
from simsp.training.pipeline.op_step import OpSchedule, line_routes, single
from simsp.training.pipeline.op_timing import Durations, peak_activations, simulate_ops

UNIT = 0.37  # F = B = W = one unit (B the input-gradient backward, as the ZB paper's)
EQUAL = Durations(UNIT, UNIT, UNIT)  # F&B = F + B + W: no gain from overlap


def table2_bubble(pp: int) -> float:
    """(PP/2 - 1)(F&B + B - 3W) with Table 2's B the full backward (2 units), F&B 3 units."""
    f_and_b, full_backward, w = 3 * UNIT, 2 * UNIT, UNIT
    return (pp / 2 - 1) * (f_and_b + full_backward - 3 * w)


@pytest.mark.parametrize("pp", [4, 8, 16])
@pytest.mark.parametrize("extra", [0, 2, 6, 14])
def test_dualpipe_bubble_is_table_2s_on_every_rank(pp, extra):
    m = 2 * pp + extra  # micro-batches: even, at least 2 PP
    timeline = simulate_ops(dualpipe(pp, m), EQUAL)
    busy = m * 3 * UNIT  # every rank: m forwards, m input and m weight gradients
    for rank in range(pp):
        assert timeline.busy_time(rank) == pytest.approx(busy, abs=1e-12)
        assert timeline.bubble(rank) == pytest.approx(table2_bubble(pp), abs=1e-12)
    assert timeline.iteration_time == pytest.approx(busy + table2_bubble(pp), abs=1e-12)


@pytest.mark.parametrize("ranks", [2, 4, 8])
@pytest.mark.parametrize("extra", [0, 1, 5, 12])
def test_dualpipev_bubble_is_the_readmes_with_pp_twice_the_ranks(ranks, extra):
    m = 2 * ranks + extra  # DualPipeV asks only m >= 2 x ranks
    timeline = simulate_ops(dualpipev(ranks, m), EQUAL)
    busy = 2 * m * 3 * UNIT  # two stages per rank, each F, B, W of every micro-batch
    for rank in range(ranks):
        assert timeline.busy_time(rank) == pytest.approx(busy, abs=1e-12)
        assert timeline.bubble(rank) == pytest.approx(table2_bubble(2 * ranks), abs=1e-12)


@pytest.mark.parametrize("pp,m", [(4, 8), (8, 16), (8, 30), (16, 32)])
def test_dualpipe_holds_pp_plus_one_activations(pp, m):
    assert peak_activations(dualpipe(pp, m)) == [pp + 1] * pp


@pytest.mark.parametrize("ranks,m", [(2, 4), (4, 9), (8, 20)])
def test_dualpipev_holds_pp_plus_one_stage_activations(ranks, m):
    assert peak_activations(dualpipev(ranks, m)) == [2 * ranks + 1] * ranks


def test_dualpipe_rank_0_is_upstream_step_traced_by_hand():
    """PP 4, 8 micro-batches, rank 0 (n = 2, h = 0, 4 per direction): steps 1-8 of
    dualpipe.py step() traced by hand; chunk 1 carries micro-batches 4..7."""
    expected = ("F0.0 F1.0 F2.0 F4.1 B4.1 W4.1 F5.1 F3.0&BW5.1 F6.1&BW0.0 BW6.1 F7.1&BW1.0 "
                "BW7.1 B2.0 W2.0 B3.0 W3.0")
    assert " ".join(map(str, dualpipe(4, 8).ops[0])) == expected


def test_dualpipev_last_rank_is_upstream_step_traced_by_hand():
    """2 ranks, 4 micro-batches, rank 1 (the last): its first F0 and B1 run apart (step 4),
    the second half of step 6 is zero-bubble (rank odd), step 8 pops both W."""
    expected = ("F0.0 F0.1 F1.0 F1.1 F2.0 BW0.1 F2.1&BW0.0 F3.0&BW1.1 F3.1&BW1.0 BW2.1 BW2.0 "
                "B3.1 B3.0 W3.1 W3.0")
    assert " ".join(map(str, dualpipev(2, 4).ops[1])) == expected


def _work(schedule: OpSchedule, rank: int) -> dict:
    """(micro_batch, chunk) -> the kinds run for it on the rank, in order."""
    work: dict = {}
    for task in (t for op in schedule.ops[rank] for t in op.tasks):
        work.setdefault((task.micro_batch, task.chunk), []).append(task.kind)
    return work


@pytest.mark.parametrize("pp,m", [(4, 8), (8, 18)])
def test_dualpipe_runs_every_micro_batch_once_per_rank_in_its_direction(pp, m):
    expected = {(k, 0) for k in range(m // 2)} | {(k, 1) for k in range(m // 2, m)}
    for rank in range(pp):
        work = _work(dualpipe(pp, m), rank)
        assert set(work) == expected
        assert all(kinds in (["F", "BW"], ["F", "B", "W"]) for kinds in work.values())


@pytest.mark.parametrize("ranks,m", [(2, 4), (4, 11)])
def test_dualpipev_runs_every_micro_batch_on_both_chunks(ranks, m):
    expected = {(k, c) for k in range(m) for c in (0, 1)}
    for rank in range(ranks):
        work = _work(dualpipev(ranks, m), rank)
        assert set(work) == expected
        assert all(kinds in (["F", "BW"], ["F", "B", "W"]) for kinds in work.values())


def test_dualpipe_pairs_counted_by_hand():
    """PP 8, 20 micro-batches (README's figure): n = 4, 10 per direction; rank h runs
    2(10 - 8 + h + 1) pairs in step 4 (one fewer on the middle ranks 3 and 4) and 4 - h - 1 in
    step 5: 9, 10, 11, 11 pairs for h = 0..3."""
    pairs = [sum(op.is_pair for op in ops) for ops in dualpipe(8, 20).ops]
    assert pairs == [9, 10, 11, 11, 11, 11, 10, 9]


@pytest.mark.parametrize("p,m", [(4, 4), (4, 8), (8, 24)])
def test_one_f_one_b_bubble_and_memory(p, m):
    timeline = simulate_ops(one_f_one_b_ops(p, m), EQUAL)
    for rank in range(p):  # (PP - 1)(F + B), B the full backward: 3 units
        assert timeline.bubble(rank) == pytest.approx((p - 1) * 3 * UNIT, abs=1e-12)
    assert peak_activations(one_f_one_b_ops(p, m)) == [p - stage for stage in range(p)]


@pytest.mark.parametrize("p,m", [(4, 4), (4, 8), (8, 8), (8, 24)])
@pytest.mark.parametrize("f,b,w", [(1.0, 1.0, 1.0), (1.0, 1.2, 0.8), (0.5, 1.0, 0.25)])
def test_zb_h1_bubble_is_p_minus_1_times_f_plus_b_minus_w(p, m, f, b, w):
    timeline = simulate_ops(zb_h1_ops(p, m), Durations(f, b, w))
    for rank in range(p):  # ZB paper §3.1: (p-1)(T_F + T_B - T_W), a third of 1F1B at F=B=W
        assert timeline.bubble(rank) == pytest.approx((p - 1) * (f + b - w), abs=1e-12)
    assert peak_activations(zb_h1_ops(p, m)) == [p - stage for stage in range(p)]


def test_a_forward_before_its_input_deadlocks_by_name():
    backwards_first = OpSchedule("bad", ((single("F", 0), single("BW", 0)),
                                         (single("BW", 0), single("F", 0))), line_routes(2, 1))
    with pytest.raises(SimulationError, match="rank 1 at op 0"):
        simulate_ops(backwards_first)


@pytest.mark.parametrize("call,field", [(lambda: dualpipe(3, 8), "pp"),
                                        (lambda: dualpipe(4, 6), "m"),
                                        (lambda: dualpipe(4, 9), "m"),
                                        (lambda: dualpipev(4, 7), "m"),
                                        (lambda: dualpipev(0, 7), "ranks")])
def test_bad_sizes_name_the_field(call, field):
    with pytest.raises(UserError) as caught:
        call()
    assert caught.value.field == field


@pytest.mark.parametrize("pp", [4, 8, 16])
@pytest.mark.parametrize("f_and_b", [2.0, 2.2, 2.5, 2.8])
def test_overlap_gain_the_middle_ranks_idle_table_2s_bubble(pp, f_and_b):
    """F = B = W = 1 and F + B <= F&B <= F + B + W: the middle ranks (PP/2 - 1, PP/2) idle
    (PP/2 - 1)(F&B + B - 3W) with Table 2's B = 2, the others less (they start pairs earlier)."""
    m = 2 * pp + 4
    timeline = simulate_ops(dualpipe(pp, m), Durations(1.0, 1.0, 1.0, f_and_b))
    published = (pp / 2 - 1) * (f_and_b + 2.0 - 3.0)
    bubbles = [timeline.bubble(rank) for rank in range(pp)]
    for middle in (pp // 2 - 1, pp // 2):
        assert bubbles[middle] == pytest.approx(published, abs=1e-12)
    assert max(bubbles) == pytest.approx(published, abs=1e-12)
