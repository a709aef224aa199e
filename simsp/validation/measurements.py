"""Measurement files for `simsp validate`: CSV or TOML rows of (configuration, metric, value).

CSV: a header row, then one measurement per row. Columns (any order):
  name        what was measured (free text)
  scenario    path of a scenario TOML, relative to the CSV's folder; empty: simsp's defaults
  flags       Megatron-style flags applied on top of the scenario (`simsp run`'s flags)
  metric      one of simsp.validation.quantities.METRICS
  measured    the measured value, a number in `unit`
  unit        a unit of the metric's dimension (quantities.UNITS)
  group       optional: rows are reported per group (default: the file's stem)
  baseline    activation_ratio only: flags of the baseline configuration, applied to the same
              scenario instead of `flags` (empty: the scenario itself)
  collective  busbw only: all_reduce, reduce_scatter or all_gather (over every GPU)
  size        busbw only: message size, nccl-tests style (8, 256K, 1M, 8G)
TOML: the same keys in `[[measurement]]` tables; optional `[groups.NAME]` (title, note, and
`default = false` for a group that runs only when `--only` names it) and
`[scenarios.NAME]` tables holding scenario sections inline, which `scenario = "NAME"` selects.
"""

import csv
from dataclasses import dataclass
from pathlib import Path
import tomllib

from simsp import io_in
from simsp.errors import UserError

REQUIRED = ("name", "scenario", "flags", "metric", "measured", "unit")
OPTIONAL = ("group", "baseline", "collective", "size")
MAX_ROWS = 10000  # measurements in one file


@dataclass(frozen=True)
class Measurement:
    """One measured number and how to reproduce it."""

    where: str  # FILE:LINE (CSV) or FILE:measurement[i] (TOML), for error messages
    group: str
    name: str
    scenario: str  # path, inline scenario name, or "" for defaults
    flags: str
    metric: str
    measured: float
    unit: str
    baseline: str = ""  # activation_ratio: flags of the baseline ("" = the scenario itself)
    collective: str | None = None
    size: str | None = None


@dataclass(frozen=True)
class MeasurementSet:
    """Every row of a file, the group titles and the inline scenarios it defines."""

    path: Path
    rows: tuple[Measurement, ...]
    groups: dict  # group -> {"title": ..., "note": ...}
    scenarios: dict  # name -> {section: {key: value}}


def read_measurements(path: str | Path) -> MeasurementSet:
    """Read a .csv or .toml measurement file."""
    path = Path(path)
    if path.suffix.lower() not in (".csv", ".toml"):
        raise UserError(str(path), "measurements must be a .csv or .toml file")
    text = _read_text(path)
    return _from_csv(path, text) if path.suffix.lower() == ".csv" else _from_toml(path, text)


def _read_text(path: Path) -> str:
    """The file's text, with I/O problems as UserErrors."""
    return io_in.read_text(path, "measurements")


def _from_csv(path: Path, text: str) -> MeasurementSet:
    """Rows of a CSV file with a header naming the columns."""
    reader = csv.DictReader(text.splitlines())
    _check_columns(path, reader.fieldnames or [])
    rows = []
    for record in reader:
        where = f"{path}:{reader.line_num}"
        if None in record or None in record.values():
            raise UserError(where, f"expected {len(reader.fieldnames)} fields")
        rows.append(_row(where, record, path.stem))
        _check_count(path, len(rows))
    if not rows:
        raise UserError(str(path), "no measurements")
    return MeasurementSet(path, tuple(rows), {}, {})


def _check_columns(path: Path, columns: list[str]) -> None:
    """The header must have every required column and no unknown one."""
    missing = [c for c in REQUIRED if c not in columns]
    unknown = [c for c in columns if c not in REQUIRED + OPTIONAL]
    if missing:
        raise UserError(f"{path}:1", f"missing column(s) {', '.join(missing)} (required: "
                                     f"{', '.join(REQUIRED)})")
    if unknown:
        raise UserError(f"{path}:1", f"unknown column(s) {', '.join(unknown)} (known: "
                                     f"{', '.join(REQUIRED + OPTIONAL)})")


def _from_toml(path: Path, text: str) -> MeasurementSet:
    """[[measurement]] tables, [groups.*] and [scenarios.*]."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(str(path), f"is not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"measurement", "groups", "scenarios"})
    if unknown:
        raise UserError(str(path), f"unknown table(s) {', '.join(unknown)} (known: measurement, "
                                   "groups, scenarios)")
    records = data.get("measurement", [])
    if not isinstance(records, list) or not records:
        raise UserError(str(path), "no [[measurement]] tables")
    if not all(isinstance(record, dict) for record in records):
        raise UserError(f"{path}:measurement", "must be [[measurement]] tables")
    for table in ("groups", "scenarios"):
        if not isinstance(data.get(table, {}), dict) or \
                not all(isinstance(v, dict) for v in data.get(table, {}).values()):
            raise UserError(f"{path}:{table}", f"must be [{table}.NAME] tables")
    _check_count(path, len(records))
    rows = []
    for index, record in enumerate(records):
        where = f"{path}:measurement[{index}]"
        _check_types(where, record)
        unknown_keys = sorted(set(record) - set(REQUIRED + OPTIONAL))
        if unknown_keys:
            raise UserError(where, f"unknown key(s) {', '.join(unknown_keys)}")
        missing = [k for k in REQUIRED if k not in record]
        if missing:
            raise UserError(where, f"missing key(s) {', '.join(missing)}")
        rows.append(_row(where, {k: v for k, v in record.items()}, path.stem))
    return MeasurementSet(path, tuple(rows), data.get("groups", {}), data.get("scenarios", {}))


def _check_count(path: Path, count: int) -> None:
    """At most MAX_ROWS measurements in one file (each may simulate an iteration)."""
    if count > MAX_ROWS:
        raise UserError(str(path), f"{count} measurements, above the limit of {MAX_ROWS}")


def _check_types(where: str, record: dict) -> None:
    """TOML values: text for every key but `measured`, a number for it."""
    for key, value in record.items():
        if key == "measured":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise UserError(f"{where}.measured", f"must be a number, got {value!r}")
        elif not isinstance(value, str):
            raise UserError(f"{where}.{key}", f"must be a string, got {value!r}")


def _row(where: str, record: dict, default_group: str) -> Measurement:
    """One Measurement from a CSV/TOML record (strings, and `measured` a number)."""
    text = {k: str(record.get(k) or "").strip() for k in REQUIRED + OPTIONAL if k != "measured"}
    for key in ("name", "metric", "unit"):
        if not text[key]:
            raise UserError(where, f"{key} is empty")
    for key, value in text.items():  # printed in tables and reports: one line each
        if not value.isprintable():
            raise UserError(where, f"{key} {value!r} must be one line of printable text")
    return Measurement(where, text["group"] or default_group, text["name"], text["scenario"],
                       text["flags"], text["metric"], _measured(where, record["measured"]),
                       text["unit"], text["baseline"], text["collective"] or None,
                       text["size"] or None)


def _measured(where: str, value) -> float:
    """The measured value: a positive number."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UserError(where, f"measured {value!r} is not a number") from None
    if not 0 < number < float("inf"):
        raise UserError(where, f"measured {value!r} must be positive and finite")
    return number
