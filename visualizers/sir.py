"""Metric matching (sampling-importance-resampling) view: each sample's importance weight
against its metric, the target and the weighted mean, the resampled sample marked, and the
effective sample size in the title.

It reads the ``sir`` evidence of ``metric_match``'s last beam step: ``metrics``, ``weights``
(normalised), ``chosen``, ``target``, ``weighted_mean``, ``mean``, ``beta``, ``ess``,
``status`` and ``note``. A pure function of trace dicts, tolerant of partial or odd evidence.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from visualizers._common import (CHOSEN, FINAL, INK, RAW, at, base_layout, empty_figure, fmt, ints, num,
                                 pick_step, plot_text, token_text, visible, wrong_kind)
from visualizers.registry import step_plot

TITLE = "SIR weights"
LABEL_TOKENS = 6  # the last tokens of a sample in its hover text


def _label(trace: dict[str, Any], ids: Any) -> str:
    toks = ints(ids)
    text = "".join(token_text(trace, t) for t in toks[-LABEL_TOKENS:])
    return plot_text(("…" if len(toks) > LABEL_TOKENS else "") + visible(text))


@step_plot("beam", TITLE, needs="sir", order=55)
def sir_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """Importance weight vs metric per sample (the resampled one starred), with the target and
    the unweighted and weighted means as vertical lines; ESS = (Σw)²/Σw² in the title."""
    i, s = pick_step(trace, step)
    if s is None:
        return empty_figure("no steps yet", TITLE)
    if s.get("kind") != "beam":
        return wrong_kind(i, s, "beam", TITLE)
    ev = s.get("sir")
    if not isinstance(ev, dict):
        return empty_figure(f"step {i} has no SIR evidence", f"{TITLE} · step {i}")
    metrics = ev.get("metrics") if isinstance(ev.get("metrics"), list) else []
    weights = ev.get("weights") if isinstance(ev.get("weights"), list) else []
    beams = [b for b in s.get("beams") or [] if isinstance(b, dict)]
    chosen = ev.get("chosen") if isinstance(ev.get("chosen"), int) else None
    rows = [(j, num(m), num(at(weights, j))) for j, m in enumerate(metrics)]
    rows = [(j, m, w) for j, m, w in rows if m is not None and w is not None]
    if not rows:
        return empty_figure(f"step {i} recorded no weights", f"{TITLE} · step {i}")
    fig = go.Figure()
    rest = [r for r in rows if r[0] != chosen]
    for name, part, colour, symbol, size in (("samples", rest, FINAL, "circle", 10),
                                             ("resampled", [r for r in rows if r[0] == chosen], CHOSEN, "star", 16)):
        if not part:
            continue
        fig.add_scatter(x=[m for _, m, _ in part], y=[w for _, _, w in part], mode="markers", name=name,
                        marker={"color": colour, "size": size, "symbol": symbol},
                        text=[f"s{j} {_label(trace, (beams[j] if j < len(beams) else {}).get('ids'))}"
                              for j, _, _ in part],
                        hovertemplate="%{text}<br>metric %{x:.4g}<br>weight %{y:.4g}<extra></extra>")
    uniform = 1.0 / len(rows)
    fig.add_hline(y=uniform, line={"color": RAW, "dash": "dot", "width": 1},
                  annotation_text="uniform", annotation_font={"size": 9, "color": INK})
    for x, name, dash, colour in ((num(ev.get("target")), "target", "solid", CHOSEN),
                                  (num(ev.get("mean")), "sample mean", "dot", RAW),
                                  (num(ev.get("weighted_mean")), "weighted mean", "dash", FINAL)):
        if x is not None:
            fig.add_vline(x=x, line={"color": colour, "dash": dash, "width": 1.5}, annotation_text=name,
                          annotation_font={"size": 9, "color": INK})
    beta = num(ev.get("beta"))
    sub = " · ".join(x for x in (
        f"{ev.get('metric', '?')} → target {fmt(ev.get('target'), 4)}",
        f"β = {fmt(beta, 4)}" if beta is not None else f"β → ±∞ ({ev.get('status', '?')})",
        f"weighted mean {fmt(ev.get('weighted_mean'), 4)}", plot_text(str(ev.get("note") or ""))) if x)
    base_layout(fig, f"{TITLE} · ESS {fmt(ev.get('ess'), 2)} of {len(rows)}", subtitle=plot_text(sub),
                xaxis_title=f"metric: {plot_text(str(ev.get('metric', '?')))}",
                yaxis={"title": "normalised weight", "rangemode": "tozero"})
    return fig


__all__ = ["sir_figure"]
