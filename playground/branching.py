"""Counterfactual branches of a stored session: replace one token of a lane and run on.

:func:`branch_session` takes a stored session, a lane, the step (or output position) whose
token to replace and the replacement token id, re-runs that lane — or every lane, from the same
edited prefix — with forced tokens (``playground/force.py``) and stores the result as a branch
of the session (``playground/store.py``); a one-lane branch keeps the parent's lane beside it,
so any replay shows where the two part. The page, the CLI and the API share it.

A diffusion lane fills its canvas in no fixed order, so it is branched at its canvas instead:
:func:`branch_canvas` takes a step ``s`` and the positions (and tokens) the reader commits there
— a *hand* (``decoders/diffusion/hand.py``) — and re-runs the lane, which replays steps
``0 .. s-1``, commits the reader's choice at ``s`` and goes on with its own rule. The branch is
stored beside the parent's lane like a one-lane token branch (its record's ``hand`` lists the
commits); a replayed canvas that parts from the parent's before ``s`` is refused.
"""

from __future__ import annotations

from typing import Any

from decoders.diffusion.hand import MAX_HAND
from playground.core.errors import PlaygroundError
from playground.engine import prepare
from playground.force import forced_positions


def step_position(trace: dict[str, Any], step: int) -> int:
    """The output position of the first token a step committed (positions count from 0)."""
    steps = trace.get("steps") or []
    if not 0 <= step < len(steps):
        raise PlaygroundError(f"the lane has no step {step} (it has {len(steps)})")
    if steps[step].get("kind") == "denoise":
        raise PlaygroundError("a diffusion lane fills its canvas in no fixed order: branch it at its canvas "
                              "(positions to commit at a step) instead of one token")
    if not steps[step].get("committed"):
        raise PlaygroundError(f"step {step} committed no token to replace")
    return sum(len(s.get("committed") or []) for s in steps[:step] if s.get("kind") != "denoise")


def position_step(trace: dict[str, Any], position: int) -> int:
    """The step that committed output position ``position``."""
    n = 0
    for s in trace.get("steps") or []:
        if s.get("kind") == "denoise":
            continue
        n += len(s.get("committed") or [])
        if position < n:
            return int(s.get("i", 0))
    raise PlaygroundError(f"the lane has no token at position {position} (it has {n})")


def branch_requests(session: dict[str, Any], lane: int, token: int, step: int | None = None,
                    position: int | None = None, lanes: str = "one") -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The ``engine.prepare`` keyword arguments of each lane of the branch, and its branch record.

    ``lanes="one"``: the lane alone, its earlier forced tokens kept. ``"all"``: every lane of the
    session continues from the lane's edited prefix (the prefix and the new token are forced).
    """
    runs = session.get("runs") or []
    if not isinstance(lane, int) or not 0 <= lane < len(runs):
        raise PlaygroundError(f"the session has no lane {lane + 1 if isinstance(lane, int) else lane!r}")
    if lanes not in ("one", "all"):
        raise PlaygroundError("lanes must be 'one' or 'all'")
    trace = runs[lane]
    if (step is None) == (position is None):
        raise PlaygroundError("a branch needs the step or the position of the token to replace (one of them)")
    if step is None:
        step = position_step(trace, int(position))  # type: ignore[arg-type]
    pos = step_position(trace, step) if position is None else int(position)
    out = [int(t) for t in trace.get("output_ids") or []]
    if pos >= len(out):
        raise PlaygroundError(f"the lane has no token at position {pos}")
    mnt = int((session.get("settings") or {}).get("max_new_tokens") or 0) or max(len(out), pos + 1)
    targets = [lane] if lanes == "one" else list(range(len(runs)))
    requests = []
    for j in targets:
        t = runs[j]
        if j == lane:
            force = {**{p: tok for p, tok in forced_positions(t).items() if p < pos}, pos: int(token)}
        else:
            force = {**{p: out[p] for p in range(pos)}, pos: int(token)}
        requests.append({"model": t["model"], "decoder": t["decoder"], "prompt": t["prompt"],
                         "max_new_tokens": max(mnt, pos + 1), "seed": int(t.get("seed", 0)),
                         "draft": t.get("draft"), "params": dict(t.get("params") or {}),
                         "force": sorted([p, tok] for p, tok in force.items())})
    record = {"lane": lane, "step": int(step), "position": pos, "token": int(token), "lanes": lanes}
    tokens = trace.get("tokens") or {}
    if str(token) in tokens:
        record["text"] = tokens[str(token)]
    return requests, record


def branch_session(store: Any, sid: str, lane: int, token: int, step: int | None = None,
                   position: int | None = None, lanes: str = "one", title: str | None = None,
                   owner: str | None = None, attach: bool = True) -> str:
    """Run a branch of stored session ``sid`` and store it; return the branch's session id.

    A one-lane branch is stored beside its parent: its runs are the parent's lane (unchanged)
    and the branched lane. A branch of every lane holds the branched lanes in lane order.
    ``owner`` is the branching browser's owner id; without ``attach`` (a visitor branching a
    session that is not theirs) the branch keeps where it branched off but is not filed under
    the parent, so nobody can add to another's branch tree."""
    session = store.load_session(sid)
    requests, record = branch_requests(session, lane, token, step=step, position=position, lanes=lanes)
    traces = []
    for req in requests:
        try:
            traces.append(prepare(**req).finish().to_dict())
        except PlaygroundError as e:
            raise PlaygroundError(f"lane {lane + 1} ({req['decoder']}): {e}") from None
    shown = f" {record['text']!r}" if "text" in record else f" #{token}"
    name = title or f"{session['title'][:120]} / lane {lane + 1} step {record['step']} →{shown}"
    return _store_branch(store, sid, session, lane, lanes, traces, record, name, owner, attach)


def _store_branch(store: Any, sid: str, session: dict[str, Any], lane: int, lanes: str, traces: list[Any],
                  record: dict[str, Any], name: str, owner: str | None, attach: bool) -> str:
    """Store a branch's traces (a one-lane branch beside the parent's lane) and return its id."""
    settings = dict(session.get("settings") or {})
    if lanes == "one":
        # the branch beside its parent: the parent's lane (unchanged), then the branched one, so
        # every replay (share link, Sessions view) shows where they part
        traces = [session["runs"][lane], *traces]
        configs = settings.get("lanes")
        if isinstance(configs, list) and len(configs) == len(session["runs"]):
            settings["lanes"] = [configs[lane], configs[lane]]
    if not attach:
        return store.save_session(name, session["model"], session["prompt"], settings, traces, owner=owner)
    return store.save_session(name, session["model"], session["prompt"], settings, traces,
                              parent=sid, branch=record, owner=owner)


# ---------------------------------------------------------------------- a hand on the canvas
def masked_at(trace: dict[str, Any], step: int) -> list[int]:
    """The generated positions still masked when diffusion step ``step`` began (those it proposed
    a token for); PlaygroundError for a lane that is not a diffusion lane or a step out of range."""
    steps = trace.get("steps") or []
    if not steps or steps[0].get("kind") != "denoise":
        raise PlaygroundError("only a diffusion lane is branched at its canvas; branch this lane at a token")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < len(steps):
        raise PlaygroundError(f"the lane has no step {step} (it has {len(steps)}, from 0)")
    return [p for p, v in enumerate(steps[step].get("predicted") or []) if v is not None]


def canvas_choices(trace: dict[str, Any], step: int, position: int) -> list[tuple[str, int]]:
    """The tokens a reader may commit at a masked position of a diffusion step: its recorded
    top-K under the model, as ``("'text'  p=0.123", token_id)``, most probable first."""
    steps = trace.get("steps") or []
    s = steps[step] if 0 <= step < len(steps) else {}
    all_ids, all_probs = s.get("top_ids") or [], s.get("top_probs") or []
    ids = (all_ids[position] if 0 <= position < len(all_ids) else None) or []
    probs = (all_probs[position] if 0 <= position < len(all_probs) else None) or [None] * len(ids)
    tokens = trace.get("tokens") or {}
    out = []
    for t, p in zip(ids, probs):
        text = repr(tokens.get(str(t), f"#{t}"))
        out.append((text if p is None else f"{text}  p={float(p):.3g}", int(t)))
    return out


def canvas_requests(session: dict[str, Any], lane: int, step: int, commit: Any,
                    restrict: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``engine.prepare`` keyword arguments of a canvas branch, and its branch record.

    ``commit``: the positions to commit at ``step``, a list of positions (each takes the model's
    top-1 there) or ``{position: token_id or None}`` / ``[[position, token_id], ...]``. With
    ``restrict`` a token must be one of the position's recorded top-K (the page's offer)."""
    runs = session.get("runs") or []
    if isinstance(lane, bool) or not isinstance(lane, int) or not 0 <= lane < len(runs):
        raise PlaygroundError(f"the session has no lane {lane + 1 if isinstance(lane, int) else lane!r}")
    trace = runs[lane]
    masked = masked_at(trace, step)
    st = trace["steps"][step]
    pairs = _commit_pairs(commit)
    if len(pairs) > MAX_HAND:
        raise PlaygroundError(f"a hand commits at most {MAX_HAND} positions, not {len(pairs)}")
    hand: dict[int, int] = {}
    for pos, tok in pairs:
        if pos not in masked:
            raise PlaygroundError(f"position {pos} is not masked at step {step}"
                                  + (f" (the canvas has {len(st.get('canvas') or [])} positions)"
                                     if pos >= len(st.get("canvas") or []) else ""))
        if pos in hand:
            raise PlaygroundError(f"position {pos} is chosen twice")
        top = [t for _label, t in canvas_choices(trace, step, pos)]
        if tok is None:
            tok = top[0] if top else int(st["predicted"][pos])
        if restrict and tok not in top:
            raise PlaygroundError(f"token {tok} is not among position {pos}'s top {len(top)} at step {step}")
        hand[pos] = int(tok)
    req = {"model": trace["model"], "decoder": trace["decoder"], "prompt": trace["prompt"],
           "max_new_tokens": int((session.get("settings") or {}).get("max_new_tokens") or 0)
           or len(st.get("canvas") or []) or 1,
           "seed": int(trace.get("seed", 0)), "draft": trace.get("draft"),
           "params": dict(trace.get("params") or {}),
           "hand": {"step": int(step), "commit": [[p, t] for p, t in sorted(hand.items())]}}
    if trace.get("chat"):
        req["chat"], req["system_prompt"] = True, trace.get("system_prompt")
    first = min(hand)
    record = {"lane": lane, "step": int(step), "position": first, "token": hand[first], "lanes": "one",
              "hand": [[p, t] for p, t in sorted(hand.items())]}
    tokens = trace.get("tokens") or {}
    if str(hand[first]) in tokens:
        record["text"] = tokens[str(hand[first])]
    return req, record


def _commit_pairs(commit: Any) -> list[tuple[int, int | None]]:
    """``[(position, token or None), ...]`` from a list of positions, pairs or a dict."""
    if isinstance(commit, dict):
        items: list[Any] = list(commit.items())
    elif isinstance(commit, (list, tuple)):
        items = [c if isinstance(c, (list, tuple)) else (c, None) for c in commit]
    else:
        raise PlaygroundError("choose the positions to commit (a list of positions or position: token pairs)")
    if not items:
        raise PlaygroundError("choose at least one masked position to commit")
    out: list[tuple[int, int | None]] = []
    for item in items:
        if len(item) != 2:
            raise PlaygroundError(f"a commit is a position and a token id, got {item!r}")
        pos, tok = item
        for what, v in (("position", pos), ("token id", tok)):
            if v is not None and (isinstance(v, bool) or not str(v).strip().isdigit()):
                raise PlaygroundError(f"a commit's {what} must be a whole number >= 0, got {v!r}")
        if pos is None:
            raise PlaygroundError("a commit needs its position")
        out.append((int(pos), None if tok is None else int(tok)))
    return out


def branch_canvas(store: Any, sid: str, lane: int, step: int, commit: Any, restrict: bool = False,
                  title: str | None = None, owner: str | None = None, attach: bool = True) -> str:
    """Run a canvas branch of stored session ``sid`` (see :func:`canvas_requests`) and store it
    beside the parent's lane; return the branch's id. ``owner``/``attach`` as in
    :func:`branch_session`. The branch's replay of steps ``0 .. step-1`` must give the parent's
    canvases (it does for a deterministic run of the same code); else one line of error."""
    session = store.load_session(sid)
    req, record = canvas_requests(session, lane, step, commit, restrict=restrict)
    try:
        trace = prepare(**req).finish().to_dict()
    except PlaygroundError as e:
        raise PlaygroundError(f"lane {lane + 1} ({req['decoder']}): {e}") from None
    parent = session["runs"][lane]["steps"]
    for k in range(step):
        if k >= len(trace["steps"]) or trace["steps"][k].get("canvas") != parent[k].get("canvas"):
            raise PlaygroundError(f"lane {lane + 1} did not replay to step {step}: its canvas parts from the "
                                  f"stored one at step {k} (the model or the decoder changed since)")
    shown = f" {record['text']!r}" if "text" in record else f" #{record['token']}"
    more = f" +{len(record['hand']) - 1}" if len(record["hand"]) > 1 else ""
    name = title or (f"{session['title'][:120]} / lane {lane + 1} step {step}: "
                     f"{record['position']}←{shown.strip()}{more}")
    return _store_branch(store, sid, session, lane, "one", [trace], record, name, owner, attach)


# ---------------------------------------------------------------------- for the page's inspector
def token_choices(trace: dict[str, Any], step: int) -> list[tuple[str, int]]:
    """The replacement tokens the inspector offers at a step: its recorded top-K (the model's
    raw distribution), as ``("'text'  p=0.123", token_id)``, the committed token left out."""
    steps = trace.get("steps") or []
    if not 0 <= step < len(steps):
        return []
    s = steps[step]
    dist = s.get("dist") or s.get("correction_dist")
    if not isinstance(dist, dict):
        return []
    committed = set(s.get("committed") or [])
    tokens = trace.get("tokens") or {}
    out = []
    for tid, p in zip(dist.get("top_ids") or [], dist.get("raw_probs") or []):
        if tid in committed:
            continue
        out.append((f"{tokens.get(str(tid), '#' + str(tid))!r}  p={float(p):.3g}", int(tid)))
    return out


def resolve_token(value: Any, tokenizer: Any = None) -> int:
    """A replacement token from the inspector: a token id (int, or digits), or typed text that
    the lane's tokenizer encodes to exactly one token."""
    if isinstance(value, bool):
        raise PlaygroundError("pick a token to put in its place")
    if isinstance(value, int):
        return value
    text = "" if value is None else str(value)
    if text.strip().isdigit():
        return int(text.strip())
    if not text:
        raise PlaygroundError("pick a token from the list or type text that is one token")
    if tokenizer is None:
        raise PlaygroundError("typed text needs the lane's tokenizer")
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise PlaygroundError(f"{text!r} is {len(ids)} tokens for this model; type text that is exactly one token")
    return int(ids[0])
