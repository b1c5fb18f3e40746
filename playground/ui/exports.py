"""Export files for download: written once, removed a minute later.

Gradio serves a download from a file path, and copies the file into its own cache as it
sends it (that copy is removed by the app's ``delete_cache`` setting, :data:`CACHE_CLEANUP`).
The file written here only has to live until that copy is made, so each one is deleted
``ttl`` seconds after it was written, and every write first sweeps any that outlived their
time (a timer lost to a restart). Files are named by their content: exporting the same
session again reuses its file instead of adding one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

TTL_S = 60.0
# Gradio's own copies of served files (Blocks(delete_cache=...)): checked every minute, removed
# once a minute old.
CACHE_CLEANUP = (60, 60)


class ExportFiles:
    """A folder of short-lived export files (one per distinct export)."""

    def __init__(self, folder: str | os.PathLike[str] | None = None, ttl: float = TTL_S) -> None:
        self.folder = Path(folder) if folder is not None else Path(tempfile.gettempdir()) / "playground-exports"
        self.ttl = float(ttl)
        self._lock = threading.Lock()

    def write(self, data: dict[str, Any], filename: str) -> str:
        """Write ``data`` as JSON under ``filename`` and return its path; it is removed after ``ttl`` s."""
        body = json.dumps(data, ensure_ascii=False).encode("utf-8")
        digest = hashlib.sha256(body).hexdigest()[:24]
        with self._lock:
            self.sweep()
            folder = self.folder / digest
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / filename
            tmp = folder / f".{filename}.part"
            tmp.write_bytes(body)
            os.replace(tmp, path)  # a download never sees half a file
        timer = threading.Timer(self.ttl, self._remove, args=(folder,))
        timer.daemon = True
        timer.start()
        return str(path)

    def sweep(self, now: float | None = None) -> None:
        """Remove every export folder older than ``ttl`` seconds."""
        now = time.time() if now is None else now
        if not self.folder.is_dir():
            return
        for folder in self.folder.iterdir():
            try:
                if now - folder.stat().st_mtime >= self.ttl:
                    self._remove(folder)
            except OSError:
                continue

    def usage(self) -> int:
        """Bytes the export files take now."""
        if not self.folder.is_dir():
            return 0
        return sum(f.stat().st_size for f in self.folder.rglob("*") if f.is_file())

    @staticmethod
    def _remove(folder: Path) -> None:
        try:
            for f in folder.iterdir():
                f.unlink(missing_ok=True)
            folder.rmdir()
        except OSError:
            pass  # already gone, or a download still holds it open: the next sweep takes it
