"""The trace's column encoder (report/run/trace/columns.py) writes numbers and strings exactly as
Python's str() and repr() do, for any value in its range."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simsp.report.run.trace.columns import (CHUNK_ROWS, constant, integers, microseconds,
                                            rows_text, seconds_9, table, take)
from simsp.report.run.trace.events import Flows, flows_text, string


def column_rows(column, rows: int) -> list[str]:
    """Each row of one column as text (through rows_text, the encoder's only output)."""
    text = rows_text([constant("<"), column, constant(">")], rows)
    return text[1:-1].split(">,<") if rows else []


@given(st.lists(st.integers(-2 ** 63, 2 ** 63 - 1), max_size=40))
def test_integers_are_written_as_str_writes_them(values):
    assert column_rows(integers(np.array(values, dtype=np.int64)), len(values)) == \
        [str(v) for v in values]


@pytest.mark.parametrize("value", [0, 9, 10, -1, -10, 2 ** 63 - 1, -2 ** 63])
def test_integers_by_hand(value):
    assert column_rows(integers(np.array([value], dtype=np.int64)), 1) == [str(value)]


@given(st.lists(st.integers(0, 2 ** 52 - 1), max_size=40))
def test_microseconds_are_repr_of_nanoseconds_over_a_thousand(ns):
    assert column_rows(microseconds(np.array(ns, dtype=np.int64)), len(ns)) == \
        [repr(n / 1e3) for n in ns]


@pytest.mark.parametrize("ns, text", [(0, "0.0"), (1, "0.001"), (1000, "1.0"), (1500, "1.5"),
                                      (123456789, "123456.789"), (10, "0.01")])
def test_microseconds_by_hand(ns, text):
    assert column_rows(microseconds(np.array([ns])), 1) == [text]


def test_microseconds_refuse_what_repr_would_write_otherwise():
    with pytest.raises(ValueError):
        microseconds(np.array([2 ** 52]))


@settings(max_examples=300)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=30))
def test_seconds_are_repr_of_round_to_nine_places_for_any_float(values):
    assert column_rows(seconds_9(np.array(values, dtype=float)), len(values)) == \
        [repr(round(v, 9)) for v in values]


@settings(max_examples=300)
@given(st.lists(st.tuples(st.integers(0, 4 * 10 ** 15), st.integers(-20, 20)), max_size=30))
def test_seconds_near_half_nanosecond_ties_are_still_exact(points):
    """Values within a few ulps of a half nanosecond, where v * 1e9 in floating point could
    round the other way from the exact decimal rounding."""
    values = [(n + 0.5) / 1e9 + k * math.ulp((n + 0.5) / 1e9) for n, k in points]
    assert column_rows(seconds_9(np.array(values)), len(values)) == \
        [repr(round(v, 9)) for v in values]


@pytest.mark.parametrize("value", [0.0, 4.68034e-4, 4.68e-05, 1e-4, 0.0001000000004,
                                   3999999.9999999995, 5e6, float("nan"), float("inf"), -1.5])
def test_seconds_by_hand(value):
    assert column_rows(seconds_9(np.array([value])), 1) == [repr(round(value, 9))]


@given(st.lists(st.text(st.characters(min_codepoint=32, max_codepoint=126)), min_size=1,
                max_size=20), st.data())
def test_a_table_row_taken_is_the_string(values, data):
    index = data.draw(st.lists(st.integers(0, len(values) - 1), max_size=30))
    assert column_rows(take(table(values), np.array(index, dtype=np.int64)), len(index)) == \
        [values[i] for i in index]


def test_a_table_keeps_empty_strings():
    assert column_rows(table(["", "ab", ""]), 3) == ["", "ab", ""]


def test_rows_are_joined_by_commas_across_chunks():
    rows = CHUNK_ROWS + 5
    text = rows_text([constant("r"), integers(np.arange(rows))], rows)
    assert text == ",".join(f"r{i}" for i in range(rows))
    assert rows_text([constant("r")], 0) == ""


def test_arrow_names_need_the_prefix_and_plain_text_for_the_fast_path():
    """Labels without "p2p " or with text json.dumps escapes are each quoted as json.dumps
    does; the arrow's name drops the prefix only."""
    for labels in (["p2p a", "p2p b"], ["p2p a", 'p2p "q"'], ["p2p a", "p2p caf\u00e9"],
                   ["p2p a", "p2pb"], ["p2p", "p2p x"]):
        flows = Flows(*(np.zeros(len(labels), np.int64) for _ in range(6)), labels)
        names = [event.split('"name":')[1].split(',"ts"')[0]
                 for event in flows_text(flows).split("},{")]
        expected = [string(label.removeprefix("p2p ")) for label in labels for _ in "sf"]
        assert names == expected
