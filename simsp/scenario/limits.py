"""Per-field limits, made from the field table: every numeric field finite and inside its
documented range, every choice field one of its choices.

BOUNDS (field -> Bound) is the single source of the ranges (README "Limits" repeats it); the
rows of simsp/scenario/table/ give them.
"""

import math

from simsp.errors import UserError
from simsp.scenario.table import FIELDS, SECTION_ROWS

BOUNDS = {row.path: row.bound for row in FIELDS if row.bound is not None}


def _number(x: float) -> str:
    """A limit as people write it: 4096, not 4096.0 or 4.096e+03."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def check_field(name: str, value) -> None:
    """Reject a non-finite value or one outside BOUNDS[name] (None means 'not set')."""
    bound = BOUNDS.get(name)
    if value is None or bound is None or isinstance(value, (bool, str)):
        return
    if not math.isfinite(value):
        raise UserError(name, f"must be a finite number, got {value}")
    if not bound.low <= value <= bound.high:
        unit = f" {bound.unit}" if bound.unit else ""
        raise UserError(name, f"{value} is outside [{_number(bound.low)}, "
                              f"{_number(bound.high)}]{unit} ({bound.why})")


def check_ranges(sections: dict) -> None:
    """check_field on every field of every section ({'model': Model(...), ...})."""
    for section, obj in sections.items():
        for key, value in vars(obj).items():
            check_field(f"{section}.{key}", value)


def check_choices(sections: dict) -> None:
    """Every field with choices holds one of them (None where its default is None: not set)."""
    for section, obj in sections.items():
        for row in SECTION_ROWS[section]:
            value = getattr(obj, row.name)
            if row.choices is None or (value is None and row.default is None):
                continue
            if value not in row.choices:
                raise UserError(row.path, f"must be one of {', '.join(row.choices)}, "
                                          f"got {value!r}")
