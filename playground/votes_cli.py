"""``playground votes ...``: make a stored session (or a whole study) blind, and read the votes.

    playground votes blind ID [ID ...] | --study     mark sessions blind (readers vote at /vote?session=ID)
    playground votes open ID [ID ...]                take the blind mark off again (ballots stay)
    playground votes results [ID ...] [--json]       Bradley–Terry table over the ballots of those
                                                     sessions (all stored sessions when none given)

The database is ``--db PATH``, else the store's default, as for ``playground sessions``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any

from playground.core.errors import PlaygroundError
from playground.store import Store, default_path, is_valid_session_id
from playground.study import study_sessions
from playground.votes import results, results_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``votes`` subcommands to ``parser``."""
    parser.add_argument("--db", metavar="PATH", default=None,
                        help="session database (default: $PLAYGROUND_DB, /data/playground.db or ./playground.db)")
    sub = parser.add_subparsers(dest="votes_command", parser_class=type(parser), metavar="COMMAND")
    bl = sub.add_parser("blind", help="mark sessions blind: readers of their links vote on letters")
    bl.add_argument("ids", nargs="*", metavar="ID")
    bl.add_argument("--study", action="store_true", help="every session of the study stored in --db")
    op = sub.add_parser("open", help="take the blind mark off sessions")
    op.add_argument("ids", nargs="+", metavar="ID")
    rs = sub.add_parser("results", help="Bradley–Terry strengths per configuration with 95%% intervals")
    rs.add_argument("ids", nargs="*", metavar="ID")
    rs.add_argument("--json", action="store_true", help="print the table as JSON")


def _ids(ids: list[str]) -> list[str]:
    for sid in ids:
        if not is_valid_session_id(sid):
            raise PlaygroundError(f"malformed session id {sid!r}")
    return ids


def run(args: argparse.Namespace) -> int:
    """Run a ``votes`` subcommand; user errors raise :class:`PlaygroundError`."""
    cmd = getattr(args, "votes_command", None)
    if cmd is None:
        raise PlaygroundError("votes needs a command: blind, open or results")
    path = args.db or default_path()
    if path != ":memory:" and not os.path.exists(path):
        raise PlaygroundError(f"no session database at {path}")
    with Store(path) as store:
        if cmd == "results":
            return _results(store, _ids(args.ids), args.json)
        ids = _ids(args.ids)
        if cmd == "blind" and args.study:
            ids += [s["id"] for s in study_sessions(store)]
        if not ids:
            raise PlaygroundError("name the sessions (IDs) or --study")
        for sid in ids:
            store.set_blind(sid, cmd == "blind")
        word = "blind" if cmd == "blind" else "open"
        print(f"{len(ids)} session{'s' if len(ids) != 1 else ''} {word}" +
              ("; readers vote at /vote?session=<id>" if cmd == "blind" else ""))
    return 0


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    """A row for JSON: an unbounded interval end (too few ballots) as null."""
    return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in row.items()}


def _results(store: Any, ids: list[str], as_json: bool) -> int:
    # Only sessions someone voted on are read: a store of many unvoted sessions costs nothing.
    ballots = store.ballots(ids or None)
    voted = list(dict.fromkeys(b["session"] for b in ballots))
    res = results([store.load_session(s) for s in voted], ballots)
    if as_json:
        print(json.dumps({"ballots": res.ballots, "sessions": res.sessions,
                          "rows": [_finite(r.__dict__) for r in res.rows], "reasons": res.reasons}, ensure_ascii=False))
    else:
        print(results_table(res))
    return 0
