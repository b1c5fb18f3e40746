"""Ballots on blind comparisons: the letters a reader sees, and what a vote may say.

Pure checks and mappings, read by the store (which keeps the ballots) and by the vote page;
the Results table over them is :mod:`playground.votes`.

A ballot is one of

* ``{"kind": "best", "winner": LANE}`` — LANE beat every other lane; ``"winner": None`` is a tie
  of all lanes;
* ``{"kind": "pair", "a": LANE, "b": LANE, "winner": "a" | "b" | "tie"}``,

with lanes as stored indices; the page sends letters and :func:`ballot_from_letters` maps them
through the reader's order (:func:`reader_order`).
"""

from __future__ import annotations

import hashlib
import random
import string
from typing import Any

from playground.core.errors import PlaygroundError

LETTERS = string.ascii_uppercase
MAX_REASON_CHARS = 500
MAX_BALLOTS_PER_SESSION = 10_000  # readers of one share link whose ballots are kept
WINNERS = ("a", "b", "tie")


def letter(k: int) -> str:
    """The letter of the k-th shown lane (0 → A)."""
    return LETTERS[k]


def reader_order(sid: str, reader: str, lanes: int) -> list[int]:
    """The stored lane shown as each letter to ``reader``: ``order[k]`` is letter k's lane.
    A fixed function of the session, the reader and the lane count."""
    seed = int.from_bytes(hashlib.sha256(f"blind v1|{sid}|{reader}".encode()).digest()[:8], "big")
    order = list(range(lanes))
    random.Random(seed).shuffle(order)
    return order


def _letter_index(value: Any, lanes: int, what: str) -> int:
    """The shown index of a letter sent by the page; one line when it is not one of them."""
    if not isinstance(value, str) or len(value) != 1 or value.upper() not in LETTERS[:lanes]:
        raise PlaygroundError(f"{what} must be one of the letters {', '.join(LETTERS[:lanes])}")
    return LETTERS.index(value.upper())


def ballot_from_letters(sent: Any, order: list[int]) -> dict[str, Any]:
    """A stored ballot (lanes) from what the vote page sent (letters), checked.

    ``sent``: ``{"kind": "best", "winner": "B" | "tie"}`` or ``{"kind": "pair", "a": "A",
    "b": "C", "winner": "a" | "b" | "tie"}``."""
    lanes = len(order)
    if not isinstance(sent, dict):
        raise PlaygroundError("a vote is a best lane or a pair")
    kind = sent.get("kind")
    if kind == "best":
        w = sent.get("winner")
        if w == "tie":
            return {"kind": "best", "winner": None}
        return {"kind": "best", "winner": order[_letter_index(w, lanes, "the best lane")]}
    if kind == "pair":
        a = _letter_index(sent.get("a"), lanes, "the first lane of the pair")
        b = _letter_index(sent.get("b"), lanes, "the second lane of the pair")
        if a == b:
            raise PlaygroundError("a pair needs two different lanes")
        w = sent.get("winner")
        if w not in WINNERS:
            raise PlaygroundError("the pair's winner is a, b or tie")
        return {"kind": "pair", "a": order[a], "b": order[b], "winner": w}
    raise PlaygroundError("a vote's kind is best or pair")


def check_ballot(ballot: Any, lanes: int) -> dict[str, Any]:
    """A stored-form ballot (lanes, not letters) checked against a session of ``lanes`` lanes:
    what the store and the command line accept."""
    if not isinstance(ballot, dict) or ballot.get("kind") not in ("best", "pair"):
        raise PlaygroundError("a ballot is {'kind': 'best', 'winner': LANE or None} or "
                              "{'kind': 'pair', 'a': LANE, 'b': LANE, 'winner': 'a'|'b'|'tie'}")

    def lane(v: Any, what: str) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < lanes:
            raise PlaygroundError(f"{what} must be a lane index 0–{lanes - 1}")
        return v

    if lanes < 2:
        raise PlaygroundError("a vote needs a session of at least two lanes")
    if ballot["kind"] == "best":
        w = ballot.get("winner")
        return {"kind": "best", "winner": None if w is None else lane(w, "the best lane")}
    a, b = lane(ballot.get("a"), "the pair's first lane"), lane(ballot.get("b"), "the pair's second lane")
    if a == b:
        raise PlaygroundError("a pair needs two different lanes")
    if ballot.get("winner") not in WINNERS:
        raise PlaygroundError("the pair's winner is a, b or tie")
    return {"kind": "pair", "a": a, "b": b, "winner": ballot["winner"]}


def check_reason(reason: Any) -> str:
    """The reason text, stripped; one line if it is not text or too long."""
    if reason is None:
        return ""
    if not isinstance(reason, str):
        raise PlaygroundError("the reason must be text")
    reason = reason.strip()
    if len(reason) > MAX_REASON_CHARS:
        raise PlaygroundError(f"the reason is {len(reason)} characters; at most {MAX_REASON_CHARS}")
    return reason


def lane_comparisons(ballot: dict[str, Any], lanes: int) -> list[tuple[int, int, float]]:
    """A ballot as pairwise outcomes between lanes: a best lane beats each other lane; a tie of
    all lanes is a tie in every pair; a pair is one outcome."""
    if ballot["kind"] == "best":
        w = ballot["winner"]
        if w is None:
            return [(i, j, 0.5) for i in range(lanes) for j in range(i + 1, lanes)]
        return [(w, j, 1.0) for j in range(lanes) if j != w]
    out = {"a": 1.0, "b": 0.0, "tie": 0.5}[ballot["winner"]]
    return [(ballot["a"], ballot["b"], out)]
