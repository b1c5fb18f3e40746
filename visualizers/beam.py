"""Beam steps: the beam tree — every hypothesis kept at each step, linked to its parent,
coloured by score, with the lineage of the beams alive at the chosen step drawn bold."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from visualizers._common import (
    FINAL, GRID, INK, base_layout, empty_figure, fmt, ints, label, num, pick_step, plot_text,
    steps_of, token_text, visible, wrong_kind,
)

WINDOW = 32  # beam steps shown at once; older ones scroll out so labels stay readable


def beams_of(step: dict[str, Any]) -> list[dict[str, Any]]:
    """The well-formed beams of a beam step."""
    b = step.get("beams") if isinstance(step, dict) else None
    return [x for x in b if isinstance(x, dict)] if isinstance(b, list) else []


def _parent_index(beam: dict[str, Any], prev: list[dict[str, Any]]) -> int | None:
    """The beam's parent in the previous step: ``parent`` if valid, else by id prefix."""
    p = beam.get("parent")
    if isinstance(p, int) and not isinstance(p, bool) and 0 <= p < len(prev):
        return p
    ids = ints(beam.get("ids"))
    for j, q in enumerate(prev):
        qi = ints(q.get("ids"))
        if qi and (ids[: len(qi)] == qi) and len(qi) >= len(ids) - 1:
            return j
    return None


def beam_tree_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """Beam hypotheses over steps (x = step, y = rank at that step), edges to parents."""
    title = "Beam tree"
    i, s = pick_step(trace, step)
    if s is None:
        return empty_figure("no steps yet", title)
    if s.get("kind") != "beam":
        return wrong_kind(i, s, "beam", title)
    shown = [t for t in steps_of(trace)[: i + 1] if t.get("kind") == "beam"][-WINDOW:]
    layers = [beams_of(t) for t in shown]
    if not any(layers):
        return empty_figure(f"step {i} has no beams", f"{title} · step {i}")
    parents = [[None] * len(layers[0])] + [
        [_parent_index(b, layers[k - 1]) for b in layers[k]] for k in range(1, len(layers))]
    # Which nodes are ancestors of the beams alive at the last shown step.
    alive = [set() for _ in layers]
    alive[-1] = set(range(len(layers[-1])))
    for k in range(len(layers) - 1, 0, -1):
        alive[k - 1] = {parents[k][j] for j in alive[k] if parents[k][j] is not None}

    fig = go.Figure()
    for bold in (False, True):
        ex: list[Any] = []
        ey: list[Any] = []
        for k in range(1, len(layers)):
            for j, p in enumerate(parents[k]):
                if p is None or ((j in alive[k]) != bold):
                    continue
                ex += [shown[k - 1].get("i"), shown[k].get("i"), None]
                ey += [p, j, None]
        if ex:
            fig.add_scatter(x=ex, y=ey, mode="lines", hoverinfo="skip", showlegend=False,
                            line={"color": FINAL if bold else GRID, "width": 2.5 if bold else 1.2},
                            name="lineage" if bold else "pruned")
    xs, ys, sc, txt, hov, sym = [], [], [], [], [], []
    for k, layer in enumerate(layers):
        for j, b in enumerate(layer):
            ids = ints(b.get("ids"))
            last = ids[-1] if ids else None
            xs.append(shown[k].get("i"))
            ys.append(j)
            sc.append(num(b.get("score")))
            txt.append(label(trace, last, 10) if last is not None else "")
            tail = visible("".join(token_text(trace, t) for t in ids[-8:]))
            fin = b.get("finished") is True
            sym.append("square" if fin else "circle")
            hov.append(f"step {shown[k].get('i')} · beam {j}{' · finished' if fin else ''}<br>"
                       f"score {fmt(b.get('score'), 3)}<br>…{plot_text(tail[-40:])}")
    have = [v for v in sc if v is not None]
    fig.add_scatter(
        x=xs, y=ys, mode="markers+text", name="beams", text=txt, textposition="top center",
        hovertext=hov, hoverinfo="text", showlegend=False,
        marker={"size": 13, "symbol": sym, "line": {"width": 1, "color": "rgba(0,0,0,0.35)"},
                "color": [v if v is not None else (min(have) if have else 0) for v in sc],
                "colorscale": "Viridis", "showscale": bool(have),
                "colorbar": {"title": {"text": "score", "side": "right"}, "thickness": 12, "len": 0.85}},
    )
    width = max((len(layer) for layer in layers), default=1)
    best = max(have) if have else None
    sub = f" · best score {best:.3f}" if best is not None else ""
    base_layout(fig, f"{title} · step {i} · {len(layers[-1])} beams{sub}",
                xaxis={"title": "step", "dtick": 1 if len(shown) <= 20 else None},
                yaxis={"title": "beam (rank)", "autorange": "reversed", "dtick": 1,
                       "range": [width - 0.4, -0.6]})
    fig.add_annotation(text="■ finished · ● open · bold: ancestors of the live beams", xref="paper", yref="paper",
                       x=0, y=1.0, yshift=4, xanchor="left", yanchor="bottom", showarrow=False,
                       font={"size": 11, "color": INK})
    return fig
