"""Strict JSON for every document simsp prints or writes: numpy scalars become Python numbers,
and a non-finite float (NaN, ±inf: not JSON, RFC 8259 §6) becomes null rather than invalid text."""

import json
import math

import numpy as np


def _plain(value):
    """A JSON-ready copy: numpy scalars and arrays as Python values, non-finite floats as None."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, (np.generic, np.ndarray)):
        return _plain(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dumps(document, indent: int | None = None) -> str:
    """json.dumps with allow_nan=False after _plain, in the document's own key order."""
    return json.dumps(_plain(document), indent=indent, allow_nan=False)
