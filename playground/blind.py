"""What a reader of a blind comparison may see, before and after their vote.

The vote page (:mod:`playground.ui.vote_page`) asks here for a reader's view of a blind session
and sends their ballot here. Before the reader's ballot is stored, the view carries the prompt
and each lane's text under a letter, in the reader's own order (:func:`playground.ballots.reader_order`)
— no decoder name, knob, colour, model or statistic. Once stored, the view adds the reveal: what
each letter was, the lane's numbers, and the session's table so far.

Everything else that would show a blind session's lanes by id (the Compare page's
``?session=`` replay, the API's session export, the Sessions tab's export, the sandbox's
step picker) asks :func:`readable` first: only the session's owner reads it there while it is
blind.
"""

from __future__ import annotations

from typing import Any

import visualizers
from playground.ballots import LETTERS, ballot_from_letters, letter, reader_order
from playground.core.errors import PlaygroundError
from playground.ownership import owner_id
from playground.store import Store, is_valid_session_id
from playground.votes import config_label, format_interval, results

MAX_QUEUE = 200  # blind prompts of one study a reader is walked through


def is_blind(session: dict[str, Any]) -> bool:
    """Whether a loaded session is marked blind."""
    return bool((session.get("settings") or {}).get("blind"))


def readable(store: Store, sid: str, key: Any) -> bool:
    """Whether a caller holding owner key ``key`` may read session ``sid`` by id outside the vote
    page: any session that is not blind; a blind one only by its owner (so a share link cannot
    be opened around the vote). Reads the flag and the owner only, not the session's runs."""
    if not store.setting_of(sid, "$.blind"):
        return True
    who = owner_id(key)
    return who is not None and store.session_owner(sid) == who


def check_readable(store: Store, sid: str, key: Any) -> None:
    """Refuse, in one line, reading a blind session that is not the caller's."""
    if not readable(store, sid, key):
        raise PlaygroundError(f"this comparison is a blind vote: vote at /vote?session={sid}; "
                              "the decoders are shown there once you have voted")


def _reader(key: Any) -> str:
    who = owner_id(key)
    if who is None:
        raise PlaygroundError("the vote page needs its reader key (it makes one in this browser's storage)")
    return who


def _blind_session(store: Store, sid: Any) -> dict[str, Any]:
    if not is_valid_session_id(sid):
        raise PlaygroundError("no such comparison: the link's session id is malformed")
    session = store.load_session(sid)
    if not is_blind(session):
        raise PlaygroundError("this comparison is not a blind vote: open it with /?session=" + sid)
    return session


def reader_view(store: Store, sid: Any, key: Any) -> dict[str, Any]:
    """A reader's view of blind session ``sid``: ``{"session", "prompt", "lanes": [{"letter",
    "text"}], "voted"}`` and, once they voted, ``"ballot"`` (in letters) and ``"reveal"``."""
    session = _blind_session(store, sid)
    reader = _reader(key)
    runs = session["runs"]
    order = reader_order(session["id"], reader, len(runs))
    view: dict[str, Any] = {
        "session": session["id"], "prompt": session["prompt"],
        "lanes": [{"letter": letter(k), "text": runs[lane].get("text", "")} for k, lane in enumerate(order)],
        "voted": False,
    }
    stored = store.ballot_of(session["id"], reader)
    if stored is not None:
        view.update(voted=True, ballot=_in_letters(stored["ballot"], order), reason=stored["reason"],
                    reveal=reveal(store, session, order))
    return view


def cast(store: Store, sid: Any, key: Any, sent: Any, reason: Any = "") -> dict[str, Any]:
    """Store a reader's ballot (letters, as the page sends it; a revote replaces theirs) and
    return their view with the reveal."""
    session = _blind_session(store, sid)
    reader = _reader(key)
    order = reader_order(session["id"], reader, len(session["runs"]))
    ballot = ballot_from_letters(sent, order)
    store.add_ballot(session["id"], reader, ballot, reason if isinstance(reason, str) else "")
    return reader_view(store, session["id"], key)


def _in_letters(ballot: dict[str, Any], order: list[int]) -> dict[str, Any]:
    """A stored ballot (lanes) back in this reader's letters."""
    shown = {lane: LETTERS[k] for k, lane in enumerate(order)}
    if ballot["kind"] == "best":
        w = ballot["winner"]
        return {"kind": "best", "winner": "tie" if w is None else shown[w]}
    return {"kind": "pair", "a": shown[ballot["a"]], "b": shown[ballot["b"]], "winner": ballot["winner"]}


def reveal(store: Store, session: dict[str, Any], order: list[int]) -> dict[str, Any]:
    """What the letters were (configuration and its stats line, escaped HTML, per letter) and the session's
    Bradley–Terry table over every ballot stored on it so far."""
    runs = session["runs"]
    lanes = [{"letter": letter(k), "label": config_label(session["model"], runs[lane]),
              "numbers": visualizers.stats_line(runs[lane])} for k, lane in enumerate(order)]
    res = results([session], store.ballots([session["id"]]))
    rows = [{"label": r.label, "score": round(r.score, 3), "interval": format_interval(r.low, r.high),
             "wins": r.wins, "losses": r.losses, "ties": r.ties} for r in res.rows]
    return {"lanes": lanes, "ballots": res.ballots, "table": rows}


def study_queue(store: Store, key: Any) -> dict[str, Any]:
    """The blind comparisons of the study stored here, in prompt order, with whether this
    reader voted on each: ``{"sessions": [{"session", "voted"}], "next"}`` (``next`` the first
    one not voted on, None when all are done)."""
    reader = _reader(key)
    # found by the store's flags, never by loading sessions: anyone may ask
    keyed = [(store.setting_of(i, "$.study.index") or 0, str(store.setting_of(i, "$.study.key")), i)
             for i in store.sessions_with_setting("$.blind", True) if store.setting_of(i, "$.study.key") is not None]
    blind = [i for _index, _key, i in sorted(keyed)][:MAX_QUEUE]
    if not blind:
        raise PlaygroundError("no blind study here: mark one with `playground votes blind --study`")
    rows = [{"session": i, "voted": store.ballot_of(i, reader) is not None} for i in blind]
    nxt = next((r["session"] for r in rows if not r["voted"]), None)
    return {"sessions": rows, "next": nxt}
