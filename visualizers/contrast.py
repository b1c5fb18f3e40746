"""The contrastive family: paired distributions, contrastive search's candidates, DoLa's layers.

``contrast_figure`` draws a step's ``contrast`` evidence (expert / amateur / contrast,
conditional / unconditional / guided, final / premature / contrast, with-context /
question-only / adjusted): one group of bars per shown token, one bar per distribution,
the chosen token starred and every token whose rank the contrast moved marked under its
label. ``candidates_html`` is contrastive search's candidate table of one step (p,
degeneration penalty, score, the context position each candidate is most like, the pick).
``dola_figure`` shows DoLa's per-layer divergence at one step with the chosen premature
layer highlighted, and ``dola_run_figure`` the chosen layer at every step over the
candidate layers' divergence. ``contrast_run_figure`` tracks, per step, the chosen token's
rank under the model's own distribution: where the contrast overrode the model.

Like every visualizer these accept partial traces and return a figure (or HTML) with a note
instead of raising; token text is always escaped.
"""

from __future__ import annotations

import html
import math
from typing import Any

import plotly.graph_objects as go

from visualizers._common import (
    CHOSEN, FINAL, INK, RAW, at, base_layout, empty_figure, fmt, int_dtick, ints, num, pick_step,
    plot_text, steps_of, token_text, visible, wrong_kind,
)
from visualizers.registry import run_plot, step_plot

# One colour per row of the pair, in the order the evidence lists them: the model's own
# distribution, what it is contrasted with, and the contrast the token is chosen from.
ROW_COLOURS = [FINAL, RAW, "#0ea5e9", "#d946ef"]
# Tokens shown in the grouped bars: with three bars each, more groups no longer fit a lane card.
SHOW = 12


def _contrast_of(trace: dict[str, Any], step: int, title: str) -> tuple[int, dict[str, Any] | None, Any]:
    """(index, contrast evidence, or a note figure instead) for step ``step``."""
    i, s = pick_step(trace, step)
    if s is None:
        return i, None, empty_figure("no steps yet", title)
    if s.get("kind") != "token":
        return i, None, wrong_kind(i, s, "token", title)
    ev = s.get("contrast")
    if not isinstance(ev, dict):
        return i, None, empty_figure(f"step {i} has no paired distributions", title)
    return i, ev, None


def _labels(ev: dict[str, Any]) -> list[str]:
    """The rows' labels that have probabilities (order kept)."""
    probs = ev.get("probs") if isinstance(ev.get("probs"), dict) else {}
    labels = ev.get("labels") if isinstance(ev.get("labels"), list) else list(probs)
    return [str(lb) for lb in labels if isinstance(probs.get(lb), list)]


def _rank(ev: dict[str, Any], lb: str, j: int) -> int | None:
    r = at((ev.get("ranks") or {}).get(lb) if isinstance(ev.get("ranks"), dict) else None, j)
    return r if isinstance(r, int) and not isinstance(r, bool) else None


def shown_tokens(ev: dict[str, Any], limit: int = SHOW) -> list[int]:
    """Indices into ``top_ids`` of the tokens the grouped bars show.

    Ordered by rank under the contrast (the last row), ties by rank under the model (the
    first row), so the contrast's own top comes first and the tokens it excluded follow in
    the model's order; at most ``limit``, the chosen token always among them.
    """
    ids = ints(ev.get("top_ids"))
    labels = _labels(ev)
    if not ids or not labels:
        return []
    big = 10**9

    def key(j: int) -> tuple[int, int, int]:
        last, first = _rank(ev, labels[-1], j), _rank(ev, labels[0], j)
        return (big if last is None else last, big if first is None else first, j)

    order = sorted(range(len(ids)), key=key)[:limit]
    chosen = ev.get("chosen")
    if chosen in ids and ids.index(chosen) not in order:
        order[-1] = ids.index(chosen)
    return order


def rank_move(ev: dict[str, Any], j: int) -> int | None:
    """How many places the contrast moved shown token ``j`` up (>0) or down (<0) against the
    model's own ranking; None when a rank is missing."""
    labels = _labels(ev)
    if not labels:
        return None
    a, b = _rank(ev, labels[0], j), _rank(ev, labels[-1], j)
    return None if a is None or b is None else a - b


def excluded(ev: dict[str, Any], j: int) -> bool:
    """Whether the contrast excluded shown token ``j``: its score is null, or (without
    scores) its probability under the contrast is 0."""
    scores = ev.get("scores")
    if isinstance(scores, list) and j < len(scores):
        return num(scores[j]) is None
    labels = _labels(ev)
    return bool(labels) and num(at(ev["probs"][labels[-1]], j)) == 0.0


@step_plot("token", "Paired distributions", needs="contrast", order=20)
def contrast_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """Grouped bars of the paired distributions over the shown tokens of a step.

    One bar per row of the evidence (heights are the trace's probabilities, a missing value
    drawn as 0), the chosen token starred, and under each token label ``▲n``/``▼n`` where
    the contrast moved its rank n places against the model's own distribution.
    """
    title = "Paired distributions"
    i, ev, note = _contrast_of(trace, step, title)
    if ev is None:
        return note
    labels = _labels(ev)
    ids = ints(ev.get("top_ids"))
    order = shown_tokens(ev)
    if not labels or not order:
        return empty_figure(f"step {i} has no shown tokens", title)
    probs = ev["probs"]
    scores = ev.get("scores") if isinstance(ev.get("scores"), list) else None
    changed = set(ints(ev.get("rank_changed")))
    texts = []
    for j in order:
        own = at(ev.get("top_tokens"), j)
        t = token_text(trace, ids[j])
        texts.append(own if t.startswith("#") and isinstance(own, str) else t)
    xs = list(range(len(order)))
    ticks, hover = [], []
    for x, j in enumerate(order):
        move = rank_move(ev, j)
        mark = ""
        if excluded(ev, j):
            # every excluded token ties at the contrast's bottom, so its "rank change" is no move
            mark = f'<br><span style="color:{INK}">✕</span>'
        elif ids[j] in changed and move:
            mark = f'<br><span style="color:{CHOSEN}">{"▲" if move > 0 else "▼"}{abs(move)}</span>'
        ticks.append(plot_text(_short(visible(texts[x]))) + mark)
        lines = [f"<b>{plot_text(visible(texts[x]))}</b> (#{ids[j]})"]
        for lb in labels:
            lines.append(f"{plot_text(lb)}: p = {fmt(at(probs[lb], j), 4)} · rank {_rank(ev, lb, j)}")
        if scores is not None:
            sc = num(at(scores, j))
            lines.append("contrast score " + (fmt(sc, 3) if sc is not None else "excluded"))
        hover.append("<br>".join(lines))
    fig = go.Figure()
    top = 0.0
    for r, lb in enumerate(labels):
        ys = [num(at(probs[lb], j)) or 0.0 for j in order]
        top = max([top] + ys)
        fig.add_bar(x=xs, y=ys, name=plot_text(lb), marker_color=ROW_COLOURS[r % len(ROW_COLOURS)],
                    hovertext=hover, hoverinfo="text")
    chosen = ev.get("chosen")
    if chosen in ids and ids.index(chosen) in order:
        c = order.index(ids.index(chosen))
        peak = max(num(at(probs[lb], order[c])) or 0.0 for lb in labels)
        fig.add_scatter(x=[c], y=[peak], mode="markers+text", name="chosen",
                        marker={"symbol": "star", "size": 16, "color": CHOSEN,
                                "line": {"width": 1, "color": "#7a4a00"}},
                        text=["chosen"], textposition="top center", textfont={"color": CHOSEN},
                        hovertext=[hover[c]], hoverinfo="text", cliponaxis=False)
    out = [j for j in order if excluded(ev, j)]
    moved = sum(1 for j in order if ids[j] in changed and j not in out)
    notes = [f"{' / '.join(labels)}",
             f"▲▼ {moved} of {len(order)} shown tokens changed rank ({labels[0]} → {labels[-1]})"]
    if out:
        notes.append(f"✕ {len(out)} excluded by the contrast")
    if isinstance(ev.get("plausible"), int):
        notes.append(f"{ev['plausible']} plausible tokens")
    if chosen in ids:
        r0 = _rank(ev, labels[0], ids.index(chosen))
        if r0 is not None:
            notes.append(f"chosen token's rank under {labels[0]}: {r0}")
    base_layout(fig, f"{title} · step {i}", subtitle=plot_text(" · ".join(notes)), barmode="group",
                yaxis_title="probability", yaxis_range=[0, min(1.18, top * 1.18) if top > 0 else 1.0])
    fig.update_xaxes(tickmode="array", tickvals=xs, ticktext=ticks)
    return fig


@run_plot("Chosen token's rank", evidence="contrast", order=10)
def contrast_run_figure(trace: dict[str, Any], step: int | None = None) -> go.Figure:
    """Per step, the chosen token's rank under each of the pair's distributions: a rank
    above 0 under the model's own row is a step where the contrast overrode the model."""
    title = "Chosen token's rank per step"
    rows: dict[str, list[int | None]] = {}
    xs: list[Any] = []
    for s in steps_of(trace):
        ev = s.get("contrast")
        if s.get("kind") != "token" or not isinstance(ev, dict):
            continue
        ids = ints(ev.get("top_ids"))
        chosen = ev.get("chosen")
        if chosen not in ids:
            continue
        labels = _labels(ev)
        xs.append(s.get("i", len(xs)))
        for lb in labels:
            rows.setdefault(lb, [None] * (len(xs) - 1))
        for lb in rows:
            rows[lb].append(_rank(ev, lb, ids.index(chosen)) if lb in labels else None)
    if not xs:
        return empty_figure("no paired distributions in this trace", title)
    fig = go.Figure()
    for r, (lb, ys) in enumerate(rows.items()):
        fig.add_scatter(x=xs, y=ys, name=f"rank under {plot_text(lb)}", mode="lines+markers",
                        line={"color": ROW_COLOURS[r % len(ROW_COLOURS)]}, marker={"size": 5})
    first = next(iter(rows))
    over = sum(1 for v in rows[first] if isinstance(v, int) and v > 0)
    base_layout(fig, f"{title} · rank 0 = top",
                subtitle=plot_text(f"{over} of {len(xs)} steps chose a token that was not {first}'s top"),
                xaxis_title="step", yaxis={"title": "rank (0 = top)", "rangemode": "tozero"})
    if len(xs) <= 40:
        fig.update_xaxes(dtick=int_dtick(max(xs) if all(isinstance(x, int) for x in xs) else len(xs), 10))
    if step is not None and isinstance(step, int):
        fig.add_vline(x=step, line={"color": CHOSEN, "width": 1, "dash": "dot"})
    return fig


# ---------------------------------------------------------------------- contrastive search
@step_plot("token", "Candidates", needs="candidates", html=True, order=40)
def candidates_html(trace: dict[str, Any], step: int) -> str:
    """Contrastive search's candidate table at a step, as escaped HTML: each candidate's
    token, probability, degeneration penalty (max cosine similarity to the context), score,
    the context token it is most similar to, and which one was picked."""
    i, s = pick_step(trace, step)
    if s is None:
        return _note("no steps yet")
    rows = s.get("candidates")
    if not isinstance(rows, list) or not any(isinstance(r, dict) for r in rows):
        return _note(f"step {i} has no candidate table")
    rows = [r for r in rows if isinstance(r, dict)]
    context = ints(trace.get("prompt_ids")) + ints(trace.get("output_ids"))
    by_p = max(rows, key=lambda r: num(r.get("p")) if num(r.get("p")) is not None else -math.inf)
    picked = next((r for r in rows if r.get("picked") is True), None)
    cells = []
    for r in rows:
        tok = r.get("token")
        pos = r.get("closest")
        near = ""
        if isinstance(pos, int) and not isinstance(pos, bool):
            near = f"{pos}"
            if 0 <= pos < len(context):
                near += f" ({html.escape(visible(token_text(trace, context[pos])))})"
        is_pick = r.get("picked") is True
        style = f"background:rgba(245,165,36,0.22);font-weight:600" if is_pick else ""
        cells.append(
            f'<tr class="cand{" picked" if is_pick else ""}" style="{style}">'
            f'<td style="font-family:ui-monospace,monospace">{html.escape(visible(token_text(trace, tok)))}</td>'
            f'<td>{fmt(r.get("p"), 4)}</td><td>{fmt(r.get("penalty"), 4)}</td><td>{fmt(r.get("score"), 4)}</td>'
            f'<td>{near}</td><td>{"✓" if is_pick else ""}</td></tr>')
    alpha = num(s.get("penalty_alpha"))
    head = [f"step {i}"]
    if alpha is not None:
        head.append(f"penalty_alpha {alpha:g}: score = (1 − α)·p − α·penalty")
    if picked is not None and by_p is not picked:
        head.append(f"the penalty changed the pick: greedy would take ‘{visible(token_text(trace, by_p.get('token')))}’")
    elif picked is not None:
        head.append("picked the most probable candidate")
    th = "".join(f'<th style="text-align:left;padding:2px 6px">{h}</th>' for h in
                 ("token", "p", "penalty", "score", "most similar context position", "picked"))
    return (f'<div class="cand-view"><div class="cand-head" style="font-size:0.85em;color:{INK};margin-bottom:4px">'
            f'{html.escape(" · ".join(head))}</div>'
            f'<table class="cand-table" style="border-collapse:collapse;font-size:0.85em">'
            f'<thead><tr>{th}</tr></thead><tbody>{"".join(cells)}</tbody></table></div>')


def _note(text: str) -> str:
    return f'<div class="cand-view note" style="color:{INK}">{html.escape(text)}</div>'


# ---------------------------------------------------------------------- DoLa
def _dola_of(s: dict[str, Any]) -> tuple[list[int], list[float | None], int | None]:
    ev = s.get("dola") if isinstance(s.get("dola"), dict) else {}
    layers = ints(ev.get("layers"))
    div = [num(at(ev.get("divergence"), j)) for j in range(len(layers))]
    prem = ev.get("premature")
    return layers, div, prem if isinstance(prem, int) and not isinstance(prem, bool) else None


@step_plot("token", "Layer divergence", needs="dola", order=30)
def dola_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """DoLa at one step: each candidate premature layer's divergence from the final layer,
    the chosen (most divergent) layer highlighted."""
    title = "Layer divergence (DoLa)"
    i, s = pick_step(trace, step)
    if s is None:
        return empty_figure("no steps yet", title)
    if not isinstance(s.get("dola"), dict):
        return empty_figure(f"step {i} has no DoLa evidence", title)
    layers, div, prem = _dola_of(s)
    if not layers:
        return empty_figure(f"step {i} has no candidate layers", title)
    colours = [CHOSEN if lay == prem else RAW for lay in layers]
    fig = go.Figure()
    fig.add_bar(x=layers, y=[d if d is not None else 0.0 for d in div], name="divergence from the final layer",
                marker_color=colours, hoverinfo="text",
                hovertext=[f"layer {lay}{' · chosen premature layer' if lay == prem else ''}<br>"
                           f"divergence {fmt(d, 6)}" for lay, d in zip(layers, div)])
    if prem in layers:
        d = div[layers.index(prem)]
        fig.add_scatter(x=[prem], y=[d if d is not None else 0.0], mode="markers+text", name="chosen premature layer",
                        marker={"symbol": "star", "size": 16, "color": CHOSEN, "line": {"width": 1, "color": "#7a4a00"}},
                        text=[f"layer {prem}"], textposition="top center", textfont={"color": CHOSEN},
                        hoverinfo="skip", cliponaxis=False)
    n = (s.get("dola") or {}).get("num_layers")
    sub = [f"premature layer {prem}" if prem is not None else "no layer chosen",
           f"{len(layers)} candidate layer{'s' if len(layers) != 1 else ''}"
           + (f" of {n}" if isinstance(n, int) else ""), "layer 0 = embeddings"]
    top = max((d for d in div if d is not None), default=0.0)
    base_layout(fig, f"{title} · step {i}", subtitle=plot_text(" · ".join(sub)), xaxis_title="layer",
                yaxis={"title": "divergence", "range": [0, top * 1.25 if top > 0 else 1.0]})
    fig.update_xaxes(tickmode="array", tickvals=layers, ticktext=[str(lay) for lay in layers])
    return fig


@run_plot("Premature layer per step", evidence="dola", order=20)
def dola_run_figure(trace: dict[str, Any], step: int | None = None) -> go.Figure:
    """The premature layer DoLa chose at every step, over a layer × step heatmap of each
    candidate layer's divergence."""
    title = "Premature layer per step (DoLa)"
    xs, chosen, cols = [], [], []
    all_layers: set[int] = set()
    for s in steps_of(trace):
        if s.get("kind") != "token" or not isinstance(s.get("dola"), dict):
            continue
        layers, div, prem = _dola_of(s)
        xs.append(s.get("i", len(xs)))
        chosen.append(prem)
        cols.append(dict(zip(layers, div)))
        all_layers.update(layers)
    if not xs:
        return empty_figure("no DoLa evidence in this trace", title)
    ys = sorted(all_layers)
    z = [[c.get(lay) for c in cols] for lay in ys]
    fig = go.Figure()
    if ys:
        fig.add_heatmap(x=xs, y=ys, z=[[v if v is not None else math.nan for v in row] for row in z],
                        name="divergence", colorscale="Blues", showscale=True,
                        colorbar={"title": {"text": "divergence", "side": "right"}, "thickness": 12, "len": 0.85},
                        hovertemplate="step %{x} · layer %{y}<br>divergence %{z:.6f}<extra></extra>")
    fig.add_scatter(x=xs, y=chosen, mode="lines+markers", name="chosen premature layer",
                    line={"color": CHOSEN, "width": 1.5}, marker={"size": 8, "color": CHOSEN, "symbol": "star"},
                    hovertext=[f"step {x}: premature layer {c}" for x, c in zip(xs, chosen)], hoverinfo="text")
    counts: dict[int, int] = {}
    for c in chosen:
        if c is not None:
            counts[c] = counts.get(c, 0) + 1
    most = max(counts, key=lambda k: (counts[k], -k)) if counts else None
    sub = (f"layer {most} chosen at {counts[most]} of {len(xs)} steps" if most is not None else "")
    base_layout(fig, title, subtitle=plot_text(sub), xaxis_title="step",
                yaxis={"title": "layer", "tickmode": "array", "tickvals": ys, "ticktext": [str(y) for y in ys]})
    if step is not None and isinstance(step, int):
        fig.add_vline(x=step, line={"color": CHOSEN, "width": 1, "dash": "dot"})
    return fig


def _short(s: str, n: int = 10) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


__all__ = ["contrast_figure", "contrast_run_figure", "candidates_html", "dola_figure", "dola_run_figure",
           "shown_tokens", "rank_move", "excluded"]
