"""Stored sessions: every comparison's traces in SQLite, replayable without a model (a contract).

A *session* is one comparison: its title, model, prompt, UI settings and one run (a trace
dict, see ``playground/core/trace.py``) per lane. Share links (``/?session=<id>``), the Sessions
view and ``playground sessions ...`` all go through :class:`Store`.

Design choices, and why:

* Tables ``sessions`` and ``runs`` (one row per lane, the whole trace as JSON plus the columns
  a listing needs), created by numbered forward migrations; ``PRAGMA user_version`` is the
  schema version. A migration and its version bump commit together.
* WAL journal and ``synchronous=FULL``: a save is one ``BEGIN IMMEDIATE ... COMMIT``, so a
  process killed mid-save leaves the database as it was before the save (or after it), never
  half-written, and readers are never blocked by a writer.
* One connection per :class:`Store`, shared by every thread behind a lock (Gradio runs
  callbacks in worker threads); other processes (the CLI next to the app) are serialised by
  SQLite's own locking, with a busy timeout.
* Branches: a session may be a *branch* of another (``parent_id``) — a lane continued from an
  edited prefix — with ``branch`` = ``{"lane", "step", "position", "token"}`` (the lane and
  step of the parent where a token was forced, the output position and the forced token id;
  optional ``"text"`` and ``"lanes"``: ``"one"`` or ``"all"``; a branch of a diffusion lane's
  canvas also has ``"hand"``, the ``[position, token_id]`` pairs a reader committed at the step,
  with ``position``/``token`` its first). The tree survives export and
  import (an export carries its branches; an import rebuilds them under new ids) and needs no
  model to replay. Deleting a parent keeps its branches (their ``parent_id`` becomes NULL,
  their ``branch`` stays).
* Owners: a session made in the page records the *owner id* of the browser that made it (a
  hash of a random key the browser keeps, :mod:`playground.ownership`); rename and delete can
  be limited to the owner (``owned_by=``). Reading a session needs only its id: that is what a
  share link hands out.
* Outcome: the page keeps in a session's settings whether Stop ended its run and which lanes
  failed (``settings.outcome`` = ``{"stopped", "failed_lanes"}``, :func:`run_outcome`), so a
  listing tells apart sessions with the same title. It is settings, not a column: no
  migration, and it travels in exports; a session without one (saved before it was kept, or by
  the CLI and the API) is read from its lanes' stats (``finish_reason`` ``cancelled``, ``error``).
* Ballots: a session marked blind (``settings.blind``, :meth:`Store.set_blind`) takes one ballot
  per reader (table ``ballots``, keyed by session and reader id, :mod:`playground.ballots`); a
  reader's new ballot replaces their old one. Ballots are readers' data: they are not exported
  with the session, and they go when the session is deleted.
* Imports are checked before anything is stored: the trace schema and its counts
  (:func:`playground.core.trace.validate_trace_dict`), and every token id below the
  vocabulary size of the model the lane names where that is known offline
  (:mod:`playground.store_vocab`).
* Session ids are ``secrets.token_urlsafe(24)`` (32 url-safe characters) redrawn until the
  first is a letter or digit, so a command line never reads one as an option: ~191.9 bits.
  Knowing an id is what lets someone open a session, so ids are never derived from content.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sqlite3
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import sqlite_utils

import playground.inputs as inputs
import playground.ballots as ballot_rules
import playground.notes as note_rules
from playground.core.errors import PlaygroundError
from playground.core.settings import limits
from playground.core.trace import validate_trace_dict
from playground.store_vocab import vocab_bound

EXPORT_FORMAT = "decoder-playground-session"
EXPORT_VERSION = 1
MAX_TITLE_CHARS = 200
MAX_EXPLANATIONS = 32  # attributions kept per session (settings.explanations)
MAX_EXPLANATION_BYTES = 200_000  # one attribution as JSON (a 1,024-token context is ~60 kB)
# A leading '-' would read as an option on the command line, so ids start with a letter or digit.
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{31}")
_BUSY_TIMEOUT_MS = 30_000
# What a listing reads of each lane: its decoder, and from its stats whether it was stopped or
# failed.
# JSON1 reads the two fields without loading the rest; a row whose stats are not JSON (written
# by hand) reads as neither rather than failing the whole listing.
_LANE_COLUMNS = ("decoder, CASE WHEN json_valid(stats) THEN json_extract(stats, '$.finish_reason') END, "
                 "CASE WHEN json_valid(stats) THEN json_extract(stats, '$.error') END")


# ---------------------------------------------------------------------- schema migrations
def _migrate_v1(conn: sqlite3.Connection) -> None:
    """The first schema: sessions and their runs (one row per lane)."""
    conn.execute("""
        CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            created TEXT NOT NULL,
            title TEXT NOT NULL,
            model TEXT NOT NULL,
            prompt TEXT NOT NULL,
            settings TEXT NOT NULL
        )""")
    conn.execute("""
        CREATE TABLE runs (
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            lane INTEGER NOT NULL,
            decoder TEXT NOT NULL,
            params TEXT NOT NULL,
            text TEXT NOT NULL,
            stats TEXT NOT NULL,
            trace TEXT NOT NULL,
            PRIMARY KEY (session_id, lane)
        )""")
    conn.execute("CREATE INDEX sessions_by_created ON sessions(created)")


def _migrate_v2(conn: sqlite3.Connection) -> None:
    """Branches: a session's parent and where it branched off (issue 16)."""
    conn.execute("ALTER TABLE sessions ADD COLUMN parent_id TEXT REFERENCES sessions(id) ON DELETE SET NULL")
    conn.execute("ALTER TABLE sessions ADD COLUMN branch TEXT")
    conn.execute("CREATE INDEX sessions_by_parent ON sessions(parent_id)")


def _migrate_v3(conn: sqlite3.Connection) -> None:
    """Owners: the hashed key of the browser that made a session (issue 29); NULL for sessions
    made before, from the command line or through the HTTP API."""
    conn.execute("ALTER TABLE sessions ADD COLUMN owner TEXT")
    conn.execute("CREATE INDEX sessions_by_owner ON sessions(owner, created)")


# MIGRATIONS[k] takes a database at version k to version k + 1. Append, never edit: a
# database made by an older playground replays only the steps it has not seen.
def _migrate_v4(conn: sqlite3.Connection) -> None:
    """Blind votes: one ballot per reader per session (issue 34); see :mod:`playground.votes`."""
    conn.execute("""
        CREATE TABLE ballots (
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            reader TEXT NOT NULL,
            ballot TEXT NOT NULL,
            reason TEXT NOT NULL,
            created TEXT NOT NULL,
            PRIMARY KEY (session_id, reader)
        )""")


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_migrate_v1, _migrate_v2, _migrate_v3, _migrate_v4]
BRANCH_FIELDS = ("lane", "step", "position", "token")
MAX_TREE_DEPTH = 64
# An export nests two levels per branch generation (a list of branches, then the export) over
# a trace's own dozen or so: this is far above any real export and far below Python's stack.
MAX_IMPORT_DEPTH = 2 * MAX_TREE_DEPTH + 64
OWNER_RE = re.compile(r"[0-9a-f]{64}")


def schema_version() -> int:
    """The schema version this code writes (the number of migrations)."""
    return len(MIGRATIONS)


# ---------------------------------------------------------------------- helpers
def default_path() -> str:
    """``$PLAYGROUND_DB``, else ``/data/playground.db`` where ``/data`` is writable, else ``./playground.db``."""
    env = os.environ.get("PLAYGROUND_DB", "").strip()
    if env:
        return env
    if os.path.isdir("/data") and os.access("/data", os.W_OK):
        return "/data/playground.db"
    return str(Path.cwd() / "playground.db")


def _check_setting_path(path: Any) -> None:
    """A JSON path into settings of plain keys (``$.sweep.fingerprint``); one line for anything else."""
    if not isinstance(path, str) or not re.fullmatch(r"\$(\.[A-Za-z_][A-Za-z0-9_]*)+", path):
        raise PlaygroundError(f"not a settings path: {path!r}")


def is_valid_session_id(s: Any) -> bool:
    """Whether ``s`` has the exact form of a session id (32 url-safe characters, the first alphanumeric)."""
    return isinstance(s, str) and _ID_RE.fullmatch(s) is not None


def new_session_id() -> str:
    """A fresh unguessable session id (32 url-safe characters, about 191.9 random bits)."""
    while True:
        sid = secrets.token_urlsafe(24)
        if sid[0] not in "-_":
            return sid


def _check_id(sid: Any) -> str:
    if not is_valid_session_id(sid):
        # The malformed value is not echoed: it may come from a URL and end up in HTML.
        raise PlaygroundError("malformed session id")
    return sid


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _plain(value: Any) -> Any:
    """numpy/torch scalars and arrays that slipped into evidence become plain JSON values."""
    for attr in ("tolist", "item"):
        if callable(getattr(value, attr, None)):
            return getattr(value, attr)()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def _dumps(value: Any, what: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=_plain)
    except (TypeError, ValueError) as e:
        raise PlaygroundError(f"{what} cannot be stored as JSON: {e}") from None


def _clean_title(title: Any, prompt: str = "", strict: bool = False) -> str:
    """One line of text; an empty title becomes the start of the prompt.

    Automatic saves and imports shorten an overlong title; a rename (``strict``) refuses it.
    """
    if title is not None and not isinstance(title, str):
        raise PlaygroundError("a session title must be text")
    text = " ".join((title or "").split())
    if not text:
        first = " ".join(prompt.split())
        text = (first[:60] + "...") if len(first) > 60 else (first or "untitled")
    if len(text) > MAX_TITLE_CHARS:
        if strict:
            raise PlaygroundError(f"a session title may have at most {MAX_TITLE_CHARS} characters")
        text = text[: MAX_TITLE_CHARS - 3] + "..."
    return text


def _check_trace(trace: Any, lane: int) -> None:
    """The trace schema plus the replay fields the contract adds (tokens, pieces)."""
    try:
        validate_trace_dict(trace)
    except ValueError as e:
        raise PlaygroundError(f"lane {lane + 1}: {e}") from None
    inputs.seed(trace.get("seed", 0), f"lane {lane + 1}'s seed")
    tokens = trace.get("tokens")
    if tokens is not None and not (isinstance(tokens, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in tokens.items())):
        raise PlaygroundError(f"lane {lane + 1}: 'tokens' must map token ids to text")
    pieces = trace.get("pieces")
    if pieces is not None and not (isinstance(pieces, list) and all(isinstance(p, str) for p in pieces)):
        raise PlaygroundError(f"lane {lane + 1}: 'pieces' must be a list of text")


def _loads_or_none(text: Any) -> Any:
    """A stored JSON column read back (None where it is not JSON: a listing never fails on one row)."""
    try:
        return json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _check_owner(owner: Any) -> str | None:
    """An owner id (a 64-hex-digit hash, :func:`playground.ownership.owner_id`) or None."""
    if owner is None:
        return None
    if not isinstance(owner, str) or OWNER_RE.fullmatch(owner) is None:
        raise PlaygroundError("malformed owner id")
    return owner


def _check_branch(branch: Any, lanes: int | None = None) -> dict[str, Any]:
    """A branch record: ``lane``, ``step``, ``position``, ``token`` (whole numbers >= 0), optional
    ``text`` and ``lanes`` (``one``/``all``); ``lane`` below the parent's lane count."""
    if not isinstance(branch, dict):
        raise PlaygroundError("a branch must be a JSON object with lane, step, position and token")
    unknown = sorted(set(branch) - set(BRANCH_FIELDS) - {"text", "lanes", "hand"})
    if unknown:
        raise PlaygroundError(f"a branch has unknown field(s) {', '.join(map(repr, unknown))}")
    for k in BRANCH_FIELDS:
        v = branch.get(k)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise PlaygroundError(f"a branch's {k} must be a whole number >= 0, got {v!r}")
    if lanes is not None and branch["lane"] >= lanes:
        raise PlaygroundError(f"the branch's lane {branch['lane']} is not a lane of its parent ({lanes} lanes)")
    if "text" in branch and not isinstance(branch["text"], str):
        raise PlaygroundError("a branch's text must be text")
    if branch.get("lanes", "one") not in ("one", "all"):
        raise PlaygroundError("a branch's lanes must be 'one' or 'all'")
    hand = branch.get("hand", [[0, 0]])
    if (not isinstance(hand, list) or not hand or len(hand) > 4096
            or not all(isinstance(q, list) and len(q) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                   and v >= 0 for v in q) for q in hand)):
        raise PlaygroundError("a branch's hand must be a list of [position, token_id] pairs")
    return dict(branch)


def lane_failed(trace: Any) -> bool:
    """Whether a lane's run failed: its stats carry an ``error`` line (the runner's mark)."""
    stats = trace.get("stats") if isinstance(trace, dict) else None
    return isinstance(stats, dict) and bool(stats.get("error"))


def run_outcome(traces: list[dict[str, Any]], stopped: bool) -> dict[str, Any]:
    """The ``outcome`` a session's settings keep: ``stopped`` (Stop ended the run) and
    ``failed_lanes`` (lane numbers from 1 whose run failed), so a listing tells apart
    sessions whose titles are the same."""
    return {"stopped": bool(stopped), "failed_lanes": [j + 1 for j, t in enumerate(traces) if lane_failed(t)]}


def _check_outcome(outcome: Any, lanes: int) -> None:
    """An ``outcome`` in a session's settings: ``stopped`` true/false, ``failed_lanes`` lane
    numbers from 1 up to the session's lane count."""
    if not isinstance(outcome, dict) or set(outcome) - {"stopped", "failed_lanes"}:
        raise PlaygroundError("a session's settings.outcome must be {\"stopped\": ..., \"failed_lanes\": [...]}")
    if not isinstance(outcome.get("stopped", False), bool):
        raise PlaygroundError("a session's settings.outcome.stopped must be true or false")
    failed = outcome.get("failed_lanes", [])
    if not isinstance(failed, list) or any(not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= lanes
                                           for k in failed):
        raise PlaygroundError(f"a session's settings.outcome.failed_lanes must list lane numbers 1..{lanes}")


def stored_outcome(settings: Any, lanes: list[tuple[Any, Any]]) -> dict[str, Any]:
    """A stored session's outcome: its settings' ``outcome`` where it has one (the page saves
    it), else read from its lanes' ``(finish_reason, error)`` (sessions saved before it was
    kept, or by the command line and the API): a cancelled lane means the run was stopped."""
    kept = settings.get("outcome") if isinstance(settings, dict) else None
    if isinstance(kept, dict):
        failed = kept.get("failed_lanes")
        return {"stopped": kept.get("stopped") is True,
                "failed_lanes": [k for k in failed if isinstance(k, int)] if isinstance(failed, list) else []}
    return {"stopped": any(reason == "cancelled" for reason, _ in lanes),
            "failed_lanes": [j + 1 for j, (_, error) in enumerate(lanes) if error]}


def _check_vocab(data: dict[str, Any]) -> None:
    """Every token id of an import's lanes is below its model's vocabulary size (read offline,
    :mod:`playground.store_vocab`): ids, commits and forced tokens, checked before anything
    is stored. One line naming the lane and the field."""
    bounds: dict[str, tuple[int, bool]] = {}
    for lane, trace in enumerate(data["runs"]):
        model = trace.get("model") if isinstance(trace.get("model"), str) and trace.get("model") else data["model"]
        if model not in bounds:
            bounds[model] = vocab_bound(model)
        bound, known = bounds[model]
        fields: list[tuple[str, list[Any]]] = [("prompt_ids", trace["prompt_ids"]), ("output_ids", trace["output_ids"])]
        fields += [(f"step {j}'s committed", s.get("committed", [])) for j, s in enumerate(trace["steps"])]
        fields += [("force", [f[1] for f in trace.get("force") or []])]
        for name, ids in fields:
            bad = next((x for x in ids if x >= bound), None)
            if bad is not None:
                where = f"the vocabulary of {model} ({bound} ids)" if known else f"any vocabulary (at most {bound} ids)"
                raise PlaygroundError(f"lane {lane + 1}: {name} holds token {bad}, outside {where}")


def _check_session(title: Any, model: Any, prompt: Any, settings: Any, traces: Any) -> None:
    for name, value in (("model", model), ("prompt", prompt)):
        if not isinstance(value, str):
            raise PlaygroundError(f"a session's {name} must be text")
    if title is not None and not isinstance(title, str):
        raise PlaygroundError("a session title must be text")
    if not isinstance(settings, dict):
        raise PlaygroundError("a session's settings must be a JSON object")
    if settings.get("seed") is not None:
        inputs.seed(settings["seed"], "the session's seed")
    if not isinstance(traces, list) or not traces:
        raise PlaygroundError("a session needs a list of at least one run")
    for lane, trace in enumerate(traces):
        _check_trace(trace, lane)
    if "outcome" in settings:
        _check_outcome(settings["outcome"], len(traces))


# ---------------------------------------------------------------------- the store
class Store:
    """The session database. Safe to share between threads; cheap to open per process."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = str(path) if path is not None else default_path()
        self._lock = threading.RLock()
        try:
            if self.path != ":memory:":
                Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: the driver opens no implicit transactions; every write
            # below says BEGIN IMMEDIATE / COMMIT itself, so nothing commits half a save.
            conn = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_MS / 1000,
                                   isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as e:
            raise PlaygroundError(f"cannot open the session database {self.path}: {e}") from None
        self.conn = conn
        self.db = sqlite_utils.Database(conn)
        try:
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA foreign_keys = ON")
            if self.path != ":memory:":
                self.db.enable_wal()
            conn.execute("PRAGMA synchronous = FULL")
            self._migrate()
        except sqlite3.DatabaseError as e:
            conn.close()
            raise PlaygroundError(f"cannot use the session database {self.path}: {e}") from None

    # -- plumbing
    def close(self) -> None:
        """Close the connection (the store cannot be used afterwards)."""
        with self._lock:
            self.conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.path!r})"

    def version(self) -> int:
        """The schema version of the open database."""
        with self._lock:
            return int(self.conn.execute("PRAGMA user_version").fetchone()[0])

    def _write(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``fn`` in one immediate transaction: all of it commits, or none of it."""
        with self._lock:
            conn = self.conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return result

    def _migrate(self) -> None:
        target = schema_version()

        def step(conn: sqlite3.Connection) -> None:
            # Re-read inside the write lock: another process may have migrated meanwhile.
            current = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if current > target:
                raise PlaygroundError(
                    f"the session database {self.path} has schema version {current}; "
                    f"this playground reads up to {target} (upgrade the playground)")
            for k in range(current, target):
                MIGRATIONS[k](conn)
                conn.execute(f"PRAGMA user_version = {k + 1}")

        with self._lock:
            current = int(self.conn.execute("PRAGMA user_version").fetchone()[0])
        if current != target:
            self._write(step)

    # -- writing
    def save_session(self, title: str, model: str, prompt: str, settings: dict[str, Any],
                     traces: list[dict[str, Any]], parent: str | None = None,
                     branch: dict[str, Any] | None = None, owner: str | None = None) -> str:
        """Store a comparison (one trace per lane) in one transaction; return its new id.

        An empty title becomes the start of the prompt. ``parent`` and ``branch`` (both or
        neither) store it as a branch of the session ``parent`` (see the module docstring);
        ``owner`` is the owner id of the browser that made it (None: nobody's).
        Raises :class:`PlaygroundError` for a trace that breaks the schema, settings that are
        not JSON, a malformed branch or a parent that does not exist.
        """
        _check_session(title, model, prompt, settings, traces)
        if (parent is None) != (branch is None):
            raise PlaygroundError("a branch needs both its parent session and where it branched off")
        if parent is not None:
            _check_id(parent)
            branch = _check_branch(branch)
        row = {"title": _clean_title(title, prompt), "model": model, "prompt": prompt,
               "settings": _dumps(settings, "the session settings"), "created": _now(),
               "parent_id": parent, "branch": _dumps(branch, "the branch") if branch is not None else None,
               "owner": _check_owner(owner)}
        runs = [self._run_row(lane, t) for lane, t in enumerate(traces)]
        return self._write(lambda conn: self._insert_tx(conn, row, runs))

    @staticmethod
    def _run_row(lane: int, trace: dict[str, Any]) -> dict[str, Any]:
        return {"lane": lane, "decoder": trace["decoder"],
                "params": _dumps(trace["params"], f"lane {lane + 1}'s params"),
                "text": trace["text"], "stats": _dumps(trace["stats"], f"lane {lane + 1}'s stats"),
                "trace": _dumps(trace, f"lane {lane + 1}")}

    def _insert_tx(self, conn: sqlite3.Connection, row: dict[str, Any], runs: list[dict[str, Any]]) -> str:
        """Insert one session and its runs inside the caller's transaction; return its id."""
        parent = row.get("parent_id")
        if parent is not None:
            lanes = conn.execute("SELECT count(*) FROM runs WHERE session_id = ?", (parent,)).fetchone()[0]
            if not conn.execute("SELECT 1 FROM sessions WHERE id = ?", (parent,)).fetchone():
                raise PlaygroundError(f"no session with id {parent} to branch from")
            _check_branch(json.loads(row["branch"]), int(lanes))
        sid = new_session_id()
        while conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone():
            sid = new_session_id()  # ~192 random bits: never in practice, but never overwrite
        conn.execute("INSERT INTO sessions (id, created, title, model, prompt, settings, parent_id, branch, owner) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (sid, row["created"], row["title"], row["model"], row["prompt"], row["settings"],
                      parent, row.get("branch"), row.get("owner")))
        for run in runs:
            self._insert_run(conn, sid, run)
        return sid

    def _insert_run(self, conn: sqlite3.Connection, sid: str, run: dict[str, Any]) -> None:
        conn.execute("INSERT INTO runs (session_id, lane, decoder, params, text, stats, trace) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?)",
                     (sid, run["lane"], run["decoder"], run["params"], run["text"], run["stats"], run["trace"]))

    def rename_session(self, sid: str, title: str, owned_by: str | None = None) -> None:
        """Give a session a new (non-empty) title; with ``owned_by``, only if that owner id made it."""
        _check_id(sid)
        if not isinstance(title, str) or not title.strip():
            raise PlaygroundError("a session title cannot be empty")
        clean = _clean_title(title, strict=True)

        def tx(conn: sqlite3.Connection) -> None:
            self._check_owned(conn, sid, owned_by)
            if conn.execute("UPDATE sessions SET title = ? WHERE id = ?", (clean, sid)).rowcount == 0:
                raise PlaygroundError(f"no session with id {sid}")

        self._write(tx)

    def delete_session(self, sid: str, owned_by: str | None = None) -> None:
        """Delete a session and its runs; with ``owned_by``, only if that owner id made it."""
        _check_id(sid)

        def tx(conn: sqlite3.Connection) -> None:
            self._check_owned(conn, sid, owned_by)
            conn.execute("DELETE FROM runs WHERE session_id = ?", (sid,))
            conn.execute("DELETE FROM ballots WHERE session_id = ?", (sid,))
            if conn.execute("DELETE FROM sessions WHERE id = ?", (sid,)).rowcount == 0:
                raise PlaygroundError(f"no session with id {sid}")

        self._write(tx)

    def add_explanation(self, sid: str, key: str, result: dict[str, Any], owned_by: str | None = None) -> None:
        """Keep an attribution computed for one of the session's tokens (the Explain panel) in
        its settings, under ``settings.explanations[key]``, so a replay shows it without the
        model; with ``owned_by``, only if that owner id made the session. At most
        :data:`MAX_EXPLANATIONS` per session (the oldest goes first)."""
        _check_id(sid)
        if not isinstance(key, str) or not key or len(key) > 200:
            raise PlaygroundError("an explanation needs a short key")
        blob = json.dumps(result)
        if len(blob) > MAX_EXPLANATION_BYTES:
            raise PlaygroundError(f"the explanation is {len(blob)} bytes; at most {MAX_EXPLANATION_BYTES} are kept")

        def tx(conn: sqlite3.Connection) -> None:
            self._check_owned(conn, sid, owned_by)
            row = conn.execute("SELECT settings FROM sessions WHERE id = ?", (sid,)).fetchone()
            if row is None:
                raise PlaygroundError(f"no session with id {sid}")
            settings = json.loads(row[0])
            kept = settings.get("explanations") if isinstance(settings.get("explanations"), dict) else {}
            kept.pop(key, None)
            kept[key] = json.loads(blob)
            while len(kept) > MAX_EXPLANATIONS:
                kept.pop(next(iter(kept)))
            settings["explanations"] = kept
            conn.execute("UPDATE sessions SET settings = ? WHERE id = ?", (json.dumps(settings), sid))

        self._write(tx)

    def set_note(self, sid: str, lane: Any, step: Any, text: Any, owned_by: str | None = None) -> None:
        """Pin a note to ``step`` of ``lane`` (0-based) of a session, replacing the one there; an
        empty text removes it (:mod:`playground.notes`). With ``owned_by``, only if that owner id
        made the session; the lane and step must exist, at most ``MAX_NOTES`` per session."""
        _check_id(sid)
        lane, step = note_rules.check_place(lane, step)
        text = note_rules.check_text(text)

        def tx(conn: sqlite3.Connection) -> None:
            self._check_owned(conn, sid, owned_by)
            row = conn.execute("SELECT settings FROM sessions WHERE id = ?", (sid,)).fetchone()
            if row is None:
                raise PlaygroundError(f"no session with id {sid}")
            run = conn.execute("SELECT CASE WHEN json_valid(trace) THEN json_array_length(trace, '$.steps') END "
                               "FROM runs WHERE session_id = ? AND lane = ?", (sid, lane)).fetchone()
            if run is None:
                raise PlaygroundError(f"the session has no lane {lane + 1}")
            if step >= int(run[0] or 0):
                raise PlaygroundError(f"lane {lane + 1} has steps 0 to {max(int(run[0] or 0) - 1, 0)}; no step {step}")
            settings = json.loads(row[0])
            kept = settings.get("notes") if isinstance(settings.get("notes"), dict) else {}
            key = note_rules.note_key(lane, step)
            if not text:
                kept.pop(key, None)
            else:
                if key not in kept and len(kept) >= note_rules.MAX_NOTES:
                    raise PlaygroundError(f"this session has {note_rules.MAX_NOTES} notes; remove one first")
                kept[key] = {"text": text, "updated": _now()}
            settings["notes"] = kept
            conn.execute("UPDATE sessions SET settings = ? WHERE id = ?", (json.dumps(settings), sid))

        self._write(tx)

    def set_blind(self, sid: str, blind: bool, owned_by: str | None = None) -> None:
        """Mark a session blind (its readers vote on letters, :mod:`playground.votes`) or not;
        with ``owned_by``, only if that owner id made it."""
        _check_id(sid)
        if not isinstance(blind, bool):
            raise PlaygroundError("blind is true or false")

        def tx(conn: sqlite3.Connection) -> None:
            self._check_owned(conn, sid, owned_by)
            row = conn.execute("SELECT settings FROM sessions WHERE id = ?", (sid,)).fetchone()
            if row is None:
                raise PlaygroundError(f"no session with id {sid}")
            lanes = conn.execute("SELECT count(*) FROM runs WHERE session_id = ?", (sid,)).fetchone()[0]
            if blind and lanes < 2:
                raise PlaygroundError("a blind comparison needs at least two lanes")
            settings = json.loads(row[0])
            settings["blind"] = blind
            conn.execute("UPDATE sessions SET settings = ? WHERE id = ?", (json.dumps(settings), sid))

        self._write(tx)

    def add_ballot(self, sid: str, reader: str, ballot: dict[str, Any], reason: str = "") -> bool:
        """Store ``reader``'s ballot on a blind session, replacing their earlier one; return
        whether one was replaced. The ballot is in stored form (lanes), checked against the
        session; the reader is an owner id (:func:`playground.ownership.owner_id`)."""
        _check_id(sid)
        if not isinstance(reader, str) or OWNER_RE.fullmatch(reader) is None:
            raise PlaygroundError("a vote needs the reader's key (the vote page makes one)")
        reason = ballot_rules.check_reason(reason)

        def tx(conn: sqlite3.Connection) -> bool:
            row = conn.execute("SELECT settings FROM sessions WHERE id = ?", (sid,)).fetchone()
            if row is None:
                raise PlaygroundError(f"no session with id {sid}")
            if not (_loads_or_none(row[0]) or {}).get("blind"):
                raise PlaygroundError("this session is not blind: votes are taken only on blind comparisons")
            lanes = int(conn.execute("SELECT count(*) FROM runs WHERE session_id = ?", (sid,)).fetchone()[0])
            clean = ballot_rules.check_ballot(ballot, lanes)
            had = conn.execute("SELECT 1 FROM ballots WHERE session_id = ? AND reader = ?", (sid, reader)).fetchone()
            if not had and conn.execute("SELECT count(*) FROM ballots WHERE session_id = ?",
                                        (sid,)).fetchone()[0] >= ballot_rules.MAX_BALLOTS_PER_SESSION:
                raise PlaygroundError(f"this session has {ballot_rules.MAX_BALLOTS_PER_SESSION} ballots; it takes no more")
            conn.execute("INSERT OR REPLACE INTO ballots (session_id, reader, ballot, reason, created) "
                         "VALUES (?, ?, ?, ?, ?)", (sid, reader, json.dumps(clean), reason, _now()))
            return had is not None

        return bool(self._write(tx))

    def ballot_of(self, sid: str, reader: str) -> dict[str, Any] | None:
        """``reader``'s stored ballot on ``sid`` (``{"ballot", "reason", "created"}``) or None."""
        _check_id(sid)
        with self._lock:
            row = self.conn.execute("SELECT ballot, reason, created FROM ballots WHERE session_id = ? AND reader = ?",
                                    (sid, str(reader))).fetchone()
        return None if row is None else {"ballot": json.loads(row[0]), "reason": row[1], "created": row[2]}

    def ballots(self, sids: list[str] | None = None) -> list[dict[str, Any]]:
        """Stored ballots (``session``, ``ballot``, ``reason``, ``created``; no reader ids), oldest
        first; of the sessions ``sids`` only, when given."""
        query = "SELECT session_id, ballot, reason, created FROM ballots"
        args: list[Any] = []
        if sids is not None:
            ids = [i for i in sids if is_valid_session_id(i)]
            if not ids:
                return []
            query += f" WHERE session_id IN ({', '.join('?' for _ in ids)})"
            args = ids
        with self._lock:
            rows = self.conn.execute(query + " ORDER BY created, rowid", args).fetchall()
        return [{"session": r[0], "ballot": json.loads(r[1]), "reason": r[2], "created": r[3]} for r in rows]

    def sessions_with_setting(self, path: str, value: Any) -> list[str]:
        """The ids of the sessions whose settings hold ``value`` at JSON path ``path`` (e.g.
        ``$.sweep.fingerprint``), oldest first."""
        _check_setting_path(path)
        with self._lock:
            rows = self.conn.execute("SELECT id FROM sessions WHERE json_valid(settings) AND "
                                     "json_extract(settings, ?) = ? ORDER BY created, rowid", (path, value)).fetchall()
        return [r[0] for r in rows]

    def setting_of(self, sid: str, path: str) -> Any:
        """The value at JSON path ``path`` of a session's settings (None where absent), read
        without loading its runs; a session that does not exist is one line."""
        _check_id(sid)
        _check_setting_path(path)
        with self._lock:
            row = self.conn.execute("SELECT CASE WHEN json_valid(settings) THEN json_extract(settings, ?) END "
                                    "FROM sessions WHERE id = ?", (path, sid)).fetchone()
        if row is None:
            raise PlaygroundError(f"no session with id {sid}")
        return row[0]

    def voted_sessions(self, reader: str) -> list[str]:
        """The ids of the sessions ``reader`` (an owner id) voted on, oldest vote first."""
        with self._lock:
            rows = self.conn.execute("SELECT session_id FROM ballots WHERE reader = ? ORDER BY created, rowid",
                                     (str(reader),)).fetchall()
        return [r[0] for r in rows]

    def owned_sessions(self, owner: str) -> list[str]:
        """The ids of the sessions made by ``owner`` (an owner id)."""
        with self._lock:
            return [r[0] for r in self.conn.execute("SELECT id FROM sessions WHERE owner = ?", (str(owner),))]

    def ballot_count(self, sid: str) -> int:
        """How many readers voted on ``sid``."""
        _check_id(sid)
        with self._lock:
            return int(self.conn.execute("SELECT count(*) FROM ballots WHERE session_id = ?", (sid,)).fetchone()[0])

    @staticmethod
    def _check_owned(conn: sqlite3.Connection, sid: str, owned_by: str | None) -> None:
        """Refuse, inside the caller's transaction, a change by someone who does not own ``sid``.
        The same line whether the session is someone else's or does not exist: a caller learns
        nothing about ids they do not hold."""
        if owned_by is None:
            return
        row = conn.execute("SELECT owner FROM sessions WHERE id = ?", (sid,)).fetchone()
        if row is None or row[0] is None or not secrets.compare_digest(str(row[0]), str(owned_by)):
            raise PlaygroundError("only the browser that made this session may change it")

    def check_may_change(self, sid: str, owned_by: str | None) -> None:
        """Raise, with the line a rename or delete would give, unless ``owned_by`` may change
        ``sid`` (None: anyone): the Sessions tab asks before a delete only someone who may make it."""
        _check_id(sid)
        with self._lock:
            self._check_owned(self.conn, sid, owned_by)

    def session_owner(self, sid: str) -> str | None:
        """The owner id of the browser that made ``sid`` (None: nobody's, or no such session)."""
        _check_id(sid)
        with self._lock:
            row = self.conn.execute("SELECT owner FROM sessions WHERE id = ?", (sid,)).fetchone()
        return None if row is None else row[0]

    # -- reading
    def load_session(self, sid: str) -> dict[str, Any]:
        """The session with its runs (trace dicts in lane order): everything a replay needs."""
        _check_id(sid)
        with self._lock:
            rows = list(self.db.query("SELECT * FROM sessions WHERE id = ?", [sid]))
            if not rows:
                raise PlaygroundError(f"no session with id {sid}")
            runs = [json.loads(r["trace"]) for r in self.db.query(
                "SELECT trace FROM runs WHERE session_id = ? ORDER BY lane", [sid])]
            children = [r["id"] for r in self.db.query(
                "SELECT id FROM sessions WHERE parent_id = ? ORDER BY created, rowid", [sid])]
        s = rows[0]
        return {"id": s["id"], "title": s["title"], "created": s["created"], "model": s["model"],
                "prompt": s["prompt"], "settings": json.loads(s["settings"]),
                "decoders": [r["decoder"] for r in runs], "runs": runs,
                "parent": s["parent_id"], "branch": json.loads(s["branch"]) if s["branch"] else None,
                "branches": children}

    def session_summary(self, sid: str) -> dict[str, Any]:
        """What a listing shows of one session (id, title, model, created, decoders in lane order,
        parent, branch, branch ids, ``stopped``, ``failed_lanes``) without reading its traces: cheap at any trace size."""
        _check_id(sid)
        with self._lock:
            s = self.conn.execute("SELECT title, model, created, parent_id, branch, settings FROM sessions WHERE id = ?",
                                  (sid,)).fetchone()
            if s is None:
                raise PlaygroundError(f"no session with id {sid}")
            lanes = self.conn.execute(f"SELECT {_LANE_COLUMNS} FROM runs WHERE session_id = ? ORDER BY lane",
                                      (sid,)).fetchall()
            kids = [r[0] for r in self.conn.execute(
                "SELECT id FROM sessions WHERE parent_id = ? ORDER BY created, rowid", (sid,))]
        return {"id": sid, "title": s[0], "model": s[1], "created": s[2], "decoders": [r[0] for r in lanes],
                "parent": s[3], "branch": json.loads(s[4]) if s[4] else None, "branches": kids,
                **stored_outcome(_loads_or_none(s[5]), [(r[1], r[2]) for r in lanes])}

    def list_sessions(self, limit: int | None = None, owned_by: str | None = None,
                      also: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """Sessions (id, title, model, decoders in lane order, created, parent, branch, owner,
        ``blind``, ``stopped`` and ``failed_lanes``, :func:`stored_outcome`), newest first; at most ``limit``. With ``owned_by``, only that owner id's sessions and
        those named in ``also`` (e.g. one the visitor opened by its link)."""
        where, args = "", []
        if owned_by is not None:
            ids = [i for i in also if is_valid_session_id(i)]
            where = f"WHERE owner = ? OR id IN ({', '.join('?' for _ in ids)})" if ids else "WHERE owner = ?"
            args = [owned_by, *ids]
        newest = "SELECT {} FROM sessions " + where + " ORDER BY created DESC, rowid DESC LIMIT ?"
        n = -1 if limit is None else max(int(limit), 0)  # LIMIT -1: no limit
        with self._lock:
            sessions = list(self.db.query(newest.format("id, title, model, created, parent_id, branch, owner, settings"),
                                          [*args, n]))
            lanes: dict[str, list[tuple[Any, ...]]] = {}
            for r in self.conn.execute(f"SELECT session_id, {_LANE_COLUMNS} FROM runs "
                                       f"WHERE session_id IN ({newest.format('id')}) ORDER BY session_id, lane",
                                       [*args, n]):
                lanes.setdefault(r[0], []).append(r[1:])
        return [{"id": s["id"], "title": s["title"], "model": s["model"],
                 "decoders": [r[0] for r in lanes.get(s["id"], [])], "created": s["created"], "parent": s["parent_id"],
                 "branch": json.loads(s["branch"]) if s["branch"] else None, "owner": s["owner"],
                 "blind": bool((_loads_or_none(s["settings"]) or {}).get("blind")),
                 **stored_outcome(_loads_or_none(s["settings"]), [(r[1], r[2]) for r in lanes.get(s["id"], [])])}
                for s in sessions]

    def branch_tree(self, sid: str) -> dict[str, Any]:
        """The branch tree ``sid`` belongs to, from its root: nested ``{"id", "title", "branch",
        "decoders", "branches": [...]}`` (branches oldest first)."""
        _check_id(sid)
        with self._lock:
            root = sid
            for _ in range(MAX_TREE_DEPTH):
                row = self.conn.execute("SELECT parent_id FROM sessions WHERE id = ?", (root,)).fetchone()
                if row is None:
                    raise PlaygroundError(f"no session with id {root}")
                if row[0] is None:
                    break
                root = row[0]
            return self._subtree(root, 0)

    def _subtree(self, sid: str, depth: int) -> dict[str, Any]:
        s = self.conn.execute("SELECT title, branch FROM sessions WHERE id = ?", (sid,)).fetchone()
        decoders = [r[0] for r in self.conn.execute(
            "SELECT decoder FROM runs WHERE session_id = ? ORDER BY lane", (sid,))]
        kids = [r[0] for r in self.conn.execute(
            "SELECT id FROM sessions WHERE parent_id = ? ORDER BY created, rowid", (sid,))]
        return {"id": sid, "title": s[0], "branch": json.loads(s[1]) if s[1] else None, "decoders": decoders,
                "branches": [self._subtree(k, depth + 1) for k in kids] if depth < MAX_TREE_DEPTH else []}

    def count(self) -> int:
        """How many sessions are stored."""
        with self._lock:
            return int(self.conn.execute("SELECT count(*) FROM sessions").fetchone()[0])

    # -- export / import
    def export_session(self, sid: str, branches: bool = True) -> dict[str, Any]:
        """The session as a JSON-ready dict that :meth:`import_session` reads back; with
        ``branches``, its branches (and theirs) ride along under ``"branches"``."""
        return self._export(sid, branches, 0)

    def _export(self, sid: str, branches: bool, depth: int) -> dict[str, Any]:
        s = self.load_session(sid)
        out = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "title": s["title"],
               "created": s["created"], "model": s["model"], "prompt": s["prompt"],
               "settings": s["settings"], "runs": s["runs"]}
        if s["branch"] is not None:
            out["parent"], out["branch"] = s["parent"], s["branch"]
        if branches and s["branches"] and depth < MAX_TREE_DEPTH:
            out["branches"] = [self._export(k, True, depth + 1) for k in s["branches"]]
        return out

    def import_session(self, data: dict[str, Any] | str | bytes, owner: str | None = None) -> str:
        """Store an export as a new session (a new id; nothing is ever overwritten); return its id.

        ``data`` is the export dict or its JSON text. Its branches are stored too, under new
        ids, as branches of the new session. An exported branch whose parent is *not* in the
        file stands alone (it keeps where it branched off, with no parent): an import never
        attaches itself to a session already stored, which may be someone else's. ``owner`` is
        the importing browser's owner id. Raises :class:`PlaygroundError` with one line,
        changing nothing, for text that is not JSON, a file over
        ``PLAYGROUND_MAX_IMPORT_BYTES``, another format or version, or a malformed trace.
        """
        d = parse_export(data)
        who = _check_owner(owner)
        return self._write(lambda conn: self._import_tx(conn, d, None, 0, who))

    def _import_tx(self, conn: sqlite3.Connection, d: dict[str, Any], parent: str | None, depth: int,
                   owner: str | None = None) -> str:
        branch = d.get("branch")
        row = {"title": _clean_title(d["title"], d["prompt"]), "model": d["model"], "prompt": d["prompt"],
               "settings": _dumps(d["settings"], "the session settings"), "created": _now(),
               "parent_id": parent, "branch": _dumps(branch, "the branch") if branch is not None else None,
               "owner": owner}
        runs = [self._run_row(lane, t) for lane, t in enumerate(d["runs"])]
        sid = self._insert_tx(conn, row, runs)
        for child in d.get("branches") or []:
            if depth >= MAX_TREE_DEPTH:
                raise PlaygroundError(f"the import's branches nest deeper than {MAX_TREE_DEPTH}")
            self._import_tx(conn, child, sid, depth + 1, owner)
        return sid


def parse_export(data: dict[str, Any] | str | bytes) -> dict[str, Any]:
    """Check an export (dict or JSON text) against the size limit and the format; return the dict."""
    limit = limits().max_import_bytes
    if isinstance(data, dict):
        size = len(json.dumps(data, ensure_ascii=False, default=str).encode("utf-8"))
    elif isinstance(data, (str, bytes, bytearray)):
        size = len(data.encode("utf-8") if isinstance(data, str) else data)
    else:
        raise PlaygroundError("an import must be a session export (JSON)")
    if size > limit:
        raise PlaygroundError(f"the import is {size:,} bytes; the limit here is {limit:,} bytes")
    if not isinstance(data, dict):
        try:
            data = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise PlaygroundError(f"the import is not valid JSON ({str(e)[:120]})") from None
        except RecursionError:
            raise PlaygroundError(f"the import nests deeper than {MAX_IMPORT_DEPTH} levels") from None
    # Before anything reads it: plain JSON, bounded depth, and numbers a later read can serialise.
    inputs.json_shape("the import", data, max_depth=MAX_IMPORT_DEPTH, max_nodes=None)
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise PlaygroundError(f"the import is not a session export (expected format {EXPORT_FORMAT!r})")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= EXPORT_VERSION:
        raise PlaygroundError(f"unsupported session export version {version!r} "
                              f"(this playground reads 1..{EXPORT_VERSION})")
    missing = [k for k in ("model", "prompt", "settings", "runs") if k not in data]
    if missing:
        raise PlaygroundError(f"the session export is missing field(s): {', '.join(missing)}")
    _check_export_tree(data, 0)
    return data


def _check_export_tree(data: Any, depth: int) -> None:
    """One export (and its branches): fields, traces and branch records."""
    if depth and (not isinstance(data, dict) or any(k not in data for k in ("model", "prompt", "settings", "runs"))):
        raise PlaygroundError("a branch in the import is not a session export")
    _check_session(data.get("title"), data["model"], data["prompt"], data["settings"], data["runs"])
    _check_vocab(data)
    if data.get("branch") is not None:
        _check_branch(data["branch"])
    elif depth:
        raise PlaygroundError("a branch in the import says nowhere where it branched off")
    kids = data.get("branches")
    if kids is None:
        return
    if not isinstance(kids, list) or depth >= MAX_TREE_DEPTH:
        raise PlaygroundError("an export's branches must be a list of session exports")
    for kid in kids:
        _check_export_tree(kid, depth + 1)


_default: Store | None = None
_default_lock = threading.Lock()


def default_store() -> Store:
    """The process-wide store at :func:`default_path` (opened on first use, reopened if the path changes)."""
    global _default
    path = default_path()
    with _default_lock:
        if _default is None or _default.path != path:
            _default = Store(path)
        return _default
