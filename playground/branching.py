"""Counterfactual branches of a stored session: replace one token of a lane and run on.

:func:`branch_session` takes a stored session, a lane, the step (or output position) whose
token to replace and the replacement token id, re-runs that lane — or every lane, from the same
edited prefix — with forced tokens (``playground/force.py``) and stores the result as a branch
of the session (``playground/store.py``); a one-lane branch keeps the parent's lane beside it,
so any replay shows where the two part. The page, the CLI and the API share it.
"""

from __future__ import annotations

from typing import Any

from playground.core.errors import PlaygroundError
from playground.engine import prepare
from playground.force import forced_positions


def step_position(trace: dict[str, Any], step: int) -> int:
    """The output position of the first token a step committed (positions count from 0)."""
    steps = trace.get("steps") or []
    if not 0 <= step < len(steps):
        raise PlaygroundError(f"the lane has no step {step} (it has {len(steps)})")
    if steps[step].get("kind") == "denoise":
        raise PlaygroundError("a diffusion lane cannot be branched: it fills its canvas in no fixed order")
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
