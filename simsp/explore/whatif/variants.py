"""What-if against a baseline: a scenario and named variants (each a set of `simsp run` flags),
or a sweep file whose variant marked `baseline = true` (else its first) is the baseline; every
variant compared with the baseline on time, throughput, cost, memory and exposure."""

import shlex

from simsp import io_in
from simsp.errors import UserError, one_line
from simsp.explore.configs.grid import base_values, expand, parse_value
from simsp.explore.configs.fields import all_fields, switch_flags
from simsp.explore.configs.sweep_file import load_sweep_file
from simsp.explore.configs.world import WORLD_SIZE
from simsp.report.whatif.comparison import OBJECTIVES
from simsp.scenario.flags import Parser, add_scenario_flags, overrides_from_args


def _flag_table() -> dict:
    """flag -> (path, value or None when the flag takes one, the field or None)."""
    table = {"--world-size": (WORLD_SIZE, None, None)}
    for field in all_fields():
        table[field.flag] = (field.path, None, field)
    for path, switches in switch_flags().items():
        for value, flag in switches.items():
            table[flag] = (path, value, None)
    return table


def parse_variant(spec: str) -> tuple[str, dict]:
    """`NAME=FLAGS` (e.g. `IB 2x=--ib-bandwidth-GBps 50`) -> (name, {path: value})."""
    name, equals, flags = spec.partition("=")
    if not equals or not name.strip():
        raise UserError("variant", f"{spec!r} is not NAME=FLAGS (e.g. 'IB 2x=--ib-bandwidth-GBps 50')")
    if not name.isprintable() or len(name) > 200:  # it names figures, tables and the page
        raise UserError("variant", f"{name!r}: a name is one line of at most 200 printable "
                                   "characters")
    try:
        tokens = shlex.split(flags)
    except ValueError as exc:  # an unclosed quote
        raise UserError("variant", f"{name.strip()}: {exc}") from None
    table, changes = _flag_table(), {}
    while tokens:
        flag = tokens.pop(0)
        if flag not in table:
            raise UserError("variant", f"{name.strip()}: unknown flag {flag!r}")
        path, value, field = table[flag]
        if path in changes:  # as `run` refuses a flag given twice, under any of its names
            raise UserError("variant", f"{name.strip()}: {flag} given twice")
        if value is None:
            if not tokens:
                raise UserError("variant", f"{name.strip()}: {flag} needs a value")
            text = tokens.pop(0)
            if field is None:  # --world-size
                if not (text.isascii() and text.isdigit()) or int(text) < 1:
                    raise UserError("--world-size", f"{text!r} is not a positive integer")
                value = int(text)
            else:
                value = parse_value(field, text)
        changes[path] = value
    return name.strip(), changes


class _BaselineParser(Parser):
    """`simsp run`'s flag parser whose every error names --baseline-flags."""

    def error(self, message):
        raise UserError("--baseline-flags", one_line(message))


def baseline_changes(text: str | None) -> dict:
    """`--baseline-flags 'FLAGS'`, parsed by `simsp run`'s own flag parser (scenario/flags.py)
    and --world-size, as {path: value}; {} when not given."""
    if text is None:
        return {}
    parser = _BaselineParser(prog="--baseline-flags", add_help=False)
    add_scenario_flags(parser)
    parser.add_argument("--world-size", dest="world_size", type=int, default=None)
    try:
        tokens = shlex.split(text)
    except ValueError as exc:  # an unclosed quote
        raise UserError("--baseline-flags", str(exc)) from None
    args = parser.parse_args(tokens)
    changes = overrides_from_args(args)
    if args.world_size is not None:
        if args.world_size < 1:
            raise UserError("--baseline-flags", f"--world-size {args.world_size} is not positive")
        changes[WORLD_SIZE] = args.world_size
    return changes


def variants_from_specs(scenario, specs: list[str], baseline_flags: str | None = None) -> list[tuple]:
    """The baseline (the scenario with `baseline_flags`, run's flags) and each NAME=FLAGS
    variant on top of it, as expand() variants."""
    own = baseline_changes(baseline_flags)
    base = base_values(scenario)
    base.update(own)
    source = None if scenario is None else str(scenario)
    found = [("baseline", base, set(own), source)]
    for spec in specs:
        name, changes = parse_variant(spec)
        values = dict(base)
        values.update(changes)
        found.append((name, values, set(own) | set(changes), source))
    return found


def variants_from_sweep_file(path) -> list[tuple]:
    """A sweep file's variants, the one marked `baseline = true` (else the first) first."""
    variants = load_sweep_file(path)  # checks the file's schema first (simsp/io_in.py)
    marks = [bool(body.get("baseline")) for body in io_in.read_toml(path, "sweep")["variant"]]
    if sum(marks) > 1:
        raise UserError("baseline", f"{path}: more than one variant is marked baseline = true")
    first = marks.index(True) if True in marks else 0
    return [variants[first], *variants[:first], *variants[first + 1:]]


def whatif_configs(variants: list[tuple]):
    """One Config per variant, in order (the baseline first)."""
    return expand(variants, [])


def add_derived(row: dict) -> dict:
    """Throughput per GPU and cost: GPU-hours per million tokens = GPUs·T / 3600 / (tokens / 1e6)."""
    if row.get("status") in ("ok", "oom"):
        tokens = row["tokens_per_s"] * row["iteration_time_s"]
        row["tokens_per_s_per_gpu"] = row["tokens_per_s"] / row["gpus"]
        row["gpu_hours_per_million_tokens"] = row["gpus"] * row["iteration_time_s"] / 3600 / (tokens / 1e6)
    return row



def rank_rows(rows: list[dict], objective: str) -> list[dict]:
    """Rows that fit, best first by the objective; then those that do not fit; then errors."""
    column, larger = OBJECTIVES[objective]

    def key(row):
        if row["status"] == "error":
            return (2, 0.0)
        value = row[column]
        return (0 if row.get("fits", row["status"] == "ok") else 1, -value if larger else value)
    return sorted(rows, key=key)
