"""Sweep files: named variants, each a set of overrides on a base scenario (TOML).

    base = "../scenarios/paper-22b.toml"     # relative to the sweep file
    [[variant]]
    name = "K22 baseline"
    recompute_granularity = "full"           # any scenario field, or section.key
    num_layers_per_virtual_pipeline_stage = "none"   # "none" unsets an optional field
    sequence_parallel = false
    base = "../scenarios/paper-175b.toml"    # optional: this variant's own base
"""

import os
import tomllib
from pathlib import Path

from simsp.errors import UserError
from simsp.explore.configs import base_values
from simsp.explore.fields import by_key
from simsp.explore.world import WORLD_SIZE


def is_sweep_file(path: str | Path) -> bool:
    """A TOML file with [[variant]] tables (a scenario file has only sections)."""
    try:
        with open(path, "rb") as handle:
            return "variant" in tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return False  # read_toml reports it properly when loaded as a scenario


def _variant_values(where: str, body: dict, folder: Path, default_base) -> tuple[dict, set, str]:
    """One variant's full field values (its base scenario, then its overrides) and the paths
    it set itself; `world_size` is Megatron's (simsp.explore.world derives d from it)."""
    base = body.get("base", default_base)
    values = dict(base_values(folder / base if base else None))
    table = by_key()
    own = set()
    for key, value in body.items():
        if key in ("name", "base", "baseline"):
            continue
        if key == "world_size":
            values[WORLD_SIZE] = value
            own.add(WORLD_SIZE)
            continue
        field = table.get(key)
        if field is None:
            raise UserError(f"{where}.{key}", "unknown scenario field")
        values[field.path] = None if value == "none" and field.default is None else value
        own.add(field.path)
    return values, own, os.path.normpath(folder / base) if base else None


def load_sweep_file(path: str | Path) -> list[tuple[str, dict, set, str | None]]:
    """[(variant name, full field values, the paths it set, its scenario file)] in file order."""
    path = Path(path)
    with open(path, "rb") as handle:
        data = tomllib.load(handle)
    unknown = set(data) - {"base", "variant"}
    if unknown:
        raise UserError(f"{path.name}", f"unknown top-level keys: {', '.join(sorted(unknown))}")
    variants = data["variant"]
    if not isinstance(variants, list) or not variants:
        raise UserError(f"{path.name}.variant", "needs at least one [[variant]] table")
    found = []
    for i, body in enumerate(variants):
        name = body.get("name", f"variant {i}")
        found.append((name, *_variant_values(f"variant[{i}]", body, path.parent, data.get("base"))))
    return found
