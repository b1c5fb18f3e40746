"""Ouroboros's views: a step's draft token by token, coloured by where each token came from
(the draft model or a pool phrase) with the target's verdict, and the run's pool: accepted
tokens by source per step, the pool's hit rate and its size.

They read the ``ouroboros`` evidence of ``ouroboros``'s draft steps (``model_tokens``,
``pool_tokens``, ``lookups``: ``key``, ``hit``, ``phrase``, ``used``, ``from``; ``accepted``
by source, ``pool_size``, ``pool_size_after``, ``added``, ``added_count``, ``evicted``) and the
step's draft ``tree`` (each node's ``source``, ``p`` and ``accepted``).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from visualizers._common import (ACCEPTED, CORRECTION, FINAL, INK, REJECTED, UNREACHED, base_layout, empty_figure,
                                 label, num, pick_step, plot_text, steps_of, wrong_kind)
from visualizers.registry import run_plot, step_plot

STEP_TITLE = "Phrase-extended draft"
RUN_TITLE = "Phrase pool over the run"
SOURCE_COLOURS = {"draft-model": FINAL, "pool": "#0ea5e9"}
SOURCE_NAMES = {"draft-model": "draft model", "pool": "pool phrase"}


def _count(d: Any, key: str) -> int:
    """A non-negative count from an evidence dict (0 when missing)."""
    v = num(d.get(key)) if isinstance(d, dict) else None
    return int(v) if v is not None and v > 0 else 0


@step_plot("draft", STEP_TITLE, needs="ouroboros", order=15)
def draft_sources_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """Per draft position: the target's probability of the drafted token, coloured by its
    source, with the verdict above it (accepted, rejected, never reached)."""
    i, s = pick_step(trace, step)
    if s is None:
        return empty_figure("no steps yet", STEP_TITLE)
    if s.get("kind") != "draft":
        return wrong_kind(i, s, "draft", STEP_TITLE)
    tree = s.get("tree") if isinstance(s.get("tree"), dict) else {}
    nodes = [n for n in tree.get("nodes") or [] if isinstance(n, dict)]
    ev = s.get("ouroboros") if isinstance(s.get("ouroboros"), dict) else {}
    if not nodes:
        return empty_figure(f"step {i} drafted nothing", f"{STEP_TITLE} · step {i}")
    xs = [f"{j + 1}: {label(trace, n.get('token'), 10)}" for j, n in enumerate(nodes)]
    fig = go.Figure()
    for src, colour in SOURCE_COLOURS.items():
        ys = [num(n.get("p")) if n.get("source") == src else None for n in nodes]
        if any(y is not None for y in ys):
            fig.add_bar(x=xs, y=ys, name=SOURCE_NAMES[src], marker_color=colour,
                        hovertemplate="%{x}<br>" + SOURCE_NAMES[src] + "<br>target p = %{y:.4f}<extra></extra>")
    verdicts = []
    for n in nodes:
        verdicts.append("accepted" if n.get("accepted") else "rejected" if n.get("accept_prob") is not None
                        else "never reached")
    colours = {"accepted": ACCEPTED, "rejected": REJECTED, "never reached": UNREACHED}
    symbols = {"accepted": "circle", "rejected": "x", "never reached": "circle-open"}
    fig.add_scatter(x=xs, y=[1.06] * len(nodes), mode="markers", name="verdict", cliponaxis=False,
                    marker={"size": 12, "symbol": [symbols[v] for v in verdicts],
                            "color": [colours[v] for v in verdicts]},
                    hovertext=[plot_text(f"{v} ({SOURCE_NAMES.get(n.get('source'), n.get('source'))})")
                               for v, n in zip(verdicts, nodes)], hoverinfo="text")
    corr = tree.get("correction")
    if corr is not None:
        fig.add_annotation(x=1.0, y=1.13, xref="paper", yref="y", xanchor="right", showarrow=False,
                           font={"color": CORRECTION},
                           text=plot_text(f"{tree.get('correction_kind') or 'correction'}: ")
                           + label(trace, corr, 12))
    lookups = [x for x in ev.get("lookups") or [] if isinstance(x, dict)]
    hits = sum(1 for x in lookups if x.get("hit"))
    acc = ev.get("accepted") if isinstance(ev.get("accepted"), dict) else {}
    n_acc = sum(1 for v in verdicts if v == "accepted")
    sub = [f"pool lookups {len(lookups)}, hits {hits}" if lookups else "no pool lookup",
           f"pool {_count(ev, 'pool_size')} → {_count(ev, 'pool_size_after')} keys",
           f"{_count(ev, 'added_count')} phrase(s) added"]
    base_layout(fig, f"{STEP_TITLE} · step {i} · accepted {n_acc} of {len(nodes)} "
                     f"({_count(acc, 'pool')} from the pool)",
                subtitle=plot_text(" · ".join(sub)), barmode="overlay",
                yaxis={"title": "target p of the drafted token", "range": [0, 1.16]},
                xaxis={"title": "draft position: token"})
    return fig


def pool_steps(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``ouroboros`` evidence of every step, in order."""
    return [s["ouroboros"] for s in steps_of(trace) if isinstance(s.get("ouroboros"), dict)]


def cumulative_hit_rate(rounds: list[dict[str, Any]]) -> list[float | None]:
    """After each step: pool hits / pool lookups so far (None before the first lookup)."""
    out: list[float | None] = []
    hits = tries = 0
    for r in rounds:
        lookups = [x for x in r.get("lookups") or [] if isinstance(x, dict)]
        tries += len(lookups)
        hits += sum(1 for x in lookups if x.get("hit"))
        out.append(hits / tries if tries else None)
    return out


@run_plot(RUN_TITLE, evidence="ouroboros", order=105)
def pool_run_figure(trace: dict[str, Any]) -> go.Figure:
    """Top: accepted tokens per step by source, against the tokens drafted (a mark);
    middle: the cumulative pool hit rate; bottom: the pool's size after each step."""
    rounds = pool_steps(trace)
    if not rounds:
        return empty_figure("no Ouroboros steps yet", RUN_TITLE)
    xs = list(range(1, len(rounds) + 1))
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06, row_heights=[0.45, 0.3, 0.25])
    for src, colour in SOURCE_COLOURS.items():
        fig.add_bar(x=xs, y=[_count(r.get("accepted"), src) for r in rounds], name=f"accepted: {SOURCE_NAMES[src]}",
                    marker_color=colour, row=1, col=1,
                    hovertemplate="step %{x}: %{y} accepted from the " + SOURCE_NAMES[src] + "<extra></extra>")
    # the bar's top against this mark: how much of the whole draft the target accepted
    fig.add_scatter(x=xs, y=[_count(r, "model_tokens") + _count(r, "pool_tokens") for r in rounds], mode="markers",
                    name="drafted (model + pool)", row=1, col=1,
                    marker={"symbol": "line-ew-open", "size": 16, "color": INK, "line": {"width": 3, "color": INK}},
                    customdata=[[_count(r, "model_tokens"), _count(r, "pool_tokens")] for r in rounds],
                    hovertemplate="step %{x}: drafted %{customdata[0]} by the model + %{customdata[1]} from the pool"
                                  "<extra></extra>")
    rate = cumulative_hit_rate(rounds)
    fig.add_scatter(x=xs, y=rate, mode="lines+markers", name="pool hit rate so far", row=2, col=1,
                    line={"color": ACCEPTED}, hovertemplate="after step %{x}: %{y:.2f}<extra></extra>")
    fig.add_scatter(x=xs, y=[_count(r, "pool_size_after") for r in rounds], mode="lines", name="pool size (keys)",
                    row=3, col=1, line={"color": INK}, hovertemplate="after step %{x}: %{y} keys<extra></extra>")
    drafted = sum(_count(r, "pool_tokens") for r in rounds)
    from_pool = sum(_count(r.get("accepted"), "pool") for r in rounds)
    from_model = sum(_count(r.get("accepted"), "draft-model") for r in rounds)
    last = next((x for x in reversed(rate) if x is not None), None)
    sub = [f"hit rate {last:.2f}" if last is not None else "no lookups",
           f"pool tokens accepted {from_pool} of {drafted}",
           f"accepted per step: model {from_model / len(rounds):.2f}, pool {from_pool / len(rounds):.2f}"]
    base_layout(fig, f"{RUN_TITLE} · {len(rounds)} steps", subtitle=plot_text(" · ".join(sub)), height=560,
                barmode="stack")
    fig.update_yaxes(title_text="tokens", row=1, col=1)
    fig.update_yaxes(title_text="hit rate", range=[0, 1.05], row=2, col=1)
    fig.update_yaxes(title_text="keys", row=3, col=1)
    fig.update_xaxes(title_text="step (verification)", row=3, col=1)
    return fig
