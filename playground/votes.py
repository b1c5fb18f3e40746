"""Blind comparisons: letters per reader, ballots, and the Bradley–Terry table of the votes.

A session marked *blind* (``settings["blind"] = True``, :meth:`Store.set_blind`) is shown to a
reader on the vote page (``/vote?session=ID``, :mod:`playground.ui.vote_page`) with its lanes as
letters A, B, C… in an order drawn for that reader (:func:`reader_order`: a hash of the session
id and the reader id, so a reader sees the same order on every visit and two readers usually
different ones). Nothing that names a decoder — names, knobs, colours, stats — reaches the reader
until their ballot is stored; then the ballot's letters are revealed.

Ballots (:mod:`playground.ballots`) are kept one per reader per session (a new one replaces
it), the reader keyed like an owner (:mod:`playground.ownership`).

The Results view (and ``playground votes results``) turns the ballots of a set of sessions into
comparisons between *configurations* — model, decoder and knobs, not the seed, so repeats of one
configuration pool — and fits Bradley–Terry strengths with bootstrap intervals
(:mod:`playground.bradley_terry`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Iterable

from decoders.base import REGISTRY
from playground.ballots import lane_comparisons
from playground.bradley_terry import Comparison, bootstrap_intervals, fit
from playground.core.errors import PlaygroundError

# ---------------------------------------------------------------------- configurations
def config_key(model: str, trace: dict[str, Any]) -> str:
    """What makes two lanes the same configuration: model, decoder and knobs (not the seed)."""
    return json.dumps([model, trace.get("decoder"), trace.get("params") or {}], sort_keys=True)


def config_label(model: str, trace: dict[str, Any]) -> str:
    """A short name of a configuration: the decoder and the knobs that differ from its defaults."""
    name = str(trace.get("decoder"))
    params = trace.get("params") or {}
    cls = REGISTRY.get(name)
    defaults = cls.params.defaults() if cls is not None else {}
    changed = [f"{k}={_short(v)}" for k, v in params.items() if k not in defaults or defaults[k] != v]
    return name + (f" ({', '.join(changed)})" if changed else "") + f" · {model}"


def _short(v: Any) -> str:
    text = f"{v:g}" if isinstance(v, float) else str(v)
    return text if len(text) <= 24 else text[:23] + "…"


@dataclass(frozen=True)
class Row:
    """One configuration of a Results table."""

    key: str
    label: str
    score: float
    low: float
    high: float
    wins: int
    losses: int
    ties: int
    sessions: int


@dataclass(frozen=True)
class Results:
    """The Results view's table (best first), the ballots it came from, and their reasons."""

    rows: list[Row]
    ballots: int
    sessions: int
    reasons: list[dict[str, str]]


def results(sessions: Iterable[dict[str, Any]], ballots: Iterable[dict[str, Any]], reps: int = 200) -> Results:
    """Bradley–Terry strengths per configuration from stored ``ballots`` (rows of
    :meth:`Store.ballots`: ``session``, ``ballot``, ``reason``) over loaded ``sessions``.

    Each ballot becomes its comparisons between the configurations of its session's lanes (two
    lanes of one session with the same configuration compare nothing); intervals are a bootstrap
    over ballots."""
    by_id = {s["id"]: s for s in sessions}
    per_ballot: list[list[Comparison]] = []
    labels: dict[str, str] = {}
    seen_in: dict[str, set[str]] = {}
    reasons: list[dict[str, str]] = []
    used_sessions: set[str] = set()
    for b in ballots:
        s = by_id.get(b["session"])
        if s is None:
            continue
        runs = s["runs"]
        keys = [config_key(s["model"], t) for t in runs]
        for k, t in zip(keys, runs):
            labels.setdefault(k, config_label(s["model"], t))
            seen_in.setdefault(k, set()).add(s["id"])
        comps = [(keys[i], keys[j], out) for i, j, out in lane_comparisons(b["ballot"], len(runs)) if keys[i] != keys[j]]
        if comps:
            per_ballot.append(comps)
            used_sessions.add(s["id"])
        if b.get("reason"):
            reasons.append({"label": _ballot_label(b["ballot"], runs, s["model"]), "reason": b["reason"]})
    table = fit([c for comps in per_ballot for c in comps])
    ci = bootstrap_intervals(per_ballot, table.items, reps=reps)
    rows = [Row(k, labels[k], s, *ci[k], w, l, t, len(seen_in.get(k, ())))
            for k, s, w, l, t in zip(table.items, table.scores, table.wins, table.losses, table.ties)]
    rows.sort(key=lambda r: (-r.score, r.label))
    return Results(rows, len(per_ballot), len(used_sessions), reasons)


def _ballot_label(ballot: dict[str, Any], runs: list[dict[str, Any]], model: str) -> str:
    """What a reason was given for, in configuration names."""
    if ballot["kind"] == "best":
        w = ballot["winner"]
        return "tie of all lanes" if w is None else f"best: {config_label(model, runs[w])}"
    a, b = config_label(model, runs[ballot["a"]]), config_label(model, runs[ballot["b"]])
    return {"a": f"{a} over {b}", "b": f"{b} over {a}", "tie": f"{a} tied with {b}"}[ballot["winner"]]


def format_interval(low: float, high: float) -> str:
    """An interval for a table; unbounded when too few ballots measure it."""
    if math.isinf(low) or math.isinf(high):
        return "— (one ballot)"
    return f"[{low:+.2f}, {high:+.2f}]"


def results_table(res: Results) -> str:
    """The Results as a plain-text table (the command line's output)."""
    if not res.rows:
        return "no votes yet"
    lines = [f"{res.ballots} ballots over {res.sessions} sessions; Bradley–Terry log-strength (mean 0), 95% bootstrap interval",
             f"{'configuration':<48} {'score':>7} {'interval':>18} {'W':>4} {'L':>4} {'T':>4}"]
    for r in res.rows:
        lines.append(f"{r.label[:48]:<48} {r.score:>+7.2f} {format_interval(r.low, r.high):>18} "
                     f"{r.wins:>4} {r.losses:>4} {r.ties:>4}")
    return "\n".join(lines)
