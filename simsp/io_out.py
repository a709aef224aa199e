"""The output layer: every file simsp writes goes through here.

A file is written under a unique temporary name in its own folder (O_EXCL: never through a link
someone planted) and renamed over its final name once complete, so a reader sees the old file or
the new one, never half of one; two commands writing the same folder never share a temporary.
A symbolic link, a folder or anything but a regular file where simsp is about to write is an
error: simsp replaces only regular files. A failed write (disk full, quota, file-size limit) is
one UserError naming the file, and its temporary is removed.
Text from a user (variant and run names, file names) is escaped for the format it lands in.
"""

from contextlib import contextmanager
import json
import os
from pathlib import Path
import re
import stat
import tempfile

from simsp.errors import UserError


def _refuse(path, reason: str):
    raise UserError(str(path), reason)


def check_target(path: str | Path) -> None:
    """Refuse to write where something other than a regular file (or nothing) is in the way."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        _refuse(path, f"cannot write: {exc.strerror or type(exc).__name__}")
    if stat.S_ISLNK(info.st_mode):
        _refuse(path, "is a symbolic link simsp did not make: remove it or choose another "
                      "folder (simsp never writes through a link)")
    if stat.S_ISDIR(info.st_mode):
        _refuse(path, "is a folder where simsp writes a file: remove it or choose another folder")
    if not stat.S_ISREG(info.st_mode):
        _refuse(path, "is not a regular file: simsp writes only regular files")


def check_folder(path: str | Path) -> None:
    """A folder simsp writes into (or will create): a real folder, never a link to one."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        _refuse(path, "is a symbolic link simsp did not make: remove it or choose another folder")
    if not stat.S_ISDIR(info.st_mode):
        _refuse(path, "is in the way: simsp needs a folder there")


@contextmanager
def open_atomic(path: str | Path, mode: str = "w", encoding: str | None = "utf-8"):
    """A handle on a fresh temporary beside `path`, renamed over it when the block ends without
    an exception; on any failure the temporary is removed and a write error names `path`."""
    path = Path(path)
    check_target(path)
    binary = "b" in mode
    try:
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:64]}.",
                                         suffix=".tmp")
    except OSError as exc:
        _refuse(path, f"cannot write: {exc.strerror or type(exc).__name__}")
    try:
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else encoding,
                       newline=None if binary else "") as handle:
            yield handle
        os.chmod(temporary, 0o666 & ~_umask())
        check_target(path)
        os.replace(temporary, path)
    except OSError as exc:
        _remove(temporary)
        _refuse(path, f"cannot write: {exc.strerror or type(exc).__name__}")
    except BaseException:
        _remove(temporary)
        raise


def _umask() -> int:
    """The process's umask (read by setting it back at once), so files get the usual mode."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _remove(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # already gone


def write_file(path: str | Path, data: bytes | str) -> Path:
    """Write `data` (text as UTF-8) to `path` atomically; returns the path."""
    binary = isinstance(data, (bytes, bytearray, memoryview))
    with open_atomic(path, "wb" if binary else "w") as handle:
        handle.write(data)
    return Path(path)


def check_out_file(out: str | Path, flag: str, inputs: list = ()) -> None:
    """A file the user named for output, before any work: its folder exists and takes a new
    file, the name is absent or a regular file (never a link, a folder or a device) and is none
    of the command's inputs; else one UserError naming `flag`."""
    folder = Path(out).parent
    if not folder.is_dir():
        raise UserError(flag, f"folder {str(folder)!r} does not exist")
    check_not_inputs([out], inputs, flag)
    try:
        check_target(out)
    except UserError as exc:
        raise UserError(flag, f"{out}: {exc.reason}") from None
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise UserError(flag, f"cannot write in {str(folder)!r}: "
                              f"{exc.strerror or type(exc).__name__}") from None


def check_not_inputs(outputs: list, inputs: list, flag: str = "--out") -> None:
    """No output may replace a file the same command reads (same file, by device and inode)."""
    for out in outputs:
        for source in (source for source in inputs if source):  # None: an input not given
            try:
                same = os.path.samefile(out, source)
            except OSError:
                same = False
            if same:
                _refuse(flag, f"{str(out)!r} is an input of this command ({source}); simsp "
                              "never writes over its inputs")


# Characters that start Markdown syntax anywhere in a line (emphasis, code, links, tables, raw
# HTML, headings); '-', '.', '+' and digits only do at a line's start, where a name never is.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]#!|<>&~])")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def markdown_text(text) -> str:
    """User text as one line of literal Markdown: control characters as spaces, every
    character Markdown (or the HTML it allows) could read as syntax backslash-escaped."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", _CONTROL.sub(" ", str(text)))


def markdown_code(text) -> str:
    """User text as one Markdown code span: control characters as spaces, fenced by one more
    backtick than its longest run of them (CommonMark's rule), so it cannot end the span."""
    text = _CONTROL.sub(" ", str(text))
    fence = "`" * (max(map(len, re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def comment_text(text) -> str:
    """User text inside a one-line `#` comment (TOML, shell): line breaks and control
    characters as spaces, so it cannot start a line of its own."""
    return _CONTROL.sub(" ", str(text)).replace("\u2028", " ").replace("\u2029", " ")


def toml_string(text) -> str:
    """User text as one TOML basic string: quotes, backslashes and control characters escaped
    (JSON's escapes are TOML's, and TOML wants DEL escaped too), so it cannot end the string."""
    return json.dumps(str(text), ensure_ascii=False).replace("\x7f", "\\u007f")
