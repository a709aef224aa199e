"""Rows of text assembled column by column with numpy: the trace's compact encoder
(docs/PERFORMANCE.md#reports-formatting-a-column-at-a-time).

A column is a byte matrix (one row of characters per text row, or one row shared by all) and a
mask of the characters that belong to the text. Integers and microsecond timestamps are written
as decimal digits by integer arithmetic, strings are taken from a table, and a row's text is its
columns side by side with the unmasked bytes dropped: one boolean gather for a whole chunk of
rows, where formatting row by row in Python costs a microsecond or more per number.
"""

from typing import NamedTuple

import numpy as np


ZERO = ord("0")
CHUNK_ROWS = 32_768  # rows assembled at a time: bounds the byte matrices (~10 MB)


class Column(NamedTuple):
    """Characters (rows, width) uint8 and which of them are text (rows, width) bool; `rows`
    is the row count, or 1 for a column every row shares."""

    chars: np.ndarray
    keep: np.ndarray


def constant(text: str) -> Column:
    """The same ASCII text in every row."""
    chars = np.frombuffer(text.encode("ascii"), dtype=np.uint8)[None, :]  # (1, w)
    return Column(chars, np.ones(chars.shape, dtype=bool))


def _digits(values: np.ndarray, width: int) -> np.ndarray:
    """Decimal digits of non-negative integers (n,), right-aligned and zero-padded to `width`:
    (n, width) uint8 characters."""
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.uint64)  # (width,)
    return (values.astype(np.uint64)[:, None] // powers % 10 + ZERO).astype(np.uint8)


def _width(values: np.ndarray) -> int:
    """Digits of the largest of non-negative integers (n,); 1 for none."""
    return len(str(int(values.max()))) if len(values) else 1


def integers(values) -> Column:
    """Integers (n,) as str() writes them."""
    values = np.asarray(values, dtype=np.int64)  # (n,)
    negative = values < 0  # (n,)
    magnitude = np.abs(values).astype(np.uint64)  # (n,) |int64 min| fits
    width = _width(magnitude)
    digits = _digits(magnitude, width)  # (n, width)
    lengths = 1 + (magnitude[:, None] >= 10 ** np.arange(1, width, dtype=np.uint64)).sum(axis=1)
    keep = np.arange(width) >= width - lengths[:, None]  # (n, width)
    if not negative.any():
        return Column(digits, keep)
    sign = np.full((len(values), 1), ord("-"), dtype=np.uint8)
    return Column(np.concatenate([sign, digits], axis=1),
                  np.concatenate([negative[:, None], keep], axis=1))


def microseconds(ns) -> Column:
    """Whole nanoseconds (n,) as microseconds, as repr(ns / 1e3) writes them: "12.5", "7.0",
    "0.001". Exact for 0 <= ns < 2**52: below 2**43 a double's spacing is under 1e-3, so no
    string shorter than the decimal ns / 1000 reads back as the same double, and repr writes
    the shortest (and never an exponent between 1e-4 and 1e16)."""
    ns = np.asarray(ns, dtype=np.int64)  # (n,)
    if len(ns) and (ns.min() < 0 or ns.max() >= 2 ** 52):
        raise ValueError("microseconds() writes 0 <= ns < 2**52 only")
    return _decimal(ns, 3)


def seconds_9(values) -> Column:
    """Floats (n,) as repr(round(v, 9)) writes them. Rows where the decimal rounding is not
    certain from v * 1e9 in floating point (a tie within a few ulps), and values outside
    [1e-4, 4e6) where repr would use an exponent or the decimal may not be the shortest
    string, are written by Python itself."""
    values = np.asarray(values, dtype=float)  # (n,)
    with np.errstate(over="ignore", invalid="ignore"):  # huge, inf, NaN: written by Python
        scaled = values * 1e9  # (n,)
        tie = np.abs(scaled - np.floor(scaled) - 0.5) <= 8 * np.spacing(np.abs(scaled))  # (n,)
    nano = np.rint(scaled)  # (n,) the rounded value in units of 1e-9
    zero = (values == 0.0) & ~np.signbit(values)  # (n,) "0.0" (-0.0 is Python's)
    python = tie | ~((values >= 1e-4) & (values < 4e6) | zero)  # (n,) NaN included
    column = _decimal(np.where(python, 0.0, nano).astype(np.int64), 9)
    if not python.any():
        return column
    rows = np.flatnonzero(python)  # (k,)
    exact = table([repr(round(v, 9)) for v in values[rows].tolist()])
    return _replace_rows(column, rows, exact)


def _decimal(units: np.ndarray, places: int) -> Column:
    """Non-negative integers (n,) counting 10**-places as decimals with trailing zeros dropped
    (one kept after the point): 12345 at 3 places is "12.345", 7000 is "7.0"."""
    scale = 10 ** places
    whole = integers(units // scale)
    fraction = _digits(units % scale, places)  # (n, places)
    nonzero = fraction != ZERO  # (n, places)
    last = places - np.argmax(nonzero[:, ::-1], axis=1)  # (n,) digits up to the last nonzero
    kept = np.where(nonzero.any(axis=1), last, 1)  # (n,) ".0" for a whole number
    point = np.full((len(units), 1), ord("."), dtype=np.uint8)
    return Column(np.concatenate([whole.chars, point, fraction], axis=1),
                  np.concatenate([whole.keep, np.ones((len(units), 1), bool),
                                  np.arange(places) < kept[:, None]], axis=1))


def _replace_rows(column: Column, rows: np.ndarray, new: Column) -> Column:
    """`column` with rows `rows` (k,) replaced by the rows of `new` (k rows), left-aligned."""
    width = max(column.chars.shape[1], new.chars.shape[1])
    chars, keep = (np.zeros((len(column.chars), width), dtype) for dtype in (np.uint8, bool))
    for target, source in ((chars, column.chars), (keep, column.keep)):
        target[:, width - source.shape[1]:] = source
    chars[rows], keep[rows] = 0, False
    chars[rows, :new.chars.shape[1]] = new.chars
    keep[rows, :new.chars.shape[1]] = new.keep
    return Column(chars, keep)


def table(values: list[str]) -> Column:
    """Row i is `values[i]` (ASCII strings; also a table to `take` rows from): the strings
    joined and encoded once, each row a window of that buffer."""
    lengths = np.fromiter(map(len, values), np.int64, len(values))  # (rows,)
    width = max(1, int(lengths.max()) if len(values) else 0)
    buffer = np.frombuffer("".join(values).encode("ascii") + bytes(width), dtype=np.uint8)
    starts = np.cumsum(lengths) - lengths  # (rows,)
    return Column(buffer[starts[:, None] + np.arange(width)],  # (rows, width)
                  np.arange(width) < lengths[:, None])


def take(rows: Column, index) -> Column:
    """Row i is row `index[i]` of `rows` (a table)."""
    index = np.asarray(index, dtype=np.int64)  # (n,)
    return Column(rows.chars[index], rows.keep[index])


def rows_text(columns: list[Column], rows: int) -> str:
    """Each row's columns side by side, rows joined by commas ("" for no rows)."""
    pieces = []
    for start in range(0, rows, CHUNK_ROWS):
        stop = min(rows, start + CHUNK_ROWS)
        pieces.append(_chunk(columns, start, stop))
    return ",".join(pieces)


def _chunk(columns: list[Column], start: int, stop: int) -> str:
    """Rows [start, stop) as text, joined by commas."""
    count = stop - start
    part = [c if len(c.chars) == 1 else Column(c.chars[start:stop], c.keep[start:stop])
            for c in columns + [constant(",")]]
    chars = np.concatenate([np.broadcast_to(c.chars, (count, c.chars.shape[1])) for c in part],
                           axis=1)  # (count, width)
    keep = np.concatenate([np.broadcast_to(c.keep, (count, c.keep.shape[1])) for c in part],
                          axis=1)  # (count, width)
    return chars[keep].tobytes()[:-1].decode("ascii")
