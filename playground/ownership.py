"""Who may change a stored session: owners on a hosted instance, one trusted user locally.

A browser keeps a random *owner key* (the page makes one and keeps it in local storage, see
``playground/ui/owner.js``) and sends it with the events that save or change sessions. The
server stores only its *owner id*, a SHA-256 of the key, with each session the browser made:
a database that leaks gives no one the keys. Knowing a session's id lets anyone read it (that
is what a share link is); changing it (rename, delete) needs its owner's key.

Two modes, chosen by ``PLAYGROUND_LIST_SESSIONS`` (:mod:`playground.core.settings`):

* **one user** (1, the local default): the Sessions tab lists every stored session and anyone
  using the page may rename, delete and export any of them, as before owners existed;
* **owners** (0, the Space default): a visitor's list shows the sessions their browser made
  plus the one open in their page (read-only unless theirs), and only the owner may rename,
  delete or export from the tab.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from playground.core.errors import PlaygroundError
from playground.core.settings import limits

KEY_RE = re.compile(r"[A-Za-z0-9_-]{32,128}")
_SALT = b"decoder-playground owner v1:"
# Lists "the sessions of" a caller without a key: no stored owner id (64 hex digits) equals it.
NOBODY = "-"


def owner_id(key: Any) -> str | None:
    """The owner id (64 hex digits) of an owner key, or None when ``key`` is not a well-formed key
    (missing, or sent by something other than the page)."""
    if not isinstance(key, str) or KEY_RE.fullmatch(key) is None:
        return None
    return hashlib.sha256(_SALT + key.encode("ascii")).hexdigest()


def one_user() -> bool:
    """Whether this instance has one trusted user (every session listed and changeable)."""
    return limits().list_sessions


def change_filter(key: Any) -> str | None:
    """The ``owned_by`` a store change must be made under for a caller holding ``key``: None
    (no restriction) for one user; the caller's owner id on a hosted instance.

    Raises :class:`PlaygroundError` when a hosted instance's caller has no owner key (the page
    makes one; a direct call without one may change nothing)."""
    if one_user():
        return None
    who = owner_id(key)
    if who is None:
        raise PlaygroundError("only the browser that made this session may change it")
    return who


def may_read_in_tab(session_owner: str | None, key: Any, open_sid: Any, sid: str) -> bool:
    """Whether the Sessions tab may select or export ``sid`` for a caller holding ``key``: any
    session for one user; on a hosted instance the caller's own ones and the one open in their
    page (a share link they followed)."""
    if one_user():
        return True
    who = owner_id(key)
    return (who is not None and session_owner == who) or (isinstance(open_sid, str) and open_sid == sid)
