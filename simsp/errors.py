"""Typed errors: a UserError becomes one `error:` line and exit status 2 at the command line."""

from pathlib import Path


class UserError(Exception):
    """Bad input from the user: names the offending field and the reason."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class SimulationError(Exception):
    """An internal inconsistency found while simulating (a bug, not bad input)."""


def read_user_text(path) -> str:
    """A file the user named, as UTF-8 text; I/O problems become UserErrors naming it."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(str(path), "file not found") from None
    except UnicodeDecodeError:
        raise UserError(str(path), "is not UTF-8 text") from None
    except OSError as exc:
        raise UserError(str(path), f"cannot read: {exc.strerror}") from None
