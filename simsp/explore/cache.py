"""Resumable results: one JSON file per configuration, named by the configuration's digest.

The digest hashes every scenario field and simsp's version, so a changed simulator or a changed
field misses the cache; a re-run (or an interrupted sweep run again) simulates only what is missing.
"""

import json
import os
from pathlib import Path


class ResultCache:
    """Rows by configuration digest, stored under `folder` (None: no cache)."""

    def __init__(self, folder: str | Path | None):
        self.folder = Path(folder) if folder is not None else None
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)

    def _path(self, digest: str) -> Path:

        """The file holding one configuration's row."""
        return self.folder / f"{digest}.json"

    def get(self, digest: str) -> dict | None:
        """The cached row, or None when missing, unreadable or no cache."""
        if self.folder is None:
            return None
        try:
            return json.loads(self._path(digest).read_text())
        except (OSError, ValueError):
            return None

    def put(self, digest: str, row: dict) -> None:
        """Store a row atomically (write a temporary file, then rename)."""
        if self.folder is None:
            return
        temporary = self._path(digest).with_suffix(".tmp")
        temporary.write_text(json.dumps(row))
        os.replace(temporary, self._path(digest))
