"""How a scenario check fails: one UserError naming the field and the reason."""

from simsp.errors import UserError


def check(condition: bool, name: str, reason: str) -> None:
    """Raise UserError(name, reason) unless `condition` holds."""
    if not condition:
        raise UserError(name, reason)


def positive(section: str, obj, names: tuple[str, ...]) -> None:
    """Each named field of `obj` is unset (None) or positive (for fields the table gives no
    range; the ranges of scenario/limits.py check the others first)."""
    for name in names:
        value = getattr(obj, name)
        if value is not None and value <= 0:
            raise UserError(f"{section}.{name}", f"must be positive, got {value}")
