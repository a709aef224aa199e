"""Where reports go: the folder the user names with --out, or reports/<name>_<overrides> built from
a sanitised scenario name; checked creatable and writable before any simulation runs."""

import os
from pathlib import Path
import re
import tempfile

from simsp.errors import UserError

REPORTS_ROOT = Path("reports")
MAX_NAME_CHARS = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9._+=-]+", re.ASCII)


def safe_token(text: str) -> str:
    """One path component from any text: safe ASCII characters only, no leading dots (so never
    '.', '..' or hidden), runs of anything else as one '-'."""
    token = _UNSAFE.sub("-", str(text)).lstrip(".-")
    return token[:MAX_NAME_CHARS].rstrip(".-")


def default_out_dir(name: str, tokens: list[str]) -> Path:
    """reports/<sanitised name>[_<token>...]: one token per command-line override, e.g.
    reports/paper-175b_t4_p16, so variants never overwrite each other."""
    parts = [safe_token(name) or "scenario"] + [safe_token(t) for t in tokens if safe_token(t)]
    return REPORTS_ROOT / "_".join(parts)


def _first_existing(path: Path) -> Path:
    """The nearest ancestor of `path` (or itself) that exists."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def _refuse(path: Path, reason: str, flag: str):
    raise UserError(flag, f"cannot write reports to {str(path)!r}: {reason}")


def prepare_out_dir(path: Path, flag: str = "--out") -> Path:
    """Create `path` (and its parents) and prove a file can be written in it; otherwise one
    UserError naming `flag`. Called before simulating so a bad folder costs nothing."""
    if str(path) == "":
        raise UserError(flag, "must not be empty")
    if path.is_symlink():
        _refuse(path, "it is a symbolic link (simsp never writes through a link it did not make)",
                flag)
    base = _first_existing(path)
    if not base.is_dir():
        _refuse(path, f"{str(base)!r} is not a folder", flag)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        _refuse(path, exc.strerror or type(exc).__name__, flag)
    if not os.access(path, os.W_OK | os.X_OK):
        _refuse(path, "not writable", flag)
    return path
