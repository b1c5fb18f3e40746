"""Beam steps: the beam tree — every hypothesis kept at each step, linked to its parent,
coloured by its log-probability, with the lineage of the beams alive at the chosen step drawn
bold.

Every beam plot uses one scale, the hypothesis's summed log-probability (:func:`beam_logprob`):
beam search ranks its finished hypotheses by a length-normalised ``score``, and plotting that
beside the running beams' sums made a curve jump from −58 to −1.5 at the end, so a beam whose
score is something else carries its sum as ``logprob``.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from visualizers._common import (
    FINAL, GRID, HEIGHT, base_layout, empty_figure, fmt, ints, num, pick_step, plot_text,
    steps_of, token_text, visible, wrong_kind,
)
from visualizers.registry import step_plot

WINDOW = 16  # beam steps shown at once (older ones scroll out): ~17 px a step on a lane card
LABEL_CHARS = 12  # the last column's labels: each beam's latest text, beside its node
SCALE = "summed log-probability"


def beam_logprob(trace: dict[str, Any], beam: dict[str, Any]) -> float | None:
    """A beam's summed log-probability: ``logprob`` where the beam carries it (a decoder whose
    ``score`` is something else, such as beam search's length-normalised score of a finished
    hypothesis, records it), else its ``score``."""
    lp = num(beam.get("logprob"))
    return lp if lp is not None else num(beam.get("score"))


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


@step_plot("beam", "Beam tree", order=10)
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
            lp = beam_logprob(trace, b)
            xs.append(shown[k].get("i"))
            ys.append(j)
            sc.append(lp)
            tail = visible("".join(token_text(trace, t) for t in ids[-8:]))
            # Only the chosen step's beams are labelled, to the right where nothing else is
            # drawn: a label on every node piles up at a lane card's width (hover has them).
            last = k == len(layers) - 1
            txt.append(plot_text(("…" + tail[-LABEL_CHARS:]) if len(tail) > LABEL_CHARS else tail) if last else "")
            fin = b.get("finished") is True
            sym.append("square" if fin else "circle")
            norm = (f" · ranked by {fmt(b.get('score'), 3)} (length-normalised)"
                    if fin and num(b.get("score")) is not None and lp != num(b.get("score")) else "")
            hov.append(f"step {shown[k].get('i')} · beam {j + 1}{' · finished' if fin else ''}<br>"
                       f"log-prob {fmt(lp, 3)}{norm}<br>…{plot_text(tail[-40:])}")
    have = [v for v in sc if v is not None]
    fig.add_scatter(
        x=xs, y=ys, mode="markers+text", name="beams", text=txt, textposition="middle right",
        hovertext=hov, hoverinfo="text", showlegend=False, cliponaxis=False, textfont={"size": 10},
        marker={"size": 12, "symbol": sym, "line": {"width": 1, "color": "rgba(0,0,0,0.35)"},
                "color": [v if v is not None else (min(have) if have else 0) for v in sc],
                "colorscale": "Viridis", "showscale": bool(have),
                "colorbar": {"title": {"text": "log-prob", "side": "right"}, "thickness": 12, "len": 0.85}},
    )
    width = max((len(layer) for layer in layers), default=1)
    steps_x = [x for x in xs if isinstance(x, int)] or [0]
    x0, x1 = min(steps_x), max(steps_x)
    ticks = sorted(set(steps_x))[:: 1 if len(shown) <= 8 else 2]
    now = [v for v in sc[len(sc) - len(layers[-1]):] if v is not None]
    best = max(now) if now else None
    sub = f" · best log-prob {best:.2f}" if best is not None else ""
    base_layout(fig, f"{title} · step {i} · {len(layers[-1])} beams{sub}",
                subtitle="■ finished · ● open · bold: ancestors of the live beams · colour: " + SCALE,
                height=max(HEIGHT, min(900, 160 + 30 * width)),
                xaxis={"title": "step", "tickmode": "array", "tickvals": ticks,
                       # room right of the last column for its labels (~80 px)
                       "range": [x0 - 0.5, x1 + 0.5 + max(3.0, 0.5 * len(shown))]},
                yaxis={"title": "beam (rank)", "autorange": "reversed", "tickmode": "array",
                       "tickvals": list(range(width)), "ticktext": [str(r + 1) for r in range(width)],
                       "range": [width - 0.4, -0.8]})
    return fig
