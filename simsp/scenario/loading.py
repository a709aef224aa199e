"""A Scenario from a TOML file and {(section, key): value} overrides, each value's type checked
against the field table, the whole validated (scenario/checks/); and a validated copy with
some fields replaced."""

from dataclasses import replace
from pathlib import Path

from simsp import io_in
from simsp.errors import UserError
from simsp.hardware.cluster_hardware import gpu_cluster_fields, system_cluster_fields
from simsp.scenario.checks import validate
from simsp.scenario.checks.rule import check
from simsp.scenario.config import SECTIONS, Cluster, Parallel, Scenario
from simsp.scenario.table import SECTION_ROWS
from simsp.scenario.table.row import INT_OR_STR


def _coerce(section: str, key: str, value, kind: type):
    """Check one value's type: bool is not an int, an int is a fine float."""
    name = f"{section}.{key}"
    if value is None:
        return None
    if kind is bool:
        if not isinstance(value, bool):
            raise UserError(name, f"must be true or false, got {value!r}")
    elif kind is INT_OR_STR:  # --moe-layer-freq: N or a pattern string
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise UserError(name, f"must be an integer or a pattern string, got {value!r}")
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(name, f"must be an integer, got {value!r}")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(name, f"must be a number, got {value!r}")
        value = float(value)
    elif not isinstance(value, str):
        raise UserError(name, f"must be a string, got {value!r}")
    return value


def _build_section(section: str, values: dict):
    """Build one section's dataclass from a dict, rejecting unknown keys."""
    kinds = {row.name: row.kind for row in SECTION_ROWS[section]}
    for key in values:
        if key not in kinds:
            known = ", ".join(sorted(kinds))
            raise UserError(f"{section}.{key}", f"unknown key (known: {known})")
    if isinstance(values.get("recompute_modules"), list):  # Megatron's list, as TOML writes it
        words = values["recompute_modules"]
        if not all(isinstance(w, str) for w in words):
            raise UserError(f"{section}.recompute_modules", "must be a list of module names")
        values = {**values, "recompute_modules": " ".join(words)}
    values = _joined_sizes(section, values)
    return SECTIONS[section](**{k: _coerce(section, k, v, kinds[k]) for k, v in values.items()})


def _joined_sizes(section: str, values: dict) -> dict:
    """hierarchical_context_parallel_sizes as TOML writes Megatron's list ([2, 2]) -> "2 2"."""
    sizes = values.get("hierarchical_context_parallel_sizes")
    if sizes is None or isinstance(sizes, str):  # unset, or Megatron's words as one string
        return values
    if not (isinstance(sizes, list)
            and all(isinstance(n, int) and not isinstance(n, bool) for n in sizes)):
        raise UserError(f"{section}.hierarchical_context_parallel_sizes",
                        f"must be a list of integers, got {sizes!r}")
    return {**values, "hierarchical_context_parallel_sizes": " ".join(map(str, sizes))}


def read_toml(path: str | Path) -> dict:
    """Read a scenario file into nested dicts (simsp.io_in: size-capped, one UserError naming
    the file for I/O and syntax problems)."""
    data = io_in.read_toml(path, "scenario")
    for section, body in data.items():
        if not isinstance(body, dict):
            raise UserError(section, f"must be inside a [section] (known: {', '.join(SECTIONS)})")
        if section not in SECTIONS:
            raise UserError(section, f"unknown section (known: {', '.join(SECTIONS)})")
    return data


def scenario_data(path: str | Path | None = None, overrides: dict | None = None,
                  world_size: int | None = None, lenient: bool = False) -> dict:
    """The one path from a file and flags to a configuration, as nested {section: {key: value}}:
    the TOML file, then `overrides` {(section, key): value}, then the [cluster] keys the system
    and GPU profiles imply (given keys win), then d (and the nodes) from `world_size`, then the
    run's name; unvalidated. `lenient`: an unknown profile fills nothing (the validation that
    follows names it), so a sweep row can carry the error."""
    data = read_toml(path) if path else {}
    for (section, key), value in (overrides or {}).items():
        data.setdefault(section, {})[key] = value
    _fill_from_hardware(data.setdefault("cluster", {}), lenient)
    if world_size is not None:
        _derive_data_parallel(data, world_size, ("parallel", "data_parallel_size") in (overrides or {}))
        _derive_nodes(data, world_size, ("cluster", "nodes") in (overrides or {}))
    if path and "name" not in data.get("run", {}):
        data.setdefault("run", {})["name"] = Path(path).stem
    return data


def load_scenario(path: str | Path | None = None, overrides: dict | None = None,
                  world_size: int | None = None) -> Scenario:
    """Scenario from an optional TOML file, then `overrides` {(section, key): value}, validated
    (scenario_data says in what order). A `world_size` (Megatron's --world-size) derives
    data_parallel_size = world / (t * cp * p) and nodes = world / GPUs per node."""
    data = scenario_data(path, overrides, world_size)
    scenario = Scenario(**{s: _build_section(s, data.get(s, {})) for s in SECTIONS})
    validate(scenario)
    return scenario


def _fill_from_hardware(cluster: dict, lenient: bool = False) -> None:
    """A system profile fills the [cluster] keys it implies (gpu, gpus_per_node, link speeds),
    then the GPU profile its NVLink speed; keys the scenario or a flag gives win."""
    for name, kind in (("system", system_cluster_fields), ("gpu", gpu_cluster_fields)):
        if isinstance(cluster.get(name), str):
            try:
                implied = kind(cluster[name])
            except UserError:
                if not lenient:
                    raise
                continue
            for key, value in implied.items():
                cluster.setdefault(key, value)


def _derive_nodes(data: dict, world_size: int, explicit_nodes: bool) -> None:
    """nodes = ceil(world / GPUs per node) unless --nodes is given, as `sweep --world-size`
    does (simsp/explore/configs/world.py)."""
    cluster = data.setdefault("cluster", {})
    per_node = cluster.get("gpus_per_node", Cluster.gpus_per_node)
    if explicit_nodes or isinstance(per_node, bool) or not isinstance(per_node, int) \
            or per_node < 1:
        return  # the cluster's own checks name a bad gpus_per_node
    cluster["nodes"] = -(-world_size // per_node)


def _derive_data_parallel(data: dict, world_size: int, explicit_d: bool) -> None:
    """d = world / (t * p), as Megatron's initialize does; an explicit, different d conflicts."""
    parallel = data.setdefault("parallel", {})
    t = parallel.get("tensor_model_parallel_size", Parallel.tensor_model_parallel_size)
    p = parallel.get("pipeline_model_parallel_size", Parallel.pipeline_model_parallel_size)
    c = parallel.get("context_parallel_size", Parallel.context_parallel_size)
    check(world_size > 0, "--world-size", f"must be positive, got {world_size}")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (t, p, c)):
        return  # the section's own checks will name the bad t, p or cp
    if c == 1:
        check(world_size % (t * p) == 0, "--world-size",
              f"{world_size} is not divisible by tensor*pipeline = {t}*{p} = {t * p}")
    else:  # Megatron-LM initialize: world = t * cp * d * p
        check(world_size % (t * c * p) == 0, "--world-size",
              f"{world_size} is not divisible by tensor*context*pipeline = {t}*{c}*{p} = "
              f"{t * c * p}")
    d = world_size // (t * c * p)
    given = parallel.get("data_parallel_size")
    check(not explicit_d or given == d, "--world-size",
          f"gives data_parallel_size {d} but --data-parallel-size is {given}")
    parallel["data_parallel_size"] = d


def with_overrides(s: Scenario, **sections) -> Scenario:
    """A copy with some fields replaced, e.g. with_overrides(s, parallel={"tensor_model_parallel_size": 2})."""
    parts = {name: replace(getattr(s, name), **values) for name, values in sections.items()}
    result = replace(s, **parts)
    validate(result)
    return result
