"""Typed errors: a UserError becomes one `error:` line and exit status 2 at the command line."""


class UserError(Exception):
    """Bad input from the user: names the offending field and the reason."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class SimulationError(Exception):
    """An internal inconsistency found while simulating (a bug, not bad input)."""
