"""The numpy geometry behind the report figures, against hand-worked inputs: stacked step
polygons, interval unions and pixel coverage, the Gantt's lane rows and clipping, the panel grid,
the memory timeline's per-category state, the trace's string literals and call search."""

import json

import numpy as np
from hypothesis import given, strategies as st
import pytest

from simsp.engine.memory import Ledger
from simsp.report.run.figures.bars import column_rectangles
from simsp.report.run.figures.drawing import stacked_step_polygons, step_path
from simsp.report.run.figures.panels import PanelGrid, nice_ticks, tick_labels
from simsp.report.run.figures.pixels import painted_shares, pixel_coverage, union
from simsp.report.run.figures.schedule import bar_outlines, clip, lane_strip, median_bar_px
from simsp.report.run.memory_timeline import memory_timeline, state_at
from simsp.report.run.trace.events import string
from simsp.report.run.trace.layout import enclosing_calls


# ---------------------------------------------------------------- stacked steps

def test_step_path_holds_each_value_until_the_next_time():
    path = step_path(np.array([0.0, 1.0, 3.0]), np.array([2.0, 5.0, 4.0]))
    assert path.tolist() == [[0, 2], [1, 2], [1, 5], [3, 5], [3, 4]]


def test_stacked_step_polygons_by_hand():
    # Two layers over three times: layer 0 = 1, 3, 3; layer 1 = 2, 0, 0.
    times = np.array([0.0, 1.0, 3.0])
    layers = np.array([[1.0, 2.0], [3.0, 0.0], [3.0, 0.0]])
    polygons = stacked_step_polygons(times, layers)
    assert polygons.shape == (2, 10, 2)
    assert polygons[0].tolist() == [[0, 1], [1, 1], [1, 3], [3, 3], [3, 3],  # top, forwards
                                    [3, 0], [3, 0], [1, 0], [1, 0], [0, 0]]  # floor, backwards
    assert polygons[1].tolist() == [[0, 3], [1, 3], [1, 3], [3, 3], [3, 3],  # 1 + 2, 3 + 0
                                    [3, 3], [3, 3], [1, 3], [1, 1], [0, 1]]  # layer 0's top


# ---------------------------------------------------------------- pixel coverage

def test_union_merges_overlapping_and_touching_intervals_and_drops_empty_ones():
    spans = np.array([[5.0, 6.0], [0.0, 2.0], [1.0, 3.0], [3.0, 4.0], [7.0, 7.0], [8.0, 9.0]])
    assert union(spans).tolist() == [[0, 4], [5, 6], [8, 9]]
    assert union(np.zeros((0, 2))).shape == (0, 2)


def test_pixel_coverage_is_the_covered_share_of_each_column():
    edges = np.array([0.0, 1.0, 2.0, 3.0, 4.0])  # four unit pixels
    spans = np.array([[0.25, 0.75], [1.5, 3.25], [3.5, 3.75]])
    assert pixel_coverage(spans, edges).tolist() == [0.5, 0.5, 1.0, 0.5]


def test_later_layers_hide_what_they_cover():
    edges = np.array([0.0, 1.0, 2.0])
    backward = np.array([[0.0, 2.0]])
    recompute = np.array([[0.5, 1.0]])  # painted over the backward bar
    shares = painted_shares([backward, recompute], edges)
    assert shares.tolist() == [[0.5, 1.0], [0.5, 0.0]]


# ---------------------------------------------------------------- Gantt rows

def test_clip_keeps_the_parts_inside_the_window():
    spans = np.array([[0.0, 1.0], [1.5, 2.5], [2.9, 4.0], [5.0, 6.0]])
    assert clip(spans, (1.0, 3.0)).tolist() == [[1.5, 2.5], [2.9, 3.0]]


def test_bar_outlines_sit_in_the_lane_of_their_row():
    bars = bar_outlines(np.array([[2.0, 4.0]]), 3, (0.66, 0.26), 2.0)
    assert np.allclose(bars[0], [[1, 3.21], [2, 3.21], [2, 3.47], [1, 3.47]])


def test_lane_strip_mixes_the_kinds_over_white():
    # Pixel 0: half forward, half idle; pixel 1: a quarter backward under a quarter recompute.
    stage = {"forward": np.array([[0.0, 0.5]]), "backward": np.array([[1.25, 1.75]]),
             "recompute": np.array([[1.5, 1.75]])}
    strip = lane_strip(stage, ["forward", "backward", "recompute"], np.array([0.0, 1.0, 2.0]))
    blue, green, orange = (np.array([0x4c, 0x72, 0xb0]), np.array([0x55, 0xa8, 0x68]),
                           np.array([0xdd, 0x84, 0x52]))
    assert np.allclose(strip[0] * 255, 0.5 * blue + 0.5 * 255)
    assert np.allclose(strip[1] * 255, 0.25 * green + 0.25 * orange + 0.5 * 255)


def test_median_bar_px_counts_only_the_steps_inside_the_window():
    stage = {"forward": np.array([[0.0, 1.0], [1.0, 3.0]]), "backward": np.array([[3.0, 6.0]])}
    assert median_bar_px([stage], (0.0, 10.0), 100) == pytest.approx(20.0)
    assert median_bar_px([stage], (0.0, 2.0), 100) == pytest.approx(50.0)  # [1, 2] clipped


# ---------------------------------------------------------------- panel grid

def test_panel_grid_places_rows_from_the_top():
    grid = PanelGrid(panels=5, cols=2, width=10.0, row_pitch=2.0, left=1.0, right=1.0,
                     top=1.0, bottom=1.0, hgap=0.0, title_gap=0.5)
    assert grid.rows == 3 and grid.height == 8.0 and grid.panel_size == (4.0, 1.5)
    assert grid.origins().tolist() == [[1, 5], [5, 5], [1, 3], [5, 3], [1, 1]]
    assert grid.is_bottom().tolist() == [False, False, False, True, True]
    assert grid.place(np.array([0.5]), np.array([1.0]), 3).tolist() == [[7.0, 4.5]]


def test_ticks_are_matplotlibs_and_labels_share_their_decimals():
    assert nice_ticks(85.0, 5).tolist() == [0, 20, 40, 60, 80]
    assert tick_labels(np.array([0.0, 2.5, 5.0])) == ["0.0", "2.5", "5.0"]
    assert tick_labels(np.array([0.0, 10.0, 20.0])) == ["0", "10", "20"]


# ---------------------------------------------------------------- memory timeline

def test_state_at_sums_each_category_up_to_the_kept_changes():
    codes = np.array([0, 1, 0, 2, 1])  # weights, gradients, weights, optimizer, gradients
    deltas = np.array([5, 3, -2, 7, 4])
    state = state_at(codes, deltas, np.array([1, 2, 4]))
    assert state.dtype == np.int64
    assert state.tolist() == [[5, 3, 0, 0, 0, 0, 0], [3, 3, 0, 0, 0, 0, 0],
                              [3, 7, 7, 0, 0, 0, 0]]


# ---------------------------------------------------------------- Chrome trace text

@pytest.mark.parametrize("text", ["F0.3", "('act', 0, 1)", 'say "hi"', "back\\slash",
                                  "tab\there", "caf\u00e9", "\x7f", ""])
def test_string_literals_are_those_of_json_dumps(text):
    assert string(text) == json.dumps(text)


@given(st.text())
def test_any_string_literal_is_that_of_json_dumps(text):
    assert string(text) == json.dumps(text)


def test_each_transfer_links_the_calls_that_enclose_it():
    # Rank 0 posts two sends, by start: a long one over [0, 10] and a short one over [4, 5].
    # The second transfer ends after the short call does, so it belongs to the earlier, longer
    # call; the third ends after both.
    call_start, call_end = np.array([0.0, 4.0]), np.array([10.0, 5.0])
    start, end = np.array([4.2, 4.5, 11.0, 4.0]), np.array([4.8, 6.0, 12.0, 5.0])
    found = enclosing_calls(call_start, call_end, start, end)
    assert found.tolist() == [1, 0, -1, 1]  # the last fits the short call exactly


def test_a_transfer_before_every_call_or_on_a_rank_without_calls_has_none():
    assert enclosing_calls(np.array([5.0]), np.array([9.0]), np.array([1.0]),
                           np.array([2.0])).tolist() == [-1]
    assert enclosing_calls(np.zeros(0), np.zeros(0), np.array([1.0]),
                           np.array([2.0])).tolist() == [-1]


def test_a_ledgers_coarser_timelines_come_from_its_finest_and_keep_the_peak():
    ledger = Ledger(rank=0, capacity_bytes=1 << 40)
    rng = np.random.default_rng(1)
    for i in range(6000):  # saw-tooth activations over a constant weight
        ledger.alloc(f"a{i}", int(rng.integers(1, 1000)), "activations", "op", time_s=float(i))
        if i % 7 == 6:
            for j in range(i - 6, i + 1):
                ledger.free(f"a{j}", time_s=float(i) + 0.5)
    peak = ledger.summary().peak_total
    finest = memory_timeline(ledger)
    assert len(finest[0]) <= 2000 and finest[1].sum(axis=1).max() == peak
    times, state = memory_timeline(ledger, 600)
    assert len(times) <= 600 and state.sum(axis=1).max() == peak
    rows = {(t, tuple(r)) for t, r in zip(finest[0].tolist(), finest[1].tolist())}
    assert all((t, tuple(r)) in rows for t, r in zip(times.tolist(), state.tolist()))
    ledger.alloc("late", 10**9, "weights", "op", time_s=7000.0)  # the log changed: recomputed
    assert memory_timeline(ledger, 600)[1][-1].sum() == ledger.total == 10**9 + 5


def test_column_rectangles_by_hand():
    bars = column_rectangles(np.array([0.0, 2.0]), np.array([0.0, 1.0]), np.array([3.0, 4.0]), 0.5)
    assert bars.tolist() == [[[-0.25, 0], [0.25, 0], [0.25, 3], [-0.25, 3]],
                             [[1.75, 1], [2.25, 1], [2.25, 4], [1.75, 4]]]
