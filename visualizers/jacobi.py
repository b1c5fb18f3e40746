"""Jacobi steps: the window × iteration grid.

Each Jacobi iteration refines a window of guessed tokens in parallel; ``guess`` holds the
window after the iteration and ``converged`` how long a prefix of it is now fixed. Rows
are iterations (the last ``WINDOW`` up to the chosen step), columns window positions;
a cell shows the guessed token, green when inside the converged prefix, orange when the
guess at that output position changed since the previous iteration, grey otherwise.
"""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go

from visualizers._common import (
    ACCEPTED, CORRECTION, at, base_layout, empty_figure, ints, label, pick_step, plot_text,
    steps_of, token_text, visible, wrong_kind,
)
from visualizers.registry import step_plot

WINDOW = 16  # iterations shown at once

# z: 0 converged, 1 changed, 2 unchanged
_SCALE = [[0.0, ACCEPTED], [0.333, ACCEPTED], [0.334, CORRECTION], [0.666, CORRECTION],
          [0.667, "#8b93a1"], [1.0, "#8b93a1"]]


def jacobi_rows(trace: dict[str, Any], upto: int) -> list[dict[str, Any]]:
    """Jacobi steps up to index ``upto`` (inclusive), each with the output position at
    which its window starts (the output length before that step)."""
    rows: list[dict[str, Any]] = []
    out_len = 0
    for s in steps_of(trace):
        i = s.get("i")
        if isinstance(i, int) and i > upto:
            break
        if s.get("kind") == "jacobi":
            rows.append({"step": s, "start": out_len})
        if s.get("kind") != "denoise":
            out_len += len(ints(s.get("committed")))
    return rows


@step_plot("jacobi", "Jacobi grid", metric="acceptance", order=10)
def jacobi_grid_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """The window × iteration grid of Jacobi decoding up to a step."""
    title = "Jacobi window × iteration"
    i, s = pick_step(trace, step)
    if s is None:
        return empty_figure("no steps yet", title)
    if s.get("kind") != "jacobi":
        return wrong_kind(i, s, "jacobi", title)
    rows = jacobi_rows(trace, i)[-WINDOW:]
    width = max((len(ints(r["step"].get("guess"))) for r in rows), default=0)
    if width == 0:
        return empty_figure(f"step {i} has no guess window", f"{title} · step {i}")
    z, text, hover, ys = [], [], [], []
    prev: dict[int, int] = {}
    for r in rows:
        st, start = r["step"], r["start"]
        guess = ints(st.get("guess"))
        # ``fixed``: guesses the pass confirmed; ``converged`` also counts the one new
        # prediction committed after them, whose guess was wrong, so prefer ``fixed``.
        conv = st.get("fixed", st.get("converged"))
        conv = conv if isinstance(conv, int) and not isinstance(conv, bool) else 0
        new = ints(st.get("new"))
        zr, tr, hr = [], [], []
        for j in range(width):
            if j >= len(guess):
                zr.append(math.nan), tr.append(""), hr.append("")
                continue
            tok, absolute = guess[j], start + j
            if j < conv:
                cat, what = 0, "converged"
            elif prev.get(absolute) is not None and prev[absolute] != tok:
                cat, what = 1, f"changed (was {plot_text(visible(token_text(trace, prev[absolute])))})"
            else:
                cat, what = 2, "unchanged" if absolute in prev else "new guess"
            zr.append(cat)
            tr.append(label(trace, tok, 8))
            pred = at(new, j)
            nxt = (f"<br>this pass predicts {plot_text(visible(token_text(trace, pred)))} (#{pred})"
                   if pred is not None else "")
            hr.append(f"iteration at step {st.get('i')} · window position {j} (output position {absolute})"
                      f"<br>guess <b>{plot_text(visible(token_text(trace, tok)))}</b> (#{tok}) · {what}{nxt}")
        prev = {start + j: t for j, t in enumerate(guess)}
        z.append(zr), text.append(tr), hover.append(hr), ys.append(f"step {st.get('i')}")
    fig = go.Figure()
    fig.add_heatmap(z=z, x=list(range(width)), y=ys, text=text, texttemplate="%{text}", hovertext=hover,
                    hoverinfo="text", zmin=0, zmax=2, colorscale=_SCALE, showscale=False, xgap=2, ygap=2,
                    name="guesses", textfont={"size": 11})
    last = s.get("converged")
    sub = f" · {last} committed this pass" if isinstance(last, int) else ""
    base_layout(fig, f"{title} · step {i}{sub}",
                subtitle="green converged · orange changed since the last iteration · grey unchanged",
                xaxis={"title": "window position", "dtick": 1},
                yaxis={"title": "iteration", "autorange": "reversed"})
    return fig
