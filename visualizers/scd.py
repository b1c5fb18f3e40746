"""Speculative contrastive decoding's view: at each verified position of a draft step, the
drafted token's probability under the expert, the amateur and the contrast it is verified
against, with the verdict and the token the contrast prefers.

It reads the ``scd`` evidence of ``spec_contrastive``'s draft steps (``positions``: ``depth``,
``drafted``, ``expert``, ``amateur``, ``contrast``, ``accepted``, ``pick``, ``expert_pick``).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from visualizers._common import (ACCEPTED, FINAL, RAW, REJECTED, base_layout, empty_figure, fmt, label, num,
                                 pick_step, plot_text, wrong_kind)
from visualizers.registry import step_plot

TITLE = "Contrastive verification"


@step_plot("draft", TITLE, needs="scd", order=60)
def scd_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """Per verified position: the drafted token's expert, amateur and contrast probability."""
    i, s = pick_step(trace, step)
    if s is None:
        return empty_figure("no steps yet", TITLE)
    if s.get("kind") != "draft":
        return wrong_kind(i, s, "draft", TITLE)
    ev = s.get("scd") if isinstance(s.get("scd"), dict) else {}
    rows = [r for r in ev.get("positions") or [] if isinstance(r, dict) and "drafted" in r]
    if not rows:
        return empty_figure(f"step {i} verified no drafted token", f"{TITLE} · step {i}")
    xs = [f"{r.get('depth', j) + 1}: {label(trace, r.get('drafted'), 10)}" for j, r in enumerate(rows)]
    fig = go.Figure()
    for key, name, colour in (("expert", "expert p", RAW), ("amateur", "amateur q (drafted from)", "#0ea5e9"),
                              ("contrast", "contrast (verified against)", FINAL)):
        fig.add_bar(x=xs, y=[num(r.get(key)) for r in rows], name=name, marker_color=colour,
                    hovertemplate="%{x}<br>" + plot_text(name) + " = %{y:.4f}<extra></extra>")
    verdicts = ["accepted" if r.get("accepted") else "rejected" for r in rows]
    fig.add_scatter(
        x=xs, y=[1.06] * len(rows), mode="markers+text", name="verdict", cliponaxis=False,
        marker={"symbol": ["circle" if v == "accepted" else "x" for v in verdicts], "size": 12,
                "color": [ACCEPTED if v == "accepted" else REJECTED for v in verdicts]},
        text=[("" if r.get("pick") == r.get("drafted") else "→ " + label(trace, r.get("pick"), 8)) for r in rows],
        textposition="middle right",
        hovertext=[plot_text(f"{v}; the contrast's best token: {label(trace, r.get('pick'))}; "
                             f"the expert's: {label(trace, r.get('expert_pick'))}") for v, r in zip(verdicts, rows)],
        hoverinfo="text")
    moved = sum(1 for r in ev.get("positions") or [] if isinstance(r, dict) and r.get("pick") != r.get("expert_pick"))
    base_layout(fig, f"{TITLE} · step {i} · accepted {sum(v == 'accepted' for v in verdicts)} of {len(rows)}",
                subtitle=plot_text(f"alpha {fmt(ev.get('alpha'), 2)} · beta {fmt(ev.get('beta'), 2)} · "
                                   f"contrast moved the pick at {moved} position(s)"),
                barmode="group", yaxis={"title": "probability of the drafted token", "range": [0, 1.12]},
                xaxis={"title": "verified position: drafted token"})
    return fig
