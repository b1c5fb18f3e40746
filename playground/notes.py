"""Notes on steps: a reader's remark pinned to one step of one lane of a stored session
("here the draft is rejected because…").

Kept in the session's settings (``settings.notes``: ``"lane:step"`` → ``{"text", "updated"}``,
lanes 0-based as stored), written by :meth:`playground.store.Store.set_note` (the session's
owner only on a hosted instance), shown in the Compare page's *Notes* panel on every replay
and in the session's HTML export. One note per step of a lane; an empty text removes it.
"""

from __future__ import annotations

from typing import Any

from playground.core.errors import PlaygroundError

MAX_NOTE_CHARS = 1000
MAX_NOTES = 500  # per session


def note_key(lane: int, step: int) -> str:
    """Where the note on ``lane`` (0-based) and ``step`` is kept in ``settings.notes``."""
    return f"{int(lane)}:{int(step)}"


def check_place(lane: Any, step: Any) -> tuple[int, int]:
    """A lane and step as whole numbers ≥ 0; one line when they are not."""
    out = []
    for what, v in (("lane", lane), ("step", step)):
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise PlaygroundError(f"a note's {what} is a whole number")
        try:
            n = int(float(v)) if not isinstance(v, int) else v
        except (ValueError, OverflowError):
            raise PlaygroundError(f"a note's {what} is a whole number, got {v!r}") from None
        if n < 0 or float(v) != n:
            raise PlaygroundError(f"a note's {what} is a whole number ≥ 0, got {v!r}")
        out.append(n)
    return out[0], out[1]


def check_text(text: Any) -> str:
    """A note's text, stripped; at most :data:`MAX_NOTE_CHARS` characters ('' removes the note)."""
    if text is None:
        return ""
    if not isinstance(text, str):
        raise PlaygroundError("a note is text")
    text = text.strip()
    if len(text) > MAX_NOTE_CHARS:
        raise PlaygroundError(f"a note is at most {MAX_NOTE_CHARS} characters; this one has {len(text)}")
    return text


def notes_of(session: dict[str, Any]) -> list[dict[str, Any]]:
    """A loaded session's notes as ``{"lane", "step", "text", "updated"}``, by lane then step
    (malformed entries, which only a hand-edited database holds, are left out)."""
    kept = (session.get("settings") or {}).get("notes")
    out = []
    for key, v in (kept.items() if isinstance(kept, dict) else ()):
        try:
            lane, step = (int(x) for x in str(key).split(":"))
        except ValueError:
            continue
        if isinstance(v, dict) and isinstance(v.get("text"), str):
            out.append({"lane": lane, "step": step, "text": v["text"], "updated": str(v.get("updated", ""))})
    return sorted(out, key=lambda n: (n["lane"], n["step"]))
