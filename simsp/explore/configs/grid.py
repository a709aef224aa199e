"""Configurations to simulate: a base scenario, named variants, and the cartesian grid of lists.

A Config holds every scenario field's value (defaults filled in), so its digest is a hash of the
full configuration; `simsp.scenario.loading.load_scenario(None, config.overrides())` rebuilds the scenario.
"""

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from simsp.scenario.loading import scenario_data
from simsp.errors import UserError
from simsp.explore.configs.fields import Field, all_fields, by_key, spell


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


def base_values(path: str | Path | None, overrides: dict | None = None) -> dict:
    """Every field's value from a scenario file (or the built-in defaults) and `overrides`
    {(section, key): value}, name included, resolved as `run` resolves them
    (simsp.scenario.loading.scenario_data: the profiles' implied [cluster] keys filled)."""
    values = {f.path: f.default for f in all_fields()}
    table = by_key()
    for section, body in scenario_data(path, overrides, lenient=True).items():
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
    """Every variant (name, values[, the paths it set itself[, its scenario file]]) times the
    cartesian product of the axes (and world sizes), in a fixed order. Each configuration is
    resolved from its scenario file and its own values as `run` resolves flags (base_values);
    d is derived from a world size, from nodes changed without d, or from the GPUs kept when
    t, p or cp change (simsp.explore.configs.world)."""
    from simsp.explore.configs.world import world_of
    configs = []
    for variant in variants:
        own = set(variant[2] if len(variant) > 2 else ())
        given = {field.path for field, _ in axes} | own
        source = variant[3] if len(variant) > 3 else None
        kept = world_of(base_values(source))  # the scenario's GPUs, kept when t, p or cp change
        for world in world_sizes or [None]:
            for combo in itertools.product(*(choices for _, choices in axes)):
                changes = {field.path: value for (field, _), value in zip(axes, combo)}
                configs.append(_config(variant, own, given, changes, (world, kept),
                                       _label(axes, combo, world, world_sizes)))
    return configs


def _label(axes: list, combo: tuple, world: int | None, world_sizes: list | None) -> str:
    """What varies in this configuration: `--world-size 64 --tensor-model-parallel-size 8`."""
    label = " ".join(spell(field, value) for (field, choices), value
                     in zip(axes, combo) if len(choices) > 1)
    shown_world = world and len(world_sizes) > 1
    return " ".join(part for part in (f"--world-size {world}" if shown_world else "", label)
                    if part)


def _config(variant: tuple, own: set, given: set, changes: dict, worlds: tuple,
            label: str) -> Config:
    """One configuration: the variant's own values and the axes' `changes` resolved from its
    scenario file, then d derived from `worlds` (the world size asked for or None, the
    scenario's GPUs)."""
    from simsp.explore.configs.world import WORLD_SIZE, derive_world
    variant_name, values = variant[0], variant[1]
    source = variant[3] if len(variant) > 3 else None
    overrides = {path: values[path] for path in own if path != WORLD_SIZE}
    merged = base_values(source, {**overrides, **changes})
    if WORLD_SIZE in own:
        merged[WORLD_SIZE] = values[WORLD_SIZE]
    merged, error, note = derive_world(merged, values, worlds[0], given, worlds[1])
    name = " | ".join(part for part in (variant_name, label) if part)
    return Config(name or str(merged[("run", "name")]), tuple(merged.items()), error, note,
                  source)
