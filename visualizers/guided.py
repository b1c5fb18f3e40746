"""Constrained steps: what the constraint allowed and what it took away.

Every step decoded under a constraint (``regex``/``json_schema``/``grammar``, ``bad_words``,
``token_healing``, ``logit_bias``; see ``decoders/constraint.py``) carries a
``constraint`` evidence dict: ``allowed`` tokens of ``vocab``, ``removed_mass`` (the model's
probability the mask took away) and the top allowed and blocked tokens with their probability
under the unconstrained (biased) distribution. ``constraint_figure`` draws one step: the
blocked tokens the model wanted beside the allowed ones it was left with.
``constraint_run_figure`` draws the whole run: removed mass per step and the allowed count.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from visualizers._common import (ACCEPTED, INK, REJECTED, at, base_layout, empty_figure, fmt, ints, num,
                                 pick_step, plot_text, steps_of, token_text, visible)
from visualizers.registry import run_plot, step_plot

TITLE = "Constraint"


def _texts(trace: dict[str, Any], group: dict[str, Any]) -> list[str]:
    ids = ints(group.get("ids"))
    out = []
    for j, t in enumerate(ids):
        own = at(group.get("tokens"), j)
        mapped = token_text(trace, t)
        out.append(own if mapped.startswith("#") and isinstance(own, str) else mapped)
    return out


def _short(s: str, n: int = 10) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


# the sampler chain's first stages are the constraint's bias and mask, with its blocked and kept tokens:
# short of slots, it takes this one's
@step_plot("token", "Constraint", needs="constraint", order=70, yields_to="Sampler chain")
@step_plot("draft", "Constraint", needs="constraint", order=40)
@step_plot("beam", "Constraint", needs="constraint", order=30)
def constraint_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """One step: the top blocked tokens (red) and the top allowed ones (green), by their
    probability under the model before the mask; the title gives the allowed count and the
    mass the constraint removed."""
    i, s = pick_step(trace, step)
    if s is None:
        return empty_figure("no steps yet", TITLE)
    ev = s.get("constraint")
    if not isinstance(ev, dict):
        return empty_figure(f"step {i} was not constrained", TITLE)
    fig = go.Figure()
    ticks: list[str] = []
    x = 0
    for key, name, colour in (("top_blocked", "blocked (removed)", REJECTED), ("top_allowed", "allowed", ACCEPTED)):
        group = ev.get(key) if isinstance(ev.get(key), dict) else {}
        ids = ints(group.get("ids"))
        probs = [num(at(group.get("probs"), j)) or 0.0 for j in range(len(ids))]
        texts = _texts(trace, group)
        xs = list(range(x, x + len(ids)))
        x += len(ids)
        ticks += [plot_text(_short(visible(t))) for t in texts]
        hover = [f"<b>{plot_text(visible(t))}</b> (#{tid})<br>{name}<br>p before the mask = {fmt(p, 4)}"
                 for tid, t, p in zip(ids, texts, probs)]
        if ids:
            fig.add_bar(x=xs, y=probs, name=name, marker_color=colour, hovertext=hover, hoverinfo="text")
    if x == 0:
        return empty_figure(f"step {i} records no tokens", TITLE)
    allowed, vocab = ev.get("allowed"), ev.get("vocab")
    removed = num(ev.get("removed_mass"))
    notes = []
    if isinstance(allowed, int):
        notes.append(f"{allowed} of {vocab} tokens allowed" if isinstance(vocab, int) else f"{allowed} allowed")
    if removed is not None:
        notes.append(f"removed {100 * removed:.1f}% of the mass")
    if ev.get("kind"):
        notes.append(str(ev["kind"]) + (" (complete so far)" if ev.get("accepting") else ""))
    base_layout(fig, f"{TITLE} · step {i}", subtitle=plot_text(" · ".join(notes)),
                yaxis_title="probability before the mask", barmode="group")
    fig.update_xaxes(tickmode="array", tickvals=list(range(x)), ticktext=ticks, tickangle=-45 if x > 8 else 0)
    return fig


@run_plot("Constraint over the run", evidence="constraint", order=90)
def constraint_run_figure(trace: dict[str, Any], step: int | None = None) -> go.Figure:
    """The run: mass removed by the constraint per step (bars) and the number of allowed
    tokens (line, log axis on the right)."""
    rows = [(j, s["constraint"]) for j, s in enumerate(steps_of(trace)) if isinstance(s.get("constraint"), dict)]
    if not rows:
        return empty_figure("no constrained steps", "Constraint over the run")
    xs = [j for j, _ in rows]
    removed = [num(ev.get("removed_mass")) or 0.0 for _, ev in rows]
    allowed = [ev.get("allowed") if isinstance(ev.get("allowed"), int) else None for _, ev in rows]
    fig = go.Figure()
    fig.add_bar(x=xs, y=removed, name="mass removed", marker_color=REJECTED,
                hovertemplate="step %{x}<br>removed %{y:.4f}<extra></extra>")
    fig.add_scatter(x=xs, y=allowed, name="allowed tokens", mode="lines+markers", yaxis="y2",
                    line={"color": ACCEPTED}, hovertemplate="step %{x}<br>%{y} allowed<extra></extra>")
    if step is not None and 0 <= int(step) < len(steps_of(trace)):
        fig.add_vline(x=int(step), line={"color": INK, "dash": "dot"})
    mean = sum(removed) / len(removed)
    base_layout(fig, "Constraint over the run",
                subtitle=plot_text(f"{len(rows)} constrained steps · mean removed mass {mean:.3f}"),
                xaxis_title="step", yaxis={"title": "probability removed", "range": [0, 1.02]},
                yaxis2={"title": "allowed tokens", "overlaying": "y", "side": "right", "type": "log",
                        "showgrid": False})
    return fig
