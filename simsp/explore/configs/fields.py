"""Every scenario field once: its section, python type and the command-line flag that sets it.

Flags come from simsp/scenario/flags.py's one table: a field's flag is `run`'s value flag, else the
switch that turns it on, else the one that turns it off (`--disable-bias-linear`: then
`inverted`, its list says whether the switch is given). A field with no row there (a table
left incomplete: tests/test_field_table.py fails) gets the spelling of its name.
"""

from dataclasses import MISSING, dataclass, fields

from simsp.scenario import config
from simsp.scenario import flags


@dataclass(frozen=True)
class Field:
    """One scenario field: `section.key`, its type, default and the flag that sets it."""

    section: str
    key: str
    kind: type
    default: object
    flag: str
    inverted: bool = False  # the flag is a switch setting the field to False

    @property
    def path(self) -> tuple[str, str]:
        return (self.section, self.key)


def _kind(annotation) -> type:
    """The python type a dataclass annotation asks for (bool before int: bool is an int)."""
    text = str(annotation)
    for kind in (bool, int, float):
        if kind.__name__ in text:
            return kind
    return str


def _table_flags() -> dict[tuple[str, str], str]:
    """(section, key) -> flag, from the value flags of simsp/scenario/flags.py."""
    return {(entry[0], entry[1]): flag for flag, entry in flags.SCENARIO_FLAGS.items()}


def _default(f):
    return f.default_factory() if f.default is MISSING else f.default


def all_fields() -> list[Field]:
    """Every field of every scenario section, in section and declaration order."""
    named, switches = _table_flags(), switch_flags()
    found = []
    for section, cls in config.SECTIONS.items():
        for f in fields(cls):
            path, on_off = (section, f.name), switches.get((section, f.name), {})
            flag = named.get(path) or on_off.get(True) or on_off.get(False)
            inverted = path not in named and True not in on_off and False in on_off
            found.append(Field(section, f.name, _kind(f.type), _default(f),
                               flag or "--" + f.name.replace("_", "-"), inverted))
    return found


def by_key() -> dict[str, Field]:
    """Field name -> Field (names are unique across sections; `section.key` also accepted)."""
    table = {}
    for f in all_fields():
        table[f.key] = f
        table[f"{f.section}.{f.key}"] = f
    return table


def switch_flags() -> dict[tuple[str, str], dict]:
    """(section, key) -> {value: switch flag}, e.g. sequence_parallel -> {True: ..., False: ...}."""
    table = {}
    for flag, entry in flags.SWITCHES.items():
        section, key, value = entry[0], entry[1], entry[2]
        table.setdefault((section, key), {})[value] = flag
    return table


def spell(field: Field, value) -> str:
    """The flags that set `field` to `value` (`--sequence-parallel`, `--micro-batch-size 2`), or
    `without --use-distributed-optimizer` where no flag sets the value (never `--flag false`)."""
    switch = switch_flags().get(field.path, {})
    if value in switch and isinstance(value, bool):
        return switch[value]
    if isinstance(value, bool) or value is None:  # no flag sets it: say it is not given
        return f"without {switch.get(True, field.flag)}"
    return f"{field.flag} {value}"
