"""The `simsp run` command line that reproduces one row of a sweep or search: the scenario file
and the flags of every field whose value differs from it, spelled as `run` accepts them
(switches alone, `--no-...` to turn one off, never `--flag false` or `--flag none`)."""

import shlex
from functools import lru_cache

from simsp.errors import UserError
from simsp.hardware.cluster_hardware import gpu_cluster_fields, system_cluster_fields
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


def _flags_from(values: dict, source: str | None) -> list[str] | None:
    """Flags turning the scenario file `source` into `values` (the [cluster] keys a given
    --system or --gpu implies left out when `run` fills the same values from it), or None if
    one field has no run flag for its value."""
    spelled = []
    for path in _needed(values, source):
        flag = run_flag(path, values[path])
        if flag is None:
            return None
        spelled.append(flag)
    return spelled


def _needed(values: dict, source: str | None) -> list[tuple]:
    """The fields to give, in field order: those that differ from the file, less the keys the
    profiles imply (all of them, else all but the GPU) when `run` resolves the rest to `values`."""
    start = dict(_start(source))
    changed = [f.path for f in all_fields()
               if f.path not in SKIPPED and values[f.path] != start[f.path]]
    implied = _implied(values) & set(changed)
    for dropped in (implied, implied - {("cluster", "gpu")}):
        kept = [path for path in changed if path not in dropped]
        if dropped and _resolves(values, source, kept):
            return kept
    return changed


def _implied(values: dict) -> set:
    """The [cluster] paths the configuration's system and GPU profiles fill."""
    found = set()
    for name, implied in (("system", system_cluster_fields), ("gpu", gpu_cluster_fields)):
        profile = values.get(("cluster", name))
        if isinstance(profile, str):
            try:
                found |= {("cluster", key) for key in implied(profile)}
            except UserError:
                continue
    return found


def _resolves(values: dict, source: str | None, given: list) -> bool:
    """Whether `run SOURCE` with flags for `given` alone resolves to `values` (name aside)."""
    resolved = base_values(source, {path: values[path] for path in given})
    return all(resolved[path] == values[path] for path in resolved if path not in SKIPPED)


@lru_cache(maxsize=64)
def _start(source: str | None) -> tuple:
    """A scenario file's (or the defaults') field values, read once per file."""
    return tuple(base_values(source).items())


def run_command(values: dict, source: str | None = None) -> str | None:
    """`simsp run SCENARIO --flag value ...` reproducing `values` (from the scenario file when
    every difference has a flag, else from the built-in defaults); None if neither can."""
    if source is not None:
        spelled = _flags_from(values, source)
        if spelled is not None:
            return " ".join(["simsp run", shlex.quote(str(source)), *spelled])
    spelled = _flags_from(values, None)
    return None if spelled is None else " ".join(["simsp run", *spelled])
