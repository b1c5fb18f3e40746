"""Span extraction views (the ``span_extract`` decoder): where in the passage the answer can
still come from, and how the model scores every span of it.

They read two evidence fields. ``span`` (every step): ``at`` (span tokens before the step),
``allowed`` (tokens the copy mask let through, end tokens included), ``continuations``,
``can_end``, ``live``/``live_after`` (occurrences of the output in the passage before and after
the step), ``starts`` (their start positions), ``best`` (exact mode: [start, length]) and, on the
first step, ``passage.ids``. ``span_scores`` (the exact mode's first step): ``logp``, a start x
length table of span log-probabilities (None where no span), ``best``, ``best_score``,
``best_logp``, ``length_penalty`` and ``free_greedy`` (the unconstrained greedy answer).
"""

from __future__ import annotations

import html
import math
from typing import Any

import plotly.graph_objects as go

from visualizers._common import (ACCEPTED, CHOSEN, FINAL, INK, REJECTED, base_layout, empty_figure, fmt, html_token,
                                 ints, label, num, pick_step, plot_text, steps_of, token_text, visible)
from visualizers.registry import run_plot, step_plot

SCORES_TITLE = "Span scores"
RUN_TITLE = "Span occurrences"
PASSAGE_TITLE = "Passage"
MAX_LABEL = 10  # characters of a passage token in an axis label


def passage_of(trace: dict[str, Any]) -> list[int]:
    """The passage's token ids, from the first step that carries them."""
    for s in steps_of(trace):
        ev = s.get("span")
        if isinstance(ev, dict) and isinstance(ev.get("passage"), dict):
            return ints(ev["passage"].get("ids"))
    return []


def scores_of(trace: dict[str, Any]) -> dict[str, Any] | None:
    """The exact mode's ``span_scores`` evidence, or None."""
    for s in steps_of(trace):
        if isinstance(s.get("span_scores"), dict):
            return s["span_scores"]
    return None


def _free_note(free: Any) -> str:
    """"free greedy: 'text' (logp x)" for a subtitle, or "" without one."""
    if not isinstance(free, dict):
        return ""
    lp = num(free.get("logprob"))
    text = str(free.get("text") or "")
    text = text if len(text) <= 24 else text[:23] + "…"
    span = "a span" if free.get("is_span") else "not a span"
    return f"free greedy {visible(text)!r} ({span}) logp {fmt(lp, 2)}"


@run_plot(SCORES_TITLE, evidence="span_scores", order=84)
def span_scores_figure(trace: dict[str, Any], step: int | None = None) -> go.Figure:
    """Start x end heat map of every span's log-probability over the passage; the best span by
    the run's ranking (log-prob / length^penalty) is ringed, and the subtitle sets it beside the
    free greedy answer."""
    ev = scores_of(trace)
    if ev is None:
        return empty_figure("no span scores (exact mode records them)", SCORES_TITLE)
    table = ev.get("logp") if isinstance(ev.get("logp"), list) else []
    ids = passage_of(trace)
    n = max(len(ids), len(table))
    if n == 0:
        return empty_figure("the passage is empty", SCORES_TITLE)
    z = [[math.nan] * n for _ in range(n)]
    hover = [[""] * n for _ in range(n)]
    for i, row in enumerate(table):
        if not isinstance(row, list):
            continue
        for m, v in enumerate(row, start=1):
            j = i + m - 1
            x = num(v)
            if x is None or j >= n:
                continue
            z[i][j] = x
            text = "".join(token_text(trace, t) for t in ids[i:j + 1])
            hover[i][j] = (f"tokens {i}–{j} ({m})<br><b>{plot_text(visible(text[:40]))}</b><br>logp {fmt(x, 3)}")
    labels = [f"{k}·{label(trace, t, MAX_LABEL)}" for k, t in enumerate(ids)] or [str(k) for k in range(n)]
    labels += [str(k) for k in range(len(labels), n)]
    fig = go.Figure()
    fig.add_heatmap(x=labels, y=labels, z=z, text=hover, hoverinfo="text", colorscale="Viridis",
                    colorbar={"title": {"text": "logp"}}, name="span log-prob")
    best = ints(ev.get("best"))
    notes = []
    if len(best) == 2 and 0 <= best[0] < n and 0 <= best[0] + best[1] - 1 < n:
        bi, bj = best[0], best[0] + best[1] - 1
        fig.add_scatter(x=[labels[bj]], y=[labels[bi]], mode="markers", name="best span",
                        marker={"symbol": "circle-open", "size": 16, "color": CHOSEN, "line": {"width": 3}},
                        hovertext=[f"best span {bi}–{bj}"], hoverinfo="text")
        text = "".join(token_text(trace, t) for t in ids[bi:bj + 1])
        notes.append(f"best {visible(text[:24])!r} logp {fmt(num(ev.get('best_logp')), 2)}")
    free = _free_note(ev.get("free_greedy"))
    if free:
        notes.append(free)
    lp = num(ev.get("length_penalty"))
    if lp:
        notes.append(f"ranked by logp/len^{fmt(lp, 2)}")
    base_layout(fig, SCORES_TITLE, subtitle=plot_text(" · ".join(notes)), xaxis_title="span end",
                yaxis={"title": "span start", "autorange": "reversed"})
    return fig


@run_plot(RUN_TITLE, evidence="span", order=85)
def span_run_figure(trace: dict[str, Any], step: int | None = None) -> go.Figure:
    """Per step: the size of the allowed token set (bars) and the passage occurrences still live
    before the step (line, log axis); the end token's share of the allowed set is marked."""
    rows = [(j, s["span"]) for j, s in enumerate(steps_of(trace)) if isinstance(s.get("span"), dict)]
    if not rows:
        return empty_figure("no span steps", RUN_TITLE)
    xs = [j for j, _ in rows]
    allowed = [int(num(ev.get("allowed")) or 0) for _, ev in rows]
    live = [int(num(ev.get("live")) or 0) or None for _, ev in rows]
    ended = [j for j, ev in rows if ev.get("ended")]
    fig = go.Figure()
    fig.add_bar(x=xs, y=allowed, name="allowed tokens", marker_color=ACCEPTED,
                hovertemplate="step %{x}<br>%{y} allowed<extra></extra>")
    fig.add_scatter(x=xs, y=live, name="live occurrences", mode="lines+markers", yaxis="y2",
                    line={"color": FINAL}, hovertemplate="step %{x}<br>%{y} live occurrences<extra></extra>")
    if ended:
        fig.add_scatter(x=ended, y=[allowed[xs.index(j)] for j in ended], mode="markers", name="span ended",
                        marker={"symbol": "x", "size": 11, "color": REJECTED}, hoverinfo="skip")
    if step is not None and 0 <= int(step) < len(steps_of(trace)):
        fig.add_vline(x=int(step), line={"color": INK, "dash": "dot"})
    mode = str(rows[0][1].get("mode") or "")
    notes = [f"{mode} mode" if mode else "", f"{len(rows)} steps"]
    stats = trace.get("stats") if isinstance(trace.get("stats"), dict) else {}
    free = _free_note(stats.get("free_greedy"))
    span = stats.get("span") if isinstance(stats.get("span"), dict) else None
    if span is not None:
        notes.append(f"span logp {fmt(num(span.get('logprob')), 2)}")
    if free:
        notes.append(free)
    base_layout(fig, RUN_TITLE, subtitle=plot_text(" · ".join(p for p in notes if p)), xaxis_title="step",
                yaxis={"title": "allowed tokens"},
                yaxis2={"title": "live occurrences", "overlaying": "y", "side": "right", "type": "log",
                        "showgrid": False})
    return fig


@step_plot("token", PASSAGE_TITLE, needs="span", html=True, order=65)
def span_passage_html(trace: dict[str, Any], step: int) -> str:
    """The passage at one step: the tokens the output already copies in each live occurrence
    (green), the candidates for this step (outlined), the token chosen here (orange) and, in
    the exact mode, the best span underlined."""
    i, s = pick_step(trace, step)
    ev = s.get("span") if isinstance(s, dict) else None
    if not isinstance(ev, dict):
        return '<div class="note">this step copies nothing from a passage</div>'
    ids = passage_of(trace)
    if not ids:
        return '<div class="note">the passage is not in this trace</div>'
    n = int(num(ev.get("at")) or 0)
    starts = [k for k in ints(ev.get("starts")) if 0 <= k < len(ids)]
    committed = ints(s.get("committed"))
    chosen = committed[0] if committed else None
    matched: set[int] = {k + d for k in starts for d in range(n) if k + d < len(ids)}
    nxt = {k + n for k in starts if k + n < len(ids)}
    picked = {p for p in nxt if ids[p] == chosen}
    best = ints(ev.get("best"))
    best_set = set(range(best[0], best[0] + best[1])) if len(best) == 2 else set()
    cells = []
    for p, t in enumerate(ids):
        style = []
        if p in picked:
            style.append("background: rgba(245,165,36,0.55)")
        elif p in matched:
            style.append("background: rgba(34,165,91,0.30)")
        if p in nxt and p not in picked:
            style.append("outline: 1px dashed rgba(99,102,241,0.8)")
        if p in best_set:
            style.append("text-decoration: underline 2px")
        attr = f' style="{"; ".join(style)}"' if style else ""
        cells.append(f'<span class="tok" title="position {p} · #{int(t)}"{attr}>{html_token(token_text(trace, t))}</span>')
    head = (f"step {int(i)}: {int(num(ev.get('live')) or 0)} live occurrence(s) of the {n} token(s) so far, "
            f"{int(num(ev.get('allowed')) or 0)} allowed token(s)"
            + (" incl. the end" if ev.get("can_end") else "") + (" · the span ended here" if ev.get("ended") else ""))
    return (f'<div class="span-passage" data-step="{int(i)}"><div class="note" style="color:{INK}">'
            f"{html.escape(head)}; green = copied so far, outlined = candidates, orange = chosen"
            f'{", underlined = best span" if best_set else ""}</div>'
            f'<div style="white-space:pre-wrap;line-height:1.7">{"".join(cells)}</div></div>')
