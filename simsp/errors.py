"""Typed errors: a UserError becomes one `error:` line and exit status 2 at the command line."""

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")  # what could break an error onto two lines


def one_line(text: str) -> str:
    """`text` with every line break and control character written as an escape (\\n, \\x01),
    so an error that quotes a user's argument or file name stays one line."""
    return _CONTROL.sub(lambda found: repr(found.group())[1:-1], str(text))


class UserError(Exception):
    """Bad input from the user: names the offending field and the reason."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class SimulationError(Exception):
    """An internal inconsistency found while simulating (a bug, not bad input)."""
