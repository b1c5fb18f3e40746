"""NEST's views: a step's retrieved neighbours (distance, next token, passage and offset) with the
span verified in that step and its accepted prefix, and over the run the kNN weight lambda at
every committed token with the accepted span length of every step.

They read the ``nest`` evidence of ``nest``'s draft steps (``neighbours``: ``token``, ``d``,
``passage``, ``offset``; ``choice``; ``lam``; ``span``: ``ids``, ``passage``, ``offset``,
``accepted``, ``p``, ``max``; ``lams``; ``attribution``).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from visualizers._common import (ACCEPTED, CHOSEN, FINAL, RAW, REJECTED, UNREACHED, base_layout, empty_figure, fmt,
                                 label, num, pick_step, plot_text, steps_of, wrong_kind)
from visualizers.registry import run_plot, step_plot

STEP_TITLE = "Retrieved neighbours and span"
RUN_TITLE = "NEST mixture weight and spans"


def nest_steps(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The draft steps of a trace that carry ``nest`` evidence, in order."""
    return [s for s in steps_of(trace) if s.get("kind") == "draft" and isinstance(s.get("nest"), dict)]


@step_plot("draft", STEP_TITLE, needs="nest", order=58)
def nest_step_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """Top: the neighbours retrieved where the step's last token was drawn (distance per rank,
    the chosen token's neighbours highlighted); bottom: the span the step verified, each token's
    mixture probability against the acceptance threshold, accepted ones green."""
    i, s = pick_step(trace, step)
    if s is None:
        return empty_figure("no steps yet", STEP_TITLE)
    if s.get("kind") != "draft":
        return wrong_kind(i, s, "draft", STEP_TITLE)
    ev = s.get("nest") if isinstance(s.get("nest"), dict) else {}
    nbrs = [n for n in ev.get("neighbours") or [] if isinstance(n, dict)]
    choice = (ev.get("choice") or {}).get("token") if isinstance(ev.get("choice"), dict) else None
    span = ev.get("span") if isinstance(ev.get("span"), dict) else None
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.22, row_heights=[0.55, 0.45])
    if nbrs:
        xs = [f"{r + 1}: {label(trace, n.get('token'), 10)}" for r, n in enumerate(nbrs)]
        fig.add_bar(x=xs, y=[num(n.get("d")) for n in nbrs], name="neighbour distance", row=1, col=1,
                    marker_color=[CHOSEN if n.get("token") == choice else RAW for n in nbrs],
                    hovertext=[plot_text(f"next token {label(trace, n.get('token'))} · passage {n.get('passage')} "
                                         f"offset {n.get('offset')} · d {fmt(n.get('d'), 4)}") for n in nbrs],
                    hoverinfo="text")
    accepted = int(num(span.get("accepted")) or 0) if span else 0
    if span and span.get("ids"):
        ids = span.get("ids") or []
        ps, tops = span.get("p") or [], span.get("max") or []
        xs = [f"{j + 1}: {label(trace, t, 10)}" for j, t in enumerate(ids)]
        colours = [ACCEPTED if j < accepted else REJECTED if j == accepted else UNREACHED for j in range(len(ids))]
        fig.add_bar(x=xs, y=[num(p) for p in ps], name="p_mix of the span token", row=2, col=1, marker_color=colours,
                    hovertext=[plot_text(f"{'accepted' if j < accepted else 'rejected' if j == accepted else 'not reached'}"
                                         f" · p_mix {fmt(ps[j] if j < len(ps) else None, 4)}") for j in range(len(ids))],
                    hoverinfo="text")
        relax = num(ev.get("relax")) or 0.0
        fig.add_scatter(x=xs, y=[(num(t) or 0.0) * relax for t in tops], mode="markers", name="threshold relax · max p_mix",
                        row=2, col=1, marker={"symbol": "line-ew-open", "size": 18, "color": FINAL})
    where = f"{span.get('passage')} @ {span.get('offset')}" if span else "none"
    sub = (f"lambda {fmt(ev.get('lam'), 3)} · chosen {plot_text(label(trace, choice))} · span from {plot_text(where)}"
           f" · accepted {accepted} of {len(span.get('ids') or []) if span else 0}")
    base_layout(fig, f"{STEP_TITLE} · step {i}", subtitle=sub, height=540)
    fig.update_yaxes(title_text="distance", row=1, col=1)
    fig.update_yaxes(title_text="p_mix", range=[0, 1.05], row=2, col=1)
    fig.update_xaxes(title_text="neighbour rank: its next token", row=1, col=1)
    fig.update_xaxes(title_text="span position: token (green accepted)", row=2, col=1)
    return fig


@run_plot(RUN_TITLE, evidence="nest", order=86)
def nest_run_figure(trace: dict[str, Any]) -> go.Figure:
    """Top: lambda (the kNN weight) at every committed token, marked where the token is attributed
    to a passage; bottom: the accepted span length of every step."""
    steps = nest_steps(trace)
    if not steps:
        return empty_figure("no NEST steps yet", RUN_TITLE)
    lams: list[float | None] = []
    attributed: list[bool] = []
    for s in steps:
        ev = s["nest"]
        att = ev.get("attribution") if isinstance(ev.get("attribution"), list) else []
        for j, lam in enumerate(ev.get("lams") or []):
            lams.append(num(lam))
            attributed.append(bool(att[j]) if j < len(att) else False)
    lengths = [int(num((s["nest"].get("span") or {}).get("accepted")) or 0) if isinstance(s["nest"].get("span"), dict)
               else 0 for s in steps]
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.2, row_heights=[0.55, 0.45])
    xs = list(range(1, len(lams) + 1))
    fig.add_scatter(x=xs, y=lams, mode="lines+markers", name="lambda (kNN weight)", row=1, col=1,
                    line={"color": FINAL}, marker={"color": [ACCEPTED if a else RAW for a in attributed], "size": 7})
    fig.add_bar(x=list(range(len(steps))), y=lengths, name="accepted span tokens", row=2, col=1, marker_color=ACCEPTED)
    share = sum(attributed) / len(attributed) if attributed else 0.0
    per = len(lams) / len(steps) if steps else 0.0
    base_layout(fig, f"{RUN_TITLE} · {len(lams)} tokens", height=520,
                subtitle=f"attributed {100 * share:.0f}% (green markers) · {per:.2f} tokens per step")
    fig.update_yaxes(title_text="lambda", range=[0, 1.05], row=1, col=1)
    fig.update_yaxes(title_text="accepted", row=2, col=1)
    fig.update_xaxes(title_text="committed token", row=1, col=1)
    fig.update_xaxes(title_text="step", row=2, col=1)
    return fig
