"""``playground sessions ...``: list, show, tree, branch, export (JSON or ``html``), note, import, rename
and delete stored sessions.

Branches (sessions continued from a forced token of another) are listed with where they left
their parent; ``tree ID`` draws the branch tree a session belongs to; ``branch ID --lane N
--step S --token T`` runs a new branch (``playground/branching.py``); a diffusion lane is branched at
its canvas with ``--step S --commit POS[:TOKEN],...`` (a hand on the canvas).

The database is ``--db PATH``, else the store's default (``$PLAYGROUND_DB``,
``/data/playground.db``, ``./playground.db``). Read-only commands never create a database.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from playground.core.errors import PlaygroundError
from playground.core.settings import limits
from playground.html_export import session_html, sessions_html
from playground.notes import notes_of
from playground.store import Store, default_path, is_valid_session_id
from playground.study import study_sessions
from playground.sweep import sweep_sessions, sweep_title

# Branching (the engine, torch) and the HTML export (plotly, the visualizers) are imported inside the
# subcommands that use them, so listing, showing or exporting sessions loads neither.


def _add_db(p: argparse.ArgumentParser, top: bool) -> None:
    # On the subcommand the default is SUPPRESS, so `sessions --db X list` is not undone by
    # the subparser's own default.
    p.add_argument("--db", metavar="PATH", default=None if top else argparse.SUPPRESS,
                   help="session database (default: $PLAYGROUND_DB, /data/playground.db or ./playground.db)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``sessions`` subcommands to ``parser``."""
    _add_db(parser, top=True)
    sub = parser.add_subparsers(dest="sessions_command", parser_class=type(parser), metavar="COMMAND")

    ls = sub.add_parser("list", help="stored sessions, newest first")
    ls.add_argument("--json", action="store_true", help="print a JSON list")
    ls.add_argument("--limit", type=int, default=None, metavar="N", help="only the N newest")
    sh = sub.add_parser("show", help="one session: its lanes and their outputs")
    sh.add_argument("id")
    sh.add_argument("--json", action="store_true", help="print the whole session (with traces) as JSON")
    ex = sub.add_parser("export", help="write a session as a JSON export (or, with --html, one HTML page)")
    ex.add_argument("id")
    ex.add_argument("--html", action="store_true",
                    help="one self-contained HTML file (text, stats, plots; plotly.js inlined) that opens offline")
    ex.add_argument("-o", "--output", default="-", metavar="FILE", help="file to write (default: stdout)")
    hx = sub.add_parser("html", help="write a session (its branch tree with --tree, or --study) as one "
                                     "self-contained HTML page that opens offline")
    hx.add_argument("id", nargs="?")
    hx.add_argument("--tree", action="store_true", help="the whole branch tree ID belongs to, root first")
    hx.add_argument("--study", action="store_true", help="every prompt of the study stored in --db")
    hx.add_argument("--sweep", action="store_true", help="every run of the sweep stored in --db (playground sweep --out)")
    hx.add_argument("-o", "--output", default="-", metavar="FILE", help="file to write (default: stdout)")
    nt = sub.add_parser("note", help="pin a note to a step of a lane (an empty text removes it); "
                                     "without --text, list the session's notes")
    nt.add_argument("id")
    nt.add_argument("--lane", type=int, help="the lane, numbered from 1 as on the page")
    nt.add_argument("--step", type=int, help="the step")
    nt.add_argument("--text", default=None, help="the note")
    im = sub.add_parser("import", help="store a JSON export as a new session; prints its id")
    im.add_argument("file", help="export file, or - for stdin")
    im.add_argument("--json", action="store_true", help='print {"id": ...}')
    rn = sub.add_parser("rename", help="give a session a new title")
    rn.add_argument("id")
    rn.add_argument("title")
    rm = sub.add_parser("delete", help="delete a session")
    rm.add_argument("id")
    tr = sub.add_parser("tree", help="the branch tree a session belongs to, from its root")
    tr.add_argument("id")
    tr.add_argument("--json", action="store_true", help="print the tree as nested JSON")
    br = sub.add_parser("branch", help="replace one token of a lane and run on: a branch of the session (needs the model)")
    br.add_argument("id")
    br.add_argument("--lane", type=int, required=True, help="the lane, numbered from 1 as on the page")
    at = br.add_mutually_exclusive_group(required=True)
    at.add_argument("--step", type=int, help="the step whose token to replace")
    at.add_argument("--position", type=int, help="the output position (from 0) whose token to replace")
    br.add_argument("--token", type=int, help="the replacement token id")
    br.add_argument("--commit", metavar="POS[:TOKEN],...",
                    help="a diffusion lane: the masked positions to commit at --step, each with the model's top-1 "
                         "there or the token id given")
    br.add_argument("--all", action="store_true", help="continue every lane from the edited prefix")
    br.add_argument("--json", action="store_true", help='print {"id": ...}')
    for p in (ls, sh, ex, hx, nt, im, rn, rm, tr, br):
        _add_db(p, top=False)


def _open(args: argparse.Namespace, create: bool) -> Any:
    """The store, or None when the database does not exist and we must not create it."""
    path = args.db or default_path()
    if not create and path != ":memory:" and not os.path.exists(path):
        return None
    return Store(path)


def _missing(sid: str) -> PlaygroundError:
    return PlaygroundError(f"no session with id {sid}" if is_valid_session_id(sid) else "malformed session id")


def _read_import(name: str) -> bytes:
    """The file's bytes, refusing before reading more than the import limit (+1 to detect it)."""
    limit = limits().max_import_bytes
    try:
        if name == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            size = os.path.getsize(name)
            if size > limit:
                raise PlaygroundError(f"the import is {size:,} bytes; the limit here is {limit:,} bytes")
            with open(name, "rb") as f:
                data = f.read(limit + 1)
    except OSError as e:
        raise PlaygroundError(f"cannot read {name}: {e.strerror or e}") from None
    if len(data) > limit:
        raise PlaygroundError(f"the import is over the limit of {limit:,} bytes")
    return data


def _date(created: str) -> str:
    return created[:19].replace("T", " ")


def run(args: argparse.Namespace) -> int:
    """Run a ``sessions`` subcommand; user errors raise :class:`PlaygroundError`."""
    cmd = getattr(args, "sessions_command", None)
    if cmd is None:
        raise PlaygroundError("sessions needs a command: list, show, tree, branch, export, html, note, import, "
                              "rename or delete")
    store = _open(args, create=cmd == "import")
    try:
        return _COMMANDS[cmd](store, args)
    finally:
        if store is not None:
            store.close()


def _list(store: Any, args: argparse.Namespace) -> int:
    sessions = store.list_sessions(limit=args.limit) if store is not None else []
    if args.json:
        print(json.dumps(sessions, ensure_ascii=False))
        return 0
    for s in sessions:
        where = f"  [{_where(s['branch'])} of {s['parent'] or 'a deleted session'}]" if s.get("branch") else ""
        print(f"{s['id']}  {_date(s['created'])}  {s['model']:<20} {','.join(s['decoders']):<30} {s['title']}{where}")
    if not sessions:
        print("no stored sessions", file=sys.stderr)
    return 0


def _where(branch: dict[str, Any]) -> str:
    """Where a branch left its parent, lanes numbered from 1 as on the page."""
    lanes = "every lane" if branch.get("lanes") == "all" else f"lane {branch['lane'] + 1}"
    if branch.get("hand"):
        commits = ", ".join(f"{p}←{t}" for p, t in branch["hand"])
        return f"canvas branch at {lanes} step {branch['step']}: the reader committed {commits}"
    text = f" {branch['text']!r}" if branch.get("text") else ""
    return f"branch at {lanes} step {branch['step']}: token {branch['token']}{text} at position {branch['position']}"


def _tree(store: Any, args: argparse.Namespace) -> int:
    if store is None:
        raise _missing(args.id)
    tree = store.branch_tree(args.id)
    if args.json:
        print(json.dumps(tree, ensure_ascii=False))
        return 0

    def show(node: dict[str, Any], indent: str) -> None:
        for j, kid in enumerate(node["branches"]):
            last = j == len(node["branches"]) - 1
            print(f"{indent}{'└' if last else '├'}─ {kid['id']}  {kid['title']}  ({_where(kid['branch'])})")
            show(kid, indent + ("   " if last else "│  "))

    print(f"{tree['id']}  {tree['title']}  ({','.join(tree['decoders'])})")
    show(tree, "")
    return 0


def _branch(store: Any, args: argparse.Namespace) -> int:
    from playground.branching import branch_canvas, branch_session

    if store is None:
        raise _missing(args.id)
    if args.commit is not None:
        if args.step is None or args.token is not None or args.all:
            raise PlaygroundError("--commit branches one diffusion lane at --step (no --position, --token or --all)")
        sid = branch_canvas(store, args.id, lane=args.lane - 1, step=args.step, commit=_commits(args.commit))
        print(json.dumps({"id": sid}) if args.json else sid)
        return 0
    if args.token is None:
        raise PlaygroundError("a branch needs --token (or --commit for a diffusion lane)")
    sid = branch_session(store, args.id, lane=args.lane - 1, token=args.token, step=args.step,
                         position=args.position, lanes="all" if args.all else "one")
    print(json.dumps({"id": sid}) if args.json else sid)
    return 0


def _commits(text: str) -> list[Any]:
    """``"3,5:1234"`` as ``[3, [5, 1234]]`` (a position alone takes the model's top-1)."""
    out: list[Any] = []
    for part in (x.strip() for x in text.split(",")):
        pos, _, tok = part.partition(":")
        if not pos.strip().isdigit() or (tok and not tok.strip().isdigit()):
            raise PlaygroundError(f"--commit takes POS or POS:TOKEN_ID, comma-separated; got {part!r}")
        out.append([int(pos), int(tok)] if tok else int(pos))
    return out


def _load(store: Any, sid: str) -> dict[str, Any]:
    if store is None:
        raise _missing(sid)
    return store.load_session(sid)


def _show(store: Any, args: argparse.Namespace) -> int:
    s = _load(store, args.id)
    if args.json:
        print(json.dumps(s, ensure_ascii=False))
        return 0
    print(f"{s['title']}\n{s['id']}  {_date(s['created'])}  model {s['model']}\nprompt: {s['prompt']}")
    if s.get("branch"):
        print(f"{_where(s['branch'])} of {s['parent'] or 'a deleted session'}")
    if s.get("branches"):
        print(f"branches: {', '.join(s['branches'])}")
    for lane, t in enumerate(s["runs"], start=1):  # lanes numbered from 1, as on the page
        st = t.get("stats", {})
        print(f"\n== lane {lane}: {t['decoder']}  {st.get('new_tokens', '?')} tokens, "
              f"{st.get('target_forwards', '?')} target forwards, finish {st.get('finish_reason', '?')}")
        print(t["text"])
    return 0


def _tree_ids(tree: dict[str, Any]) -> list[str]:
    return [tree["id"], *(i for b in tree.get("branches") or [] for i in _tree_ids(b))]


def _html(store: Any, args: argparse.Namespace) -> str:
    """The page ``sessions html`` writes: one session, its branch tree, or the study's prompts."""
    if args.study or args.sweep:
        if args.id or args.tree or (args.study and args.sweep):
            raise PlaygroundError("html --study or --sweep takes no ID, no --tree and not the other")
        if args.sweep:
            sessions = sweep_sessions(store) if store is not None else []
            if not sessions:
                raise PlaygroundError("this database holds no sweep")
            return sessions_html(sessions, sweep_title(sessions))
        sessions = study_sessions(store) if store is not None else []
        if not sessions:
            raise PlaygroundError("this database holds no study")
        return sessions_html(sessions, f"Study: {len(sessions)} prompts")
    if not args.id:
        raise PlaygroundError("html needs a session ID (or --study, or --sweep)")
    if store is None:
        raise _missing(args.id)
    if args.tree:
        ids = _tree_ids(store.branch_tree(args.id))
        sessions = [store.load_session(i) for i in ids]
        return sessions_html(sessions, f"Branch tree of “{sessions[0]['title']}”")
    return session_html(store.load_session(args.id))


def _export(store: Any, args: argparse.Namespace) -> int:
    if args.sessions_command == "html":
        text = _html(store, args)
    elif store is None:
        raise _missing(args.id)
    elif args.html:
        text = session_html(store.load_session(args.id))
    else:
        text = json.dumps(store.export_session(args.id), ensure_ascii=False)
    if args.output == "-":
        print(text)
        return 0
    try:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise PlaygroundError(f"cannot write {args.output}: {e.strerror or e}") from None
    what = args.id or ("the sweep" if getattr(args, "sweep", False) else "the study")
    print(f"exported {what} to {args.output}", file=sys.stderr)
    return 0


def _import(store: Any, args: argparse.Namespace) -> int:
    sid = store.import_session(_read_import(args.file))
    print(json.dumps({"id": sid}) if args.json else sid)
    return 0


def _rename(store: Any, args: argparse.Namespace) -> int:
    if store is None:
        raise _missing(args.id)
    store.rename_session(args.id, args.title)
    return 0


def _delete(store: Any, args: argparse.Namespace) -> int:
    if store is None:
        raise _missing(args.id)
    store.delete_session(args.id)
    print(f"deleted {args.id}", file=sys.stderr)
    return 0


def _note(store: Any, args: argparse.Namespace) -> int:
    if store is None:
        raise _missing(args.id)
    if args.text is None:
        for n in notes_of(store.load_session(args.id)):
            print(f"lane {n['lane'] + 1}, step {n['step']}: {n['text']}")
        return 0
    if args.lane is None or args.step is None:
        raise PlaygroundError("a note needs --lane and --step")
    if args.lane < 1:
        raise PlaygroundError("lanes are numbered from 1")
    store.set_note(args.id, args.lane - 1, args.step, args.text)
    print(f"{'noted' if args.text.strip() else 'removed the note on'} lane {args.lane}, step {args.step}", file=sys.stderr)
    return 0


_COMMANDS = {"list": _list, "show": _show, "export": _export, "html": _export, "note": _note, "import": _import,
             "rename": _rename, "delete": _delete, "tree": _tree, "branch": _branch}
