"""The scenario of a measurement row: an inline [scenarios.NAME] of its file, a scenario TOML
(relative to the measurement file), or simsp's defaults; then the row's Megatron-style flags."""

from pathlib import Path
import shlex

from simsp.scenario.config import SECTIONS, Scenario
from simsp.scenario.loading import load_scenario
from simsp.errors import UserError
from simsp.scenario.flags import Parser, add_scenario_arguments, overrides_from_args
from simsp.validation.measurements import Measurement, MeasurementSet


class RowFlagParser(Parser):
    """The scenario flags of `simsp run` under its strict rules (no abbreviation, no repeat, no
    empty value), whose errors name the measurement row."""

    def __init__(self, where: str):
        super().__init__(prog=where, add_help=False)
        self.where = where
        add_scenario_arguments(self, positional=False, outside=False)

    def error(self, message):
        """argparse's error: one UserError naming the row, instead of exiting."""
        raise UserError(self.where, f"flags: {message}")


def flag_overrides(where: str, flags: str) -> dict:
    """{(section, key): value} of a flags string such as '--sequence-parallel --nodes 2'."""
    try:
        words = shlex.split(flags)
    except ValueError as exc:
        raise UserError(where, f"flags: {exc}") from None
    return overrides_from_args(RowFlagParser(where).parse_args(words))


def inline_overrides(where: str, name: str, sections: dict) -> dict:
    """{(section, key): value} of an inline scenario, its name as run.name."""
    if not isinstance(sections, dict):
        raise UserError(where, f"scenarios.{name} must be a table of scenario sections")
    found = {("run", "name"): name}
    for section, body in sections.items():
        if section not in SECTIONS or not isinstance(body, dict):
            raise UserError(where, f"scenarios.{name}.{section}: not a scenario section "
                                   f"(known: {', '.join(SECTIONS)})")
        found.update({(section, key): value for key, value in body.items()})
    return found


def scenario_of(mset: MeasurementSet, row: Measurement, flags: str) -> Scenario:
    """The validated scenario of `row` with `flags` (its own flags, or its baseline's)."""
    path = None
    overrides = {}
    if row.scenario in mset.scenarios:
        overrides = inline_overrides(row.where, row.scenario, mset.scenarios[row.scenario])
    elif row.scenario:
        path = mset.path.parent / row.scenario
        if not Path(path).is_file():
            raise UserError(row.where, f"scenario {row.scenario!r}: no such file or inline "
                                       "scenario")
    overrides.update(flag_overrides(row.where, flags))
    try:
        return load_scenario(path, overrides)
    except UserError as exc:
        raise UserError(row.where, str(exc)) from None
