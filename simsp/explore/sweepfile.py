"""Sweep files: named variants, each a set of overrides on a base scenario (TOML).

    base = "../scenarios/paper-22b.toml"     # relative to the sweep file
    [[variant]]
    name = "K22 baseline"
    recompute_granularity = "full"           # any scenario field, or section.key
    num_layers_per_virtual_pipeline_stage = "none"   # "none" unsets an optional field
    sequence_parallel = false
    base = "../scenarios/paper-175b.toml"    # optional: this variant's own base
"""

import tomllib
from pathlib import Path

from simsp.errors import UserError
from simsp.explore.configs import base_values
from simsp.explore.fields import by_key


def is_sweep_file(path: str | Path) -> bool:
    """A TOML file with [[variant]] tables (a scenario file has only sections)."""
    try:
        with open(path, "rb") as handle:
            return "variant" in tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return False  # read_toml reports it properly when loaded as a scenario


def _variant_values(where: str, body: dict, folder: Path, default_base) -> dict:
    """One variant's full field values: its base scenario, then its overrides."""
    base = body.get("base", default_base)
    values = dict(base_values(folder / base if base else None))
    table = by_key()
    for key, value in body.items():
        if key in ("name", "base"):
            continue
        field = table.get(key)
        if field is None:
            raise UserError(f"{where}.{key}", "unknown scenario field")
        values[field.path] = None if value == "none" and field.default is None else value
    return values


def load_sweep_file(path: str | Path) -> list[tuple[str, dict]]:
    """[(variant name, full field values)] in file order."""
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
        found.append((name, _variant_values(f"variant[{i}]", body, path.parent, data.get("base"))))
    return found
