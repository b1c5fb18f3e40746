"""The Results view's figure: Bradley–Terry strengths of decoder configurations as a forest plot.

Reads :class:`playground.votes.Results` rows (``label``, ``score``, ``low``, ``high``, ``wins``,
``losses``, ``ties``): one row per configuration, best at the top, a dot at its log-strength
(mean 0) and a bar over its 95% bootstrap interval. An interval that too few ballots leave
unbounded is drawn as the dot alone and said so in its hover text.
"""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go

from visualizers._common import ACCEPTED, base_layout, empty_figure, plot_text


def strengths_figure(rows: list[Any], ballots: int, sessions: int) -> go.Figure:
    """The forest plot of ``rows`` (best first) over ``ballots`` ballots of ``sessions`` sessions."""
    title = "Which configuration readers preferred"
    if not rows:
        return empty_figure("no votes yet: share a blind comparison and collect ballots", title)
    ys = list(range(len(rows)))[::-1]  # the best row on top
    bounded = [r for r in rows if not (math.isinf(r.low) or math.isinf(r.high))]
    fig = go.Figure()
    if bounded:
        fig.add_trace(go.Scatter(
            x=[r.score for r in bounded], y=[ys[rows.index(r)] for r in bounded], mode="markers",
            marker={"size": 10, "color": ACCEPTED}, name="95% bootstrap interval",
            error_x={"type": "data", "symmetric": False, "array": [r.high - r.score for r in bounded],
                     "arrayminus": [r.score - r.low for r in bounded], "thickness": 2, "width": 6},
            hovertext=[plot_text(f"{r.label}: {r.score:+.2f} [{r.low:+.2f}, {r.high:+.2f}] · "
                                 f"{r.wins} won, {r.losses} lost, {r.ties} tied") for r in bounded],
            hoverinfo="text"))
    loose = [r for r in rows if r not in bounded]
    if loose:
        fig.add_trace(go.Scatter(
            x=[r.score for r in loose], y=[ys[rows.index(r)] for r in loose], mode="markers",
            marker={"size": 10, "color": "rgba(128,128,128,0.8)", "symbol": "circle-open"},
            name="too few ballots for an interval",
            hovertext=[plot_text(f"{r.label}: {r.score:+.2f}, too few ballots for an interval · "
                                 f"{r.wins} won, {r.losses} lost, {r.ties} tied") for r in loose],
            hoverinfo="text"))
    fig.add_vline(x=0, line={"dash": "dot", "color": "rgba(128,128,128,0.6)"})
    subtitle = plot_text(f"{ballots} ballot{'s' if ballots != 1 else ''} · {sessions} session"
                         f"{'s' if sessions != 1 else ''} · Bradley–Terry log-strength, mean 0")
    base_layout(fig, plot_text(title), height=max(260, 90 + 42 * len(rows)), subtitle=subtitle)
    fig.update_yaxes(tickvals=ys, ticktext=[plot_text(r.label) for r in rows], automargin=True)
    fig.update_xaxes(title_text="log-strength (higher: preferred more often)", zeroline=False)
    return fig
