"""The `simsp run` command line that reproduces one row of a sweep or search: the scenario file
and the flags of every field whose value differs from it, spelled as `run` accepts them
(switches alone, `--no-...` to turn one off, never `--flag false` or `--flag none`)."""

import shlex
from functools import lru_cache

from simsp.scenario import flags
from simsp.explore.configs.grid import base_values
from simsp.explore.configs.fields import all_fields

SKIPPED = (("run", "name"),)  # names the report folder only


def _switches() -> dict:
    """(section, key, value) -> the run switch that sets it."""
    return {(entry[0], entry[1], entry[2]): flag for flag, entry in flags.SWITCHES.items()}


def _value_flags() -> dict:
    """(section, key) -> the run flag that takes a value."""
    return {(entry[0], entry[1]): flag for flag, entry in flags.SCENARIO_FLAGS.items()}


def run_flag(path: tuple, value) -> str | None:
    """The `run` flag setting `path` to `value`, or None when `run` has none for it."""
    switch = _switches().get((*path, value)) if isinstance(value, bool) else None
    if switch:
        return switch
    flag = _value_flags().get(path)
    if flag is None or value is None or isinstance(value, bool):
        return None
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return f"{flag} {shlex.quote(text)}"


def _flags_from(values: dict, start: dict) -> list[str] | None:
    """Flags turning `start` into `values`, or None if one field has no run flag for its value."""
    spelled = []
    for field in all_fields():
        path = field.path
        if path in SKIPPED or values[path] == start[path]:
            continue
        flag = run_flag(path, values[path])
        if flag is None:
            return None
        spelled.append(flag)
    return spelled


@lru_cache(maxsize=64)
def _start(source: str | None) -> tuple:
    """A scenario file's (or the defaults') field values, read once per file."""
    return tuple(base_values(source).items())


def run_command(values: dict, source: str | None = None) -> str | None:
    """`simsp run SCENARIO --flag value ...` reproducing `values` (from the scenario file when
    every difference has a flag, else from the built-in defaults); None if neither can."""
    if source is not None:
        spelled = _flags_from(values, dict(_start(source)))
        if spelled is not None:
            return " ".join(["simsp run", shlex.quote(str(source)), *spelled])
    spelled = _flags_from(values, dict(_start(None)))
    return None if spelled is None else " ".join(["simsp run", *spelled])
