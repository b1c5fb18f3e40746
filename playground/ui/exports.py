"""Session exports streamed to the browser: no file is written.

Export in the Sessions tab asks for a download link; :class:`ExportLinks` gives it a token
that names the session for :data:`LINK_TTL_S` seconds, and the page's export route
(``page_routes.export``) answers a GET of that token with the session's export JSON, read
from the store at that moment and sent as an attachment. Nothing is left behind: N exports
take no disk space at all, and a link that has expired (or was never made) is a 404.

Gradio's own copies of files it serves (uploads) are removed a minute after they were made
(:data:`CACHE_CLEANUP`, the app's ``delete_cache``).
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
import unicodedata
from typing import Any, Callable
from urllib.parse import quote

LINK_TTL_S = 600.0  # a reader may take a while to click "download"
MAX_LINKS = 10_000  # tokens alive at once, all pages together (old ones dropped first)
CACHE_CLEANUP = (60, 60)
TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{32}")


class ExportLinks:
    """Short-lived download tokens, each naming one session and its file name."""

    def __init__(self, ttl: float = LINK_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = float(ttl)
        self._clock = clock
        self._links: dict[str, tuple[str, str, float]] = {}  # token -> (session id, file name, expiry)
        self._lock = threading.Lock()

    def issue(self, sid: str, filename: str) -> str:
        """A new token for downloading session ``sid`` as ``filename``."""
        token = secrets.token_urlsafe(24)
        now = self._clock()
        with self._lock:
            self._drop_expired(now)
            while len(self._links) >= MAX_LINKS:
                self._links.pop(next(iter(self._links)))
            self._links[token] = (sid, filename, now + self.ttl)
        return token

    def resolve(self, token: Any) -> tuple[str, str] | None:
        """(session id, file name) of a live token, else None."""
        if not isinstance(token, str) or TOKEN_RE.fullmatch(token) is None:
            return None
        with self._lock:
            self._drop_expired(self._clock())
            hit = self._links.get(token)
        return None if hit is None else (hit[0], hit[1])

    def __len__(self) -> int:
        with self._lock:
            self._drop_expired(self._clock())
            return len(self._links)

    def _drop_expired(self, now: float) -> None:
        for token in [t for t, (_s, _f, until) in self._links.items() if until <= now]:
            del self._links[token]


def export_body(data: dict[str, Any]) -> bytes:
    """The export file's bytes (UTF-8 JSON)."""
    return json.dumps(data, ensure_ascii=False).encode("utf-8")


def content_disposition(filename: str) -> str:
    """An attachment header that keeps a name in any script (RFC 6266 / 5987: ``filename*``,
    UTF-8 percent-encoded, which every current browser prefers), with an ASCII ``filename``
    for old clients: accents dropped ("Spéculatif" reads "Speculatif"), other letters and
    punctuation a single dash."""
    stem, dot, ext = filename.rpartition(".") if "." in filename else (filename, "", "")
    ascii_stem = unicodedata.normalize("NFKD", stem).encode("ascii", "ignore").decode("ascii")
    ascii_stem = re.sub(r"[^A-Za-z0-9._-]+", "-", ascii_stem)
    ascii_stem = re.sub(r"-{2,}", "-", ascii_stem).strip("-.") or "session"
    fallback = f"{ascii_stem}{dot}{re.sub(r'[^A-Za-z0-9]+', '', ext)}"
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"
