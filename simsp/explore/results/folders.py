"""Default result folders of `sweep` and `search`: named by the source and by what varies, and
never shared by two different explorations (a later one with other settings gets `-2`, `-3`,
...; the same one again finds its own folder and resumes from its cache)."""

import hashlib
import json
import re
from pathlib import Path

from simsp.io_out import write_file

MANIFEST = "exploration.json"  # what produced the folder: {"command": ..., "digest": ...}


def _safe(text: str) -> str:
    """Letters, digits, dot, dash and underscore only."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "default"


def exploration_digest(parts) -> str:
    """sha256 of what defines an exploration (JSON-able parts)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _owner(folder: Path) -> str | None:
    """The digest recorded in a folder, or None when it has no readable manifest."""
    try:
        return json.loads((folder / MANIFEST).read_text())["digest"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def default_folder(command: str, source, varies: list[str], digest: str,
                   root: Path = Path("reports")) -> Path:
    """reports/<command>-<source stem>[-<what varies>], or the first `-N` suffix whose folder is
    free or already holds this very exploration."""
    stem = Path(source).stem if source else "default"
    name = _safe("-".join([command, stem, *varies]))[:150]
    for n in range(1, 10000):
        folder = root / (name if n == 1 else f"{name}-{n}")
        if not folder.exists() or _owner(folder) == digest:
            return folder
        if not (folder / MANIFEST).exists() and not any(folder.iterdir()):
            return folder  # an empty folder is free
    raise RuntimeError(f"no free folder for {name} under {root}")


def write_manifest(folder: Path, command: str, digest: str) -> None:
    """Record what the folder holds, so a different exploration never writes over it."""
    folder.mkdir(parents=True, exist_ok=True)
    write_file(folder / MANIFEST, json.dumps({"command": command, "digest": digest}) + "\n")
