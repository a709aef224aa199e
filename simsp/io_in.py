"""The input layer: every file simsp reads goes through here, size-capped and checked to be a
regular file before a byte is parsed; every problem is one UserError naming the file.

The caps (README "Limits") are far above any real file of each kind and far below what would
cost seconds or gigabytes to read: `simsp run /dev/zero` is refused at once, not after 3 GB.
"""

import os
from pathlib import Path
import re
import stat
import tomllib

from simsp.errors import UserError

KiB, MiB = 1024, 1024 * 1024
_TOML_WHERE = re.compile(r"\(at line (\d+), column \d+\)")  # tomllib's message tail
# kind of file -> the most bytes simsp reads of it (README "Limits", input files)
MAX_BYTES = {
    "scenario": 1 * MiB,      # a scenario is under 2 KiB
    "sweep": 1 * MiB,         # a sweep file with a thousand variants is ~200 KiB
    "measurements": 4 * MiB,  # 10,000 measurement rows of ~400 bytes
    "nccl-tests": 16 * MiB,   # one run's log is ~10 KiB; a 4096-rank log's Rank lines ~600 KiB
    "cache": 4 * MiB,         # one cached result row is ~10 KiB
    "profile": 256 * KiB,     # a GPU or system profile is ~3 KiB
    "probe": 4 * MiB,         # `simsp probe gemm` writes ~40 rows of ~60 bytes
    "launch line": 256 * KiB,  # Megatron's 175B example script is ~2 KiB
    "hf-config": 1 * MiB,     # a Hugging Face config.json is 1-5 KiB
}


def _refuse(path, reason: str):
    raise UserError(str(path), reason)


def read_bytes(path: str | Path, kind: str) -> bytes:
    """The file's bytes: a regular file no larger than MAX_BYTES[kind]; a symbolic link the
    user named is followed (they chose it), a missing or unreadable file is one UserError.
    Nothing that is not a regular file is ever opened for reading (a FIFO would block the
    open itself), and the open never waits (O_NONBLOCK) should the path change meanwhile."""
    limit = MAX_BYTES[kind]
    try:
        _check_regular(path, os.stat(path).st_mode, kind)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb", buffering=0) as handle:
            info = os.fstat(handle.fileno())
            _check_regular(path, info.st_mode, kind)
            if info.st_size > limit:
                _refuse(path, f"is {info.st_size} bytes, above the {_size(limit)} limit of a "
                              f"{kind} file")
            data = handle.read(limit + 1)
    except FileNotFoundError:
        _refuse(path, "file not found")
    except IsADirectoryError:
        _refuse(path, "is a folder, not a file")
    except OSError as exc:
        _refuse(path, f"cannot read: {exc.strerror or type(exc).__name__}")
    if len(data) > limit:  # grew while we read it
        _refuse(path, f"is above the {_size(limit)} limit of a {kind} file")
    return data


def _check_regular(path, mode: int, kind: str) -> None:
    """One UserError unless the mode is a regular file's (a folder is named as such)."""
    if stat.S_ISDIR(mode):
        _refuse(path, "is a folder, not a file")
    if not _is_regular(mode):
        _refuse(path, f"is not a regular file (a {kind} file must be one)")


def _is_regular(mode: int) -> bool:
    return stat.S_ISREG(mode)


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n // KiB} KiB"


def read_text(path: str | Path, kind: str) -> str:
    """The file as UTF-8 text (see read_bytes); a leading byte-order mark, as spreadsheet
    programs write one, is dropped; NUL characters are refused (no text has them)."""
    data = read_bytes(path, kind).removeprefix(b"\xef\xbb\xbf")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        _refuse(f"{path}:{_line_of(data, exc.start)}", "is not UTF-8 text")
    if "\x00" in text:
        _refuse(f"{path}:{text.count(chr(10), 0, text.index(chr(0))) + 1}",
                "contains a NUL character (not a text file)")
    return text


def _line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def read_toml(path: str | Path, kind: str) -> dict:
    """A TOML file as nested dicts; a syntax error names the file and tomllib's line."""
    text = read_text(path, kind)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = _TOML_WHERE.search(str(exc))
        where = f"{path}:{found.group(1)}" if found else str(path)
        _refuse(where, f"is not valid TOML: {_TOML_WHERE.sub('', str(exc)).strip()}")
    except RecursionError:
        _refuse(path, "is not valid TOML: nested too deeply")
