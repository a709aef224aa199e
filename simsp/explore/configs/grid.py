"""Configurations to simulate: a base scenario, named variants, and the cartesian grid of lists.

A Config holds every scenario field's value (defaults filled in), so its digest is a hash of the
full configuration; `simsp.scenario.loading.load_scenario(None, config.overrides())` rebuilds the scenario.
"""

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from simsp.scenario.loading import read_toml
from simsp.errors import UserError
from simsp.explore.configs.fields import Field, all_fields, by_key, spell
from simsp.hardware.profiles import gpu_cluster_fields, system_cluster_fields


@dataclass(frozen=True)
class Config:
    """One configuration of a sweep: a display name and every field's value, in field order."""

    name: str
    values: tuple  # ((section, key), value) for every scenario field
    error: str | None = None  # known invalid before simulating (e.g. a world size t·p misses)
    note: str = ""  # what deriving d from the GPUs did (simsp.explore.configs.world)
    source: str | None = None  # the scenario file it starts from (for its `simsp run` command)

    def overrides(self) -> dict:
        """The {(section, key): value} that load_scenario turns into this scenario."""
        return dict(self.values)

    def digest(self) -> str:
        """sha256 of the full configuration and of simsp's version, code and model constants
        (simsp.explore.evaluation.cache.simulator_digest): the cache key; an invalid one's error
        too."""
        from simsp.explore.evaluation.cache import simulator_digest
        text = json.dumps([simulator_digest(), [[f"{s}.{k}", v] for (s, k), v in self.values]]
                          + ([self.error] if self.error else []))  # an invalid one is its own
        return hashlib.sha256(text.encode()).hexdigest()


def base_values(path: str | Path | None) -> dict:
    """Every field's value from a scenario file (or the built-in defaults), name included."""
    values = {f.path: f.default for f in all_fields()}
    if path is None:
        return values
    table = by_key()
    data = read_toml(path)
    values[("run", "name")] = Path(path).stem
    for section, body in data.items():
        for key, value in body.items():
            field = table.get(f"{section}.{key}")
            if field is None:
                raise UserError(f"{section}.{key}", f"unknown key in {path}")
            if isinstance(value, list):  # Megatron's list flags (recompute_modules, hierarchical
                value = " ".join(map(str, value))  # CP sizes) as the field's words
            values[field.path] = value
    return values


def parse_value(field: Field, text: str):
    """One item of a comma list, typed like the field: `4`, `0.5`, `true`, `selective`, `none`."""
    item = text.strip()
    if item.lower() == "none" and field.default is None:
        return None
    if field.kind is bool:
        if item.lower() not in ("true", "false"):
            raise UserError(field.flag, f"{item!r} is not true or false")
        return item.lower() == "true"
    try:
        return field.kind(item) if field.kind is not str else item
    except ValueError:
        raise UserError(field.flag, f"{item!r} is not {'an integer' if field.kind is int else 'a number'}") from None


def parse_list(field: Field, text: str) -> list:
    """A comma-separated list of values (`2,4,8`), each typed; empty items are errors."""
    items = str(text).split(",")
    if any(not item.strip() for item in items):
        raise UserError(field.flag, f"{text!r} has an empty item")
    return [parse_value(field, item) for item in items]


def expand(variants: list[tuple], axes: list[tuple[Field, list]],
           world_sizes: list[int] | None = None) -> list[Config]:
    """Every variant (name, values[, the paths it set itself[, its scenario file]]) times the cartesian product of
    the axes (and world sizes), in a fixed order; with a world size, or nodes changed without
    d, d is derived (simsp.explore.configs.world)."""
    from simsp.explore.configs.world import derive_world
    configs = []
    for variant in variants:
        variant_name, values = variant[0], variant[1]
        given = {field.path for field, _ in axes} | set(variant[2] if len(variant) > 2 else ())
        source = variant[3] if len(variant) > 3 else None
        for world in world_sizes or [None]:
            for combo in itertools.product(*(choices for _, choices in axes)):
                merged = dict(values)
                merged.update({field.path: value for (field, _), value in zip(axes, combo)})
                _fill_hardware(merged, given)
                merged, error, note = derive_world(merged, values, world, given)
                label = " ".join(spell(field, value) for (field, choices), value
                                 in zip(axes, combo) if len(choices) > 1)  # what varies
                shown_world = world and len(world_sizes) > 1
                label = " ".join(part for part in (f"--world-size {world}" if shown_world else "",
                                                   label) if part)
                name = " | ".join(part for part in (variant_name, label) if part)
                name = name or str(merged[("run", "name")])
                configs.append(Config(name, tuple(merged.items()), error, note, source))
    return configs


def _fill_hardware(values: dict, axis_keys: set) -> None:
    """A configuration's system (and GPU) fill the cluster keys they imply, as load_scenario
    does for a file (simsp/scenario/loading.py): here every key is present, so those still at their
    default and not swept take the profile's value. A bad name is left for the row's error."""
    defaults = {f.path: f.default for f in all_fields()}
    for name, implied in (("system", system_cluster_fields), ("gpu", gpu_cluster_fields)):
        profile = values.get(("cluster", name))
        if not isinstance(profile, str) or profile == defaults.get(("cluster", name)):
            continue
        try:
            fields = implied(profile)
        except UserError:
            continue
        for key, value in fields.items():
            path = ("cluster", key)
            if path not in axis_keys and values.get(path) == defaults.get(path):
                values[path] = value
