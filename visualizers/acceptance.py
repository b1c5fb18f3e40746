"""Acceptance by draft position: where in the draft does acceptance collapse.

One scalar acceptance rate cannot tell a uniformly mediocre drafter from one whose later
positions collapse. ``position_figure`` draws, per draft position (tree depth), the share of
verifications that drafted that far and accepted a token there
(:func:`playground.core.trace.acceptance_by_position`, the figure the trace's stats carry), beside
the textbook curve α^i of i.i.d. acceptance at the lane's measured per-token rate α, and in the
title the measured tokens per verification against the textbook expectation
(1 − α^(γ+1)) / (1 − α) (:func:`playground.core.trace.expected_tokens_per_verification`).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from playground.core.trace import FIGURE_NAMES, acceptance_by_position, expected_tokens_per_verification
from visualizers._common import ACCEPTED, INK, base_layout, empty_figure, plot_text, steps_of
from visualizers.registry import run_plot
from visualizers.tree import trace_figures

TITLE = "Acceptance by draft position"


def draft_trees(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``tree`` evidence of the trace's draft steps."""
    return [s["tree"] for s in steps_of(trace) if s.get("kind") == "draft" and isinstance(s.get("tree"), dict)]


@run_plot(TITLE, kind="draft", order=30)
def position_figure(trace: dict[str, Any]) -> go.Figure:
    """Accepted / offered per draft position (bars, counts in the hover), α^i dotted."""
    by = acceptance_by_position(draft_trees(trace))
    if not by["offered"]:
        return empty_figure("no drafted token yet", TITLE)
    xs = list(range(1, len(by["offered"]) + 1))
    fig = go.Figure()
    fig.add_bar(x=xs, y=by["rate"], marker_color=ACCEPTED, name="accepted / offered",
                text=[f"{a}/{o}" for a, o in zip(by["accepted"], by["offered"])], textposition="outside",
                cliponaxis=False,
                hovertext=[f"position {x}: {a} of {o} verifications that drafted this far accepted here"
                           f"<br>{d} draft node(s) at this depth" for x, a, o, d in
                           zip(xs, by["accepted"], by["offered"], by["drafted"])], hoverinfo="text")
    f = trace_figures(trace) or {}
    alpha = float(f.get("acceptance_rate") or 0.0)
    gamma = max((x for x, o in zip(xs, by["offered"]) if o), default=0)
    fig.add_scatter(x=xs, y=[alpha ** x for x in xs], mode="lines+markers", name=f"α^i (α = {alpha:.2f})",
                    line={"color": INK, "dash": "dot"})
    expected = expected_tokens_per_verification(alpha, gamma)
    measured = float(f.get("tokens_per_verification") or 0.0)
    base_layout(fig, f"{TITLE} · {FIGURE_NAMES['tokens_per_verification']} {measured:.2f}",
                subtitle=plot_text(f"textbook (1 − α^(γ+1))/(1 − α) = {expected:.2f} at α = {alpha:.2f}, γ = {gamma} · "
                                   "bars: verifications that accepted a token at this position / those that "
                                   "drafted it"),
                xaxis={"title": "draft position (tree depth)", "dtick": 1},
                yaxis={"title": "accepted / offered", "range": [0, 1.1]})
    return fig


__all__ = ["draft_trees", "position_figure"]
