"""Sweep files: named variants, each a set of overrides on a base scenario (TOML).

    base = "../scenarios/paper-22b.toml"     # relative to the sweep file
    [[variant]]
    name = "K22 baseline"
    recompute_granularity = "full"           # any scenario field, or section.key
    num_layers_per_virtual_pipeline_stage = "none"   # "none" unsets an optional field
    sequence_parallel = false
    base = "../scenarios/paper-175b.toml"    # optional: this variant's own base

The whole file is checked against this schema before any configuration is built: every error
is one `error: FILE:variant[i].key: reason` line.
"""

import os
from pathlib import Path

from simsp import io_in
from simsp.scenario.loading import _coerce
from simsp.errors import UserError
from simsp.explore.configs.grid import base_values
from simsp.explore.configs.fields import by_key
from simsp.explore.configs.world import WORLD_SIZE

MAX_VARIANTS = 10000  # the sweep's own configuration limit (simsp.explore.bounds) is lower
MAX_NAME_CHARS = 200


def is_sweep_file(path: str | Path) -> bool:
    """A TOML file with a top-level `variant` key (a scenario file has only sections)."""
    try:
        return "variant" in io_in.read_toml(path, "sweep")
    except UserError:
        return False  # read_toml reports it properly when loaded as a scenario


def _text(where: str, value, what: str) -> str:
    """A non-empty one-line string of printable characters (names land in reports)."""
    if not isinstance(value, str):
        raise UserError(where, f"{what} must be a string, got {value!r}")
    if not value.strip():
        raise UserError(where, f"{what} must not be empty")
    if not value.isprintable():
        raise UserError(where, f"{what} {value!r} has a control character or line break")
    if len(value) > MAX_NAME_CHARS:
        raise UserError(where, f"{what} is {len(value)} characters, above {MAX_NAME_CHARS}")
    return value


def _field_value(where: str, field, value):
    """A variant's value for one field, typed as the scenario file would type it."""
    if value == "none" and field.default is None:
        return None
    if isinstance(value, (dict, list)):
        raise UserError(where, f"must be a single value, got {value!r}")
    _coerce(field.section, field.key, value, field.kind)  # the scenario file's type rules
    return value


def _variant_values(where: str, body: dict, folder: Path, default_base) -> tuple[dict, set, str]:
    """One variant's full field values (its base scenario, then its overrides) and the paths
    it set itself; `world_size` is Megatron's (simsp.explore.configs.world derives d from it)."""
    base = body.get("base", default_base)
    if base is not None:
        _text(f"{where}.base", base, "base")
    values = dict(base_values(folder / base if base else None))
    table = by_key()
    own = set()
    for key, value in body.items():
        if key == "baseline" and not isinstance(value, bool):  # whatif's mark: true or false
            raise UserError(f"{where}.baseline", f"must be true or false, got {value!r}")
        if key in ("name", "base", "baseline"):
            continue
        if key == "world_size":
            values[WORLD_SIZE] = value
            own.add(WORLD_SIZE)
            continue
        field = table.get(key)
        if field is None:
            raise UserError(f"{where}.{key}", "unknown scenario field")
        try:
            values[field.path] = _field_value(f"{where}.{key}", field, value)
        except UserError as exc:
            raise UserError(f"{where}.{key}", exc.reason) from None
        own.add(field.path)
    return values, own, os.path.normpath(folder / base) if base else None


def load_sweep_file(path: str | Path) -> list[tuple[str, dict, set, str | None]]:
    """[(variant name, full field values, the paths it set, its scenario file)] in file order,
    the schema checked first."""
    path = Path(path)
    data = io_in.read_toml(path, "sweep")
    unknown = set(data) - {"base", "variant"}
    if unknown:
        raise UserError(f"{path}", f"unknown top-level keys: {', '.join(sorted(unknown))} "
                                   "(known: base, variant)")
    if "base" in data:
        _text(f"{path}:base", data["base"], "base")
    variants = data["variant"]
    if not isinstance(variants, list) or not variants or \
            not all(isinstance(body, dict) for body in variants):
        raise UserError(f"{path}:variant", "needs one or more [[variant]] tables")
    if len(variants) > MAX_VARIANTS:
        raise UserError(f"{path}:variant", f"{len(variants)} variants, above {MAX_VARIANTS}")
    found, names = [], {}
    for i, body in enumerate(variants):
        where = f"{path}:variant[{i}]"
        name = _text(f"{where}.name", body.get("name", f"variant {i}"), "name")
        if name in names:
            raise UserError(f"{where}.name", f"{name!r} is also variant[{names[name]}]'s name")
        names[name] = i
        found.append((name, *_variant_values(where, body, path.parent, data.get("base"))))
    return found
