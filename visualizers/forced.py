"""A branch's forced tokens: what the model thought of each edit.

For every step that committed a forced token (``forced`` evidence, ``playground/force.py``),
the model's probability of the forced token next to that of the token the decoder picked
(token-loop decoders record both, with the step's real distribution); decoders forced through
their target's logits record only the forced token, drawn alone. Pure function of the trace:
a stored branch replays it without a model.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from visualizers._common import CHOSEN, FINAL, at, base_layout, empty_figure, ints, label, num, steps_of
from visualizers.registry import run_plot


def _prob(dist: Any, token: Any) -> float | None:
    """The raw probability of ``token`` in a step's recorded top-K (None when not recorded)."""
    if not isinstance(dist, dict):
        return None
    ids = ints(dist.get("top_ids"))
    return num(at(dist.get("raw_probs"), ids.index(token))) if token in ids else None


@run_plot("Forced tokens", evidence="forced", order=80)
def forced_figure(trace: dict[str, Any]) -> go.Figure:
    """Per forced position: p(forced token) and p(the decoder's own pick) under the model."""
    title = "Forced tokens"
    rows = []
    for s in steps_of(trace):
        for f in s.get("forced") or []:
            if isinstance(f, dict) and isinstance(f.get("position"), int):
                rows.append((s, f))
    if not rows:
        return empty_figure("no forced token in this run", title)
    xs = [f"{f['position']}" for _, f in rows]
    forced_p = [_prob(s.get("dist"), f.get("token")) for s, f in rows]
    picked_p = [_prob(s.get("dist"), f.get("picked")) if "picked" in f else None for s, f in rows]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=xs, y=forced_p, name="forced token", marker_color=CHOSEN,
                         text=[label(trace, f.get("token")) for _, f in rows],
                         hovertemplate="position %{x}<br>forced %{text}: p = %{y:.4f}<extra></extra>"))
    if any(p is not None for p in picked_p):
        fig.add_trace(go.Bar(x=xs, y=picked_p, name="decoder's pick", marker_color=FINAL,
                             text=[label(trace, f.get("picked")) for _, f in rows],
                             hovertemplate="position %{x}<br>picked %{text}: p = %{y:.4f}<extra></extra>"))
    missing = sum(1 for p in forced_p if p is None)
    sub = "model probability (raw) at each forced position"
    if missing:
        sub += f" · {missing} forced token(s) outside the recorded top-K or not recorded"
    return base_layout(fig, title, subtitle=sub, barmode="group",
                       xaxis={"title": "output position", "type": "category"},
                       yaxis={"title": "probability", "rangemode": "tozero"})
