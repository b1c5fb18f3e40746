"""DeAL views: one step's candidates, LM log-probability against reward with the kept ones marked;
with ``search=astar`` the frontier at the step's choice, g against h with lines of equal f; and
the chosen path's reward against its log-likelihood over the run.

They read the ``deal`` evidence of the ``deal`` decoder's beam steps (``lam``, ``reward``,
``lookahead``, and per candidate ``token``, ``logprob``, ``reward``, ``score``, ``status``,
``lookahead_text``), the ``astar`` evidence (``frontier`` entries with ``id``, ``ids``, ``g``,
``h``, ``f``, ``depth``, ``finished``; the ``popped`` ids) and the kept or popped nodes in
``beams`` (``ids``, ``logprob``, ``reward``). Pure functions of trace dicts, tolerant of partial
or odd evidence (a note, never a raise).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from visualizers._common import (ACCEPTED, BONUS, CHOSEN, FINAL, INK, RAW, base_layout, empty_figure, fmt, ints,
                                 num, pick_step, plot_text, steps_of, token_text, visible, wrong_kind)
from visualizers.registry import run_plot, step_plot

TITLE = "DeAL candidates"
FRONTIER_TITLE = "DeAL frontier: g and h"
RUN_TITLE = "DeAL path: reward vs log-likelihood"
LOOKAHEAD_CHARS = 40  # of a candidate's lookahead text in its hover
LABEL_TOKENS = 4  # the last tokens of a frontier entry shown in its hover
STATUSES = (("pruned", "pruned", RAW, "x", 8), ("finished", "finished (pooled)", BONUS, "diamond", 11),
            ("kept", "kept", ACCEPTED, "circle", 11), ("queued", "queued (A*)", ACCEPTED, "circle", 9))
F_LINES = 4  # lines of equal f drawn across the frontier plot


def _hover(trace: dict[str, Any], c: dict[str, Any]) -> str:
    look = str(c.get("lookahead_text") or "")
    look = look if len(look) <= LOOKAHEAD_CHARS else look[: LOOKAHEAD_CHARS - 1] + "…"
    return (f"<b>{plot_text(visible(token_text(trace, c.get('token'))))}</b> from beam {c.get('beam')}"
            f"<br>log p {fmt(c.get('logprob'))} · reward {fmt(c.get('reward'))} · score {fmt(c.get('score'))}"
            f"<br>lookahead: {plot_text(visible(look)) if look else '–'}")


@step_plot("beam", TITLE, needs="deal", order=25)
def deal_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """Every candidate child of the step: its hypothesis's summed log-probability (x) against
    the reward of its lookahead (y), kept / finished / pruned (search=astar: queued) marked; with λ > 0 a dashed line
    of equal score log p + λ·R through the weakest kept candidate (the kept lie above it)."""
    i, s = pick_step(trace, step)
    if s is None:
        return empty_figure("no steps yet", TITLE)
    if s.get("kind") != "beam":
        return wrong_kind(i, s, "beam", TITLE)
    ev = s.get("deal")
    raw = ev.get("candidates") if isinstance(ev, dict) else None
    cands = [c for c in raw if isinstance(c, dict)] if isinstance(raw, list) else []
    cands = [c for c in cands if num(c.get("logprob")) is not None and num(c.get("reward")) is not None]
    if not cands:
        return empty_figure(f"step {i} has no DeAL candidates", f"{TITLE} · step {i}")
    fig = go.Figure()
    astar = ev.get("search") == "astar"
    for status, name, colour, symbol, size in STATUSES:
        part = [c for c in cands if c.get("status") == status]
        name = "finished (queued)" if astar and status == "finished" else name
        if part:
            fig.add_scatter(x=[num(c["logprob"]) for c in part], y=[num(c["reward"]) for c in part], mode="markers",
                            name=f"{name} ({len(part)})", marker={"color": colour, "symbol": symbol, "size": size},
                            hovertext=[_hover(trace, c) for c in part], hoverinfo="text")
    lam = num(ev.get("lam")) or 0.0
    kept = [num(c.get("score")) for c in cands if c.get("status") == "kept" and num(c.get("score")) is not None]
    if lam > 0 and kept:
        xs = [num(c["logprob"]) for c in cands]
        lo, hi = min(xs), max(xs)
        cut = min(kept)
        fig.add_scatter(x=[lo, hi], y=[(cut - lo) / lam, (cut - hi) / lam], mode="lines", name="weakest kept score",
                        line={"color": INK, "dash": "dash", "width": 1}, hoverinfo="skip")
        fig.update_yaxes(range=_pad_range([num(c["reward"]) for c in cands]))
    n_kept = sum(1 for c in cands if c.get("status") == "kept")
    tally = f"{len(cands)} children queued" if astar else f"{n_kept} of {len(cands)} kept"
    sub = " · ".join((f"λ = {fmt(lam, 3)}", f"reward: {plot_text(str(ev.get('reward', '?')))}",
                      f"lookahead {ev.get('lookahead', '?')}", tally))
    base_layout(fig, f"{TITLE} · step {i}", subtitle=sub, xaxis_title="log p of the hypothesis",
                yaxis_title="reward R (lookahead)")
    return fig


def _list(x: Any) -> list[Any]:
    return x if isinstance(x, list) else []


def _entry_hover(trace: dict[str, Any], e: dict[str, Any]) -> str:
    toks = ints(e.get("ids"))
    text = "".join(token_text(trace, t) for t in toks[-LABEL_TOKENS:])
    label = ("…" if len(toks) > LABEL_TOKENS else "") + visible(text)
    return (f"<b>{plot_text(label) or '(root)'}</b> · depth {e.get('depth')}"
            f"{' · finished' if e.get('finished') else ''}"
            f"<br>g {fmt(e.get('g'))} + h {fmt(e.get('h'))} = f {fmt(e.get('f'))}")


@step_plot("beam", FRONTIER_TITLE, needs="astar", order=20)
def deal_frontier_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """The A* frontier the step chose from: each entry's g, its summed log-probability (x),
    against h, λ times the reward of its lookahead (y); dotted lines of equal f = g + h, the
    popped entries (the highest f of a length still open) starred, finished ones diamonds."""
    i, s = pick_step(trace, step)
    if s is None:
        return empty_figure("no steps yet", FRONTIER_TITLE)
    if s.get("kind") != "beam":
        return wrong_kind(i, s, "beam", FRONTIER_TITLE)
    ev = s.get("astar")
    raw = ev.get("frontier") if isinstance(ev, dict) else None
    front = [e for e in _list(raw) if isinstance(e, dict) and num(e.get("g")) is not None
             and num(e.get("h")) is not None]
    if not front:
        return empty_figure(f"step {i} has no A* frontier", f"{FRONTIER_TITLE} · step {i}")
    popped = set(ints(ev.get("popped")))
    fig = go.Figure()
    xs, ys = [num(e["g"]) for e in front], [num(e["h"]) for e in front]
    lo, hi = min(xs), max(xs)
    fs = sorted({x + y for x, y in zip(xs, ys)}, reverse=True)
    for f in fs[:: max(1, len(fs) // F_LINES)][:F_LINES]:
        fig.add_scatter(x=[lo, hi], y=[f - lo, f - hi], mode="lines", showlegend=False, hoverinfo="skip",
                        line={"color": INK, "dash": "dot", "width": 1})
    groups = (("queued", RAW, "circle", 9, lambda e: not e.get("finished") and e.get("id") not in popped),
              ("finished", BONUS, "diamond", 11, lambda e: e.get("finished") and e.get("id") not in popped),
              ("popped", CHOSEN, "star", 15, lambda e: e.get("id") in popped))
    for name, colour, symbol, size, keep in groups:
        part = [e for e in front if keep(e)]
        if part:
            fig.add_scatter(x=[num(e["g"]) for e in part], y=[num(e["h"]) for e in part], mode="markers",
                            name=f"{name} ({len(part)})", marker={"color": colour, "symbol": symbol, "size": size},
                            hovertext=[_entry_hover(trace, e) for e in part], hoverinfo="text")
    fig.update_yaxes(range=_pad_range(ys))
    sub = " · ".join((f"{len(front)} best entries", f"{len(popped)} popped",
                      f"expansions {ev.get('expansions', '?')}", "dotted: equal f = g + h"))
    base_layout(fig, f"{FRONTIER_TITLE} · step {i}", subtitle=sub, xaxis_title="g = log p of the hypothesis",
                yaxis_title="h = λ·R (lookahead)")
    return fig


def _pad_range(ys: list[float]) -> list[float]:
    """The values' range, padded: a line of equal score must not stretch the axis."""
    lo, hi = min(ys), max(ys)
    pad = max(0.1, 0.1 * (hi - lo))
    return [lo - pad, hi + pad]


def chosen_path(trace: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(step index, node) along the output, or along the best kept node of a run still going:
    at each step the node whose ids are the path's prefix of that step's depth."""
    steps = [(j, s) for j, s in enumerate(steps_of(trace)) if isinstance(s.get("deal"), dict)]
    path = ints(trace.get("output_ids")) if isinstance(trace, dict) else []
    if not path and steps:
        beams = [b for b in _list(steps[-1][1].get("beams")) if isinstance(b, dict)]
        path = ints(beams[0].get("ids")) if beams else []
    out = []
    for j, s in steps:
        for b in _list(s.get("beams")):
            ids = ints(b.get("ids")) if isinstance(b, dict) else []
            scored = ids and num(b.get("logprob")) is not None and num(b.get("reward")) is not None
            if scored and ids == path[:len(ids)]:
                out.append((j, b))
                break
    return out


@run_plot(RUN_TITLE, evidence="deal", order=75)
def deal_run_figure(trace: dict[str, Any]) -> go.Figure:
    """The chosen path node by node: its summed log-likelihood (x) against its reward (y, read
    on its lookahead when it was chosen), numbered by depth; the output's node starred."""
    nodes = chosen_path(trace)
    if not nodes:
        return empty_figure("no DeAL path in this run", RUN_TITLE)
    xs = [num(b["logprob"]) for _, b in nodes]
    ys = [num(b["reward"]) for _, b in nodes]
    depth = [len(ints(b.get("ids"))) for _, b in nodes]
    fig = go.Figure()
    fig.add_scatter(x=xs, y=ys, mode="lines+markers", name="chosen path", line={"color": FINAL},
                    marker={"color": FINAL, "size": 7}, text=[str(d) for d in depth],
                    hovertemplate="depth %{text}<br>log p %{x:.3f}<br>reward %{y:.3f}<extra></extra>")
    fig.add_scatter(x=[xs[-1]], y=[ys[-1]], mode="markers", name="output" if nodes[-1][1].get("finished") else "last",
                    marker={"color": CHOSEN, "size": 15, "symbol": "star"}, hoverinfo="skip")
    ev = next((s["deal"] for s in reversed(steps_of(trace)) if isinstance(s.get("deal"), dict)), {})
    sub = " · ".join((f"λ = {fmt(ev.get('lam'), 3)}", f"reward: {plot_text(str(ev.get('reward', '?')))}",
                      f"final log p {fmt(xs[-1])}", f"reward {fmt(ys[-1])}"))
    base_layout(fig, RUN_TITLE, subtitle=sub, xaxis_title="log p of the path so far",
                yaxis_title="reward R of the node")
    fig.update_xaxes(autorange="reversed")
    return fig


__all__ = ["chosen_path", "deal_figure", "deal_frontier_figure", "deal_run_figure"]
