"""Watched tokens over the run: how likely was the token I care about at every position.

A run with a ``watch`` list (``playground/watch.py``) keeps the resolved list in the trace
(``watch``: ``[{"token", "word", "note"?}]``) and each step records, per watched id, ``raw_p``
(the model), ``final_p`` (after the decoder's rule) and ``raw_rank``: a token step as one dict
``{id: {...}}`` for its position, a draft step as a list of such dicts, one per committed token.
``watch_figure`` draws each watched token's probability over output positions (raw solid,
final dotted, log axis), with its rank in the hover.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from visualizers._common import (LANE_COLOURS, base_layout, empty_figure, ints, num, plot_text, steps_of,
                                 token_text, visible)
from visualizers.registry import run_plot

TITLE = "Watched tokens"
FLOOR = 1e-9  # a probability of 0 (removed by the rule) is drawn at this floor on the log axis


def watch_rows(trace: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(output position, ``{id: {raw_p, final_p, raw_rank}}``) for every position some step
    recorded, in order: a token step's dict at the position of its first committed token, a
    draft step's list at consecutive positions."""
    out: list[tuple[int, dict[str, Any]]] = []
    pos = 0
    for s in steps_of(trace):
        if s.get("kind") == "denoise":
            continue
        ev = s.get("watch")
        if isinstance(ev, dict):
            out.append((pos, ev))
        elif isinstance(ev, list):
            out.extend((pos + j, e) for j, e in enumerate(ev) if isinstance(e, dict))
        pos += len(ints(s.get("committed")))
    return out


def watched(trace: dict[str, Any], rows: list[tuple[int, dict[str, Any]]]) -> list[tuple[str, str, str]]:
    """(id key, label, note) of each watched token: the trace's list, else the ids the steps hold."""
    entries = trace.get("watch") if isinstance(trace.get("watch"), list) else []
    out, seen = [], set()
    for e in entries:
        if isinstance(e, dict) and isinstance(e.get("token"), int):
            key = str(e["token"])
            word = e.get("word") if isinstance(e.get("word"), str) else token_text(trace, e["token"])
            out.append((key, visible(word), str(e.get("note") or "")))
            seen.add(key)
    for _, ev in rows:
        for key in ev:
            if key not in seen:
                seen.add(key)
                out.append((key, visible(token_text(trace, int(key)) if key.isdigit() else key), ""))
    return out


@run_plot(TITLE, evidence="watch", order=170)
def watch_figure(trace: dict[str, Any]) -> go.Figure:
    """Each watched token's raw (solid) and final (dotted) probability per output position."""
    rows = watch_rows(trace)
    if not rows:
        return empty_figure("this run watches no token", TITLE)
    fig = go.Figure()
    notes = []
    for j, (key, word, note) in enumerate(watched(trace, rows)):
        colour = LANE_COLOURS[j % len(LANE_COLOURS)]
        xs, raw, final, hover = [], [], [], []
        for pos, ev in rows:
            e = ev.get(key)
            if not isinstance(e, dict):
                continue
            r, f, rank = num(e.get("raw_p")), num(e.get("final_p")), e.get("raw_rank")
            xs.append(pos)
            raw.append(max(r, FLOOR) if r is not None else None)
            final.append(max(f, FLOOR) if f is not None else None)
            hover.append(f"<b>{plot_text(word)}</b> (#{key}) at position {pos}<br>raw p = {r if r is not None else '–'}"
                         f"<br>final p = {f if f is not None else '–'}<br>raw rank = {rank}")
        name = plot_text(word)
        fig.add_scatter(x=xs, y=raw, name=f"{name} raw", mode="lines+markers", line={"color": colour},
                        hovertext=hover, hoverinfo="text", legendgroup=key)
        fig.add_scatter(x=xs, y=final, name=f"{name} final", mode="lines", line={"color": colour, "dash": "dot"},
                        hovertext=hover, hoverinfo="text", legendgroup=key)
        if note:
            notes.append(note)
    notes.append("solid raw (the model), dotted final (after the rule); 0 drawn at 1e-9")
    base_layout(fig, TITLE, subtitle=plot_text(" · ".join(notes)), xaxis_title="output position",
                yaxis={"title": "probability", "type": "log"})
    return fig


__all__ = ["watch_figure", "watch_rows", "watched"]
