"""Resumable results that cannot lie: one JSON file per configuration, named by its key.

The key (simsp.explore.configs.grid.Config.digest) hashes every scenario field, simsp's version
and `simulator_digest()`: the bytes of simsp's code and data files and the model constants in
force, so any change to the simulator misses the cache. Each entry records its key and its
configuration, and a read checks both and the row's shape: a wrong, corrupt, linked or stale
entry is recomputed and counted. Entries are written under unique temporary names and renamed
(concurrent sweeps into one folder never collide); a folder that cannot be written still gives
results, counted as not cached.
"""

from dataclasses import dataclass
import errno
import functools
import hashlib
import json
import os
from pathlib import Path
import stat
import tempfile

from simsp import io_in, io_out, version

FORMAT = 1  # the entry layout below; a change makes every older entry stale
PACKAGE = Path(version.__file__).resolve().parent  # simsp/: its code and data files
SOURCE_SUFFIXES = (".py", ".toml", ".json", ".csv")


@functools.lru_cache(maxsize=4)
def source_digest(root: Path) -> str:
    """sha256 of every code and data file of the simsp package (relative path and bytes),
    read once per process (a running process cannot change its own code)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def constants_text() -> str:
    """The model constants in force in this process (GPU specs, compute calibration)."""
    from simsp.hardware import costmodel
    from simsp.hardware import constants as hardware
    return repr((sorted(getattr(hardware, "GPUS", {}).items()), costmodel.active_calibration()))


def simulator_digest() -> str:
    """What besides the configuration decides a row: simsp's version, code and constants."""
    text = json.dumps([version.__version__, FORMAT, source_digest(PACKAGE), constants_text()])
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class CacheStats:
    """What the cache did in one command, printed with the results."""

    reused: int = 0
    simulated: int = 0
    rejected: int = 0  # entries present but wrong, corrupt, linked or stale: recomputed
    not_cached: int = 0  # results the folder could not take
    why_not_cached: str = ""

    def line(self) -> str:
        """'cache: 3 reused, 5 simulated, 1 rejected entry recomputed (...)'."""
        parts = [f"{self.reused} reused", f"{self.simulated} simulated"]
        if self.rejected:
            entries = "entry" if self.rejected == 1 else "entries"
            parts.append(f"{self.rejected} wrong or stale {entries} recomputed")
        if self.not_cached:
            parts.append(f"{self.not_cached} not cached ({self.why_not_cached})")
        return "cache: " + ", ".join(parts)


def _config_list(values: tuple) -> list:
    """The configuration as JSON: [["section.key", value], ...] in field order."""
    return [[f"{section}.{key}", value] for (section, key), value in values]


def _valid_row(row) -> bool:
    """A row as evaluate() makes them: a status, and the time of a simulated one."""
    if not isinstance(row, dict) or row.get("status") not in ("ok", "oom", "error"):
        return False
    if row["status"] == "error":
        return isinstance(row.get("error"), str)
    time = row.get("iteration_time_s")
    return isinstance(time, (int, float)) and not isinstance(time, bool)


class ResultCache:
    """Rows by configuration key, stored under `folder` (None: no cache)."""

    def __init__(self, folder: str | Path | None):
        self.folder = Path(folder) if folder is not None else None
        self.stats = CacheStats()
        self.writable = self.folder is not None
        if self.folder is None:
            return
        io_out.check_folder(self.folder)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._unwritable(exc)

    def _unwritable(self, exc: OSError) -> None:
        self.writable = False
        self.stats.why_not_cached = f"{self.folder}: {exc.strerror or type(exc).__name__}"

    def _path(self, digest: str) -> Path:
        """The file holding one configuration's row."""
        return self.folder / f"{digest}.json"

    def _read(self, path: Path):
        """The entry's JSON, or None if absent; raises ValueError for anything else."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as exc:  # ELOOP: a planted link; EACCES ...
            raise ValueError(exc.strerror) from None
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            limit = io_in.MAX_BYTES["cache"]
            if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
                raise ValueError("not a regular file of a sane size")
            return json.loads(handle.read(limit + 1))

    def get(self, digest: str, values: tuple | None = None) -> dict | None:
        """The cached row of this key and configuration, or None (missing, or rejected:
        counted); `values` is the configuration the entry must record."""
        if self.folder is None:
            return None
        try:
            entry = self._read(self._path(digest))
        except (OSError, ValueError, RecursionError):
            self.stats.rejected += 1
            return None
        if entry is None:
            return None
        if not (isinstance(entry, dict) and entry.get("format") == FORMAT
                and entry.get("key") == digest and _valid_row(entry.get("row"))
                and (values is None or entry.get("config") == _config_list(values))):
            self.stats.rejected += 1
            return None
        self.stats.reused += 1
        return entry["row"]

    def put(self, digest: str, row: dict, values: tuple = ()) -> None:
        """Store a row with its key and configuration: a unique temporary, then rename."""
        if self.folder is None or not self.writable:
            self.stats.not_cached += self.folder is not None
            return
        entry = {"format": FORMAT, "key": digest, "config": _config_list(values), "row": row}
        temporary = None
        try:
            fd, temporary = _new_temporary(self.folder, f".{digest[:16]}.")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(entry))
            os.replace(temporary, self._path(digest))
        except OSError as exc:
            if temporary is not None:
                _remove(temporary)
            self.stats.not_cached += 1
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                self._unwritable(exc)
            else:
                self.stats.why_not_cached = f"{self.folder}: {exc.strerror or 'write failed'}"


def _new_temporary(folder: Path, prefix: str) -> tuple[int, str]:
    """A new file of a unique name in `folder` (O_EXCL: never an existing file or link)."""
    return tempfile.mkstemp(dir=folder, prefix=prefix, suffix=".tmp")


def _remove(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # already gone
