"""One row of the scenario field table: a setting's name, section, type, default, range, unit,
help and flags, written once (simsp/scenario/table/ holds the rows; docs/ARCHITECTURE.md).

Every non-boolean field has a value flag spelled as Megatron-LM spells it: the field name with
dashes (`num_layers` -> `--num-layers`). A boolean field is set by its switches only.
"""

from dataclasses import dataclass

INT_OR_STR = (int, str)  # a field that takes either (Megatron's --moe-layer-freq)


@dataclass(frozen=True)
class Bound:
    """A field's allowed closed range [low, high], its unit and why the limit is there."""

    low: float
    high: float
    unit: str
    why: str


@dataclass(frozen=True)
class Switch:
    """A flag without a value that sets its field to `value`; `token` names it in the default
    report folder; `aliases` are older spellings that do the same."""

    flag: str
    value: object
    help: str
    token: str
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class Field:
    """One scenario field. `help` is its value flag's meaning and unit (the default is appended
    unless it is None: then say it in `help`); `token` names the value flag's override in the
    default report folder (t4, rc-full; '' for the value alone: 'meta'; None: not named);
    `words` marks Megatron's nargs='*' list flags (one or more words, joined by spaces)."""

    section: str
    name: str
    kind: type | tuple  # bool, int, float, str, or INT_OR_STR
    default: object
    help: str = ""
    token: str | None = ""
    choices: tuple[str, ...] | None = None
    bound: Bound | None = None
    switches: tuple[Switch, ...] = ()
    words: bool = False

    @property
    def path(self) -> str:
        """`section.name`, as errors and the limits name the field."""
        return f"{self.section}.{self.name}"

    @property
    def flag(self) -> str | None:
        """The value flag (Megatron's spelling of the name); None for a boolean field."""
        return None if self.kind is bool else "--" + self.name.replace("_", "-")

    @property
    def annotation(self):
        """The dataclass annotation: the kind, or the kind or None where the default is None."""
        kind = int | str if self.kind == INT_OR_STR else self.kind
        return kind if self.default is not None else kind | None
